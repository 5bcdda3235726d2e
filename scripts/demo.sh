#!/usr/bin/env bash
# Install autoalloc into a fresh venv (with torch 2.13 CPU) and show it acting on the
# built-in policy: a script laid out like a NeMo ASR trainer gets expandable_segments
# before torch starts, so does a hand-written CTC trainer whose source shows it, an ordinary
# script does not, and `autoalloc explain` says why.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${AUTOALLOC_DEMO_VENV:-.venv}
source scripts/pip_install.sh
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV ..."
    "$PYTHON" -m venv "$VENV"
fi
has_torch="import torch; assert torch.__version__.startswith('2.13.0')"
if ! "$VENV/bin/python" -c "$has_torch" 2>/dev/null; then
    echo "installing torch 2.13 (CPU) into $VENV (a line per package) ..."
    pip_install "$VENV/bin/python" torch==2.13.0 numpy
fi
echo "installing autoalloc (this checkout) into $VENV ..."
pip_install "$VENV/bin/python" .
echo

demo=$(mktemp -d)
trap 'rm -rf "$demo"' EXIT
mkdir -p "$demo/NeMo/examples/asr/asr_ctc"
probe='import torch; print("  torch read:", repr(torch._C._accelerator_getAllocatorSettings()))'
echo "$probe" > "$demo/NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py"
echo "$probe" > "$demo/my_script.py"
# a hand-written CTC trainer (soundfile, its own character vocabulary, nn.CTCLoss, AdamW): no
# rule names it, its own source shows speech-to-text training (started without an argument,
# it only shows what torch read)
cat > "$demo/train_ctc.py" <<TRAINER
$probe
import sys
if len(sys.argv) > 1:
    import soundfile
    VOCAB = list(" abcdefghijklmnopqrstuvwxyz'")
    model = torch.nn.GRU(80, len(VOCAB))
    ctc = torch.nn.CTCLoss(blank=0)
    optimizer = torch.optim.AdamW(model.parameters())
TRAINER
cd "$demo"
echo "\$ python NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py    # matches the built-in rule nemo-asr-train"
"$OLDPWD/$VENV/bin/python" NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py
echo "\$ python my_script.py                                         # matches nothing: untouched"
"$OLDPWD/$VENV/bin/python" my_script.py
echo "\$ python train_ctc.py                                        # its source shows CTC training on audio"
"$OLDPWD/$VENV/bin/python" train_ctc.py
echo "\$ autoalloc explain -- python train_ctc.py | head -1"
"$OLDPWD/$VENV/bin/autoalloc" explain -- python train_ctc.py | head -1
echo "\$ PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8 python NeMo/.../speech_to_text_ctc_bpe.py   # merged, yours kept"
PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8 "$OLDPWD/$VENV/bin/python" NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py
echo "\$ autoalloc explain -- python NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py"
"$OLDPWD/$VENV/bin/autoalloc" explain -- python NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py
