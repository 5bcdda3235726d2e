"""Setup step of the external SpeechBrain ASR template case: stand in for the template's
pretrained downloads, offline.

The ASR template's train.py always runs its Pretrainer, which by default fetches
speechbrain/asr-crdnn-rnnlm-librispeech (tokenizer, LM, ASR model). This script loads the same
train.yaml with the same command-line overrides the case passes and writes, into
<pretrained_path>/, the freshly initialised (random) lm_model and model state dicts plus the
tiny SentencePiece model make_tiny_data.py trained (tokenizer.model -> tokenizer.ckpt), so the
template's own Pretrainer code path runs unchanged against local files.

Usage: python make_pretrained.py train.yaml --pretrained_path=pretrained [other overrides]
"""

import os
import shutil
import sys

import speechbrain as sb
import torch
from hyperpyyaml import load_hyperpyyaml

hparams_file, _run_opts, overrides = sb.parse_arguments(sys.argv[1:])
with open(hparams_file, encoding="utf-8") as fin:
    hparams = load_hyperpyyaml(fin, overrides)
dest = hparams["pretrained_path"]
os.makedirs(dest, exist_ok=True)
torch.save(hparams["lm_model"].state_dict(), os.path.join(dest, "lm.ckpt"))
torch.save(hparams["model"].state_dict(), os.path.join(dest, "asr.ckpt"))
shutil.copy("tokenizer.model", os.path.join(dest, "tokenizer.ckpt"))
print("wrote", sorted(os.listdir(dest)))
