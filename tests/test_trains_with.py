"""Speech-to-text recognised by what a program trains with, and decided before torch starts
where its own source shows it.

Hand-written trainers name no tokenizer library: their own character vocabulary, torch's CTC
loss, a WER metric. Each program below runs for real (torch 2.13 CPU, soundfile and
torchmetrics from the test venv; ``site-packages/`` stand-ins for torchaudio and SpeechBrain,
which the venv lacks: the decision is made from the program's source before either is
imported, and the real libraries run in tests/test_real_libraries.py). Each is checked three
ways: what ``explain`` predicts (and when), what the environment held right after ``import
torch`` (before torch starts, the weights and every child get it), and what torch read.
The hard negatives use the same libraries and shapes for other work: CTC on images and on
text alone, a keyword classifier trained with cross-entropy, a project's evaluation script
that imports its training module.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import ES, Sandbox

# Right after `import torch`: what the environment holds then (the program's own first lines).
AT_IMPORT = """
import os, sys
import torch
AT_IMPORT = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
"""
REPORT = 'print("AT_IMPORT", json.dumps(AT_IMPORT))\n'
LOOP = """
def train(model, features, criterion, steps=2):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = criterion(model(features))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

CTC_SOUNDFILE = AT_IMPORT + '''
import json
import numpy as np
import soundfile as sf
from torch import nn

VOCAB = list(" abcdefghijklmnopqrstuvwxyz'")  # index 0 is the CTC blank
sf.write("clip.wav", np.zeros(1600, dtype="float32"), 16000)
audio, rate = sf.read("clip.wav", dtype="float32")
features = torch.tensor(audio).view(1, 100, 16)
targets = torch.tensor([[VOCAB.index(c) for c in "hi there"]])
ctc = nn.CTCLoss(blank=0)
model = nn.GRU(16, len(VOCAB), batch_first=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    logits = model(features)[0].log_softmax(-1).transpose(0, 1)
    loss = ctc(logits, targets, torch.tensor([100]), torch.tensor([8]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
''' + REPORT

WER_TORCHAUDIO = AT_IMPORT + '''
import json
import torchaudio
import torch.nn.functional as F
from torchmetrics.text import WordErrorRate

CHARS = {c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz '")}
mel = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_mels=16)
wer = WordErrorRate()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.out = torch.nn.Linear(16, len(CHARS) + 1)

    def forward(self, wave):
        return self.out(mel(wave).transpose(1, 2)).log_softmax(-1)


model = Model()
optimizer = torch.optim.Adam(model.parameters())
for _ in range(2):
    logits = model(torch.randn(1, 1600)).transpose(0, 1)
    target = torch.tensor([[CHARS[c] for c in "hello"]])
    loss = F.ctc_loss(logits, target, torch.tensor([logits.shape[0]]), torch.tensor([5]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("WER", float(wer(["hello"], ["hallo"])))
''' + REPORT

# The DeepSpeech2 tutorial's shape (torchaudio transforms, a TextTransform character map, a
# greedy decoder, its own cer/wer, nn.CTCLoss(blank=28), AdamW with OneCycleLR), on made-up
# tensors instead of LibriSpeech.
DEEPSPEECH2 = AT_IMPORT + '''
import json
import torch.nn as nn
import torch.optim as optim
import torchaudio


class TextTransform:
    """Maps characters to integers and vice versa"""

    def __init__(self):
        self.char_map = {"'": 0, "<SPACE>": 1, **{chr(97 + i): i + 2 for i in range(26)}}
        self.index_map = {v: k for k, v in self.char_map.items()}

    def text_to_int(self, text):
        return [self.char_map["<SPACE>" if c == " " else c] for c in text]


text_transform = TextTransform()
train_audio_transforms = nn.Sequential(
    torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_mels=16),
)


def train(model, optimizer, scheduler, criterion):
    spectrograms = train_audio_transforms(torch.randn(2, 1600)).transpose(1, 2)
    labels = torch.tensor([text_transform.text_to_int("ab"), text_transform.text_to_int("cd")])
    output = model(spectrograms).log_softmax(2).transpose(0, 1)
    loss = criterion(output, labels, torch.tensor([output.shape[0]] * 2), torch.tensor([2, 2]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def main():
    model = nn.Linear(16, 29)
    optimizer = optim.AdamW(model.parameters(), 5e-4)
    criterion = nn.CTCLoss(blank=28)
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-4, total_steps=10)
    for _ in range(2):
        train(model, optimizer, scheduler, criterion)


main()
''' + REPORT

# An own SpeechBrain CTC trainer: its CTCTextEncoder, ctc_loss and greedy decoder, no
# SentencePiece; Brain.fit builds the optimizer.
SPEECHBRAIN_CTC = AT_IMPORT + '''
import json
import speechbrain as sb
from speechbrain.dataio.encoder import CTCTextEncoder
from speechbrain.decoders import ctc_greedy_decode


class ASR(sb.Brain):
    def compute_objectives(self, predictions, batch, stage):
        return sb.nnet.losses.ctc_loss(predictions, batch, None, None, blank_index=0)


encoder = CTCTextEncoder()
brain = ASR(modules={"model": torch.nn.Linear(16, 29)}, opt_class=torch.optim.Adam)
brain.fit(range(1), [torch.randn(2, 16)])
''' + REPORT

# Hard negatives: the same losses, libraries and shapes for other work.
CTC_IMAGES = AT_IMPORT + '''
import json
from torch import nn

ALPHABET = "0123456789"  # a CRNN reading digits from images (OCR): CTC, no audio
images = torch.randn(2, 1, 32, 64)
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Flatten(2), nn.Linear(2048, 11))
ctc = nn.CTCLoss(blank=10)
optimizer = torch.optim.Adam(model.parameters())
log_probs = model(images).log_softmax(-1).permute(1, 0, 2)
loss = ctc(log_probs, torch.tensor([[1, 2], [3, 4]]), torch.tensor([4, 4]), torch.tensor([2, 2]))
loss.backward()
optimizer.step()
''' + REPORT

CTC_TEXT = AT_IMPORT + '''
import json
import torch.nn.functional as F

PHONES = ["_", "AA", "B", "K", "T"]  # grapheme-to-phoneme with CTC: text in, text out
model = torch.nn.Embedding(30, len(PHONES))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
log_probs = model(torch.tensor([[3, 1, 20]])).log_softmax(-1).transpose(0, 1)
loss = F.ctc_loss(log_probs, torch.tensor([[3, 1, 4]]), torch.tensor([3]), torch.tensor([3]))
loss.backward()
optimizer.step()
''' + REPORT

KEYWORDS = AT_IMPORT + '''
import json
import numpy as np
import soundfile as sf
from torch import nn

KEYWORDS = ["yes", "no", "up", "down"]  # keyword spotting: audio in, a class out
sf.write("clip.wav", np.zeros(1600, dtype="float32"), 16000)
audio, _ = sf.read("clip.wav", dtype="float32")
model = nn.Linear(1600, len(KEYWORDS))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters())
loss = criterion(model(torch.tensor(audio).view(1, -1)), torch.tensor([1]))
loss.backward()
optimizer.step()
''' + REPORT

# A project's training module (where the optimizer is built) and its evaluation script.
PROJECT_TRAIN = '''
import soundfile as sf
import torch
from torch import nn

VOCAB = list(" abcdefghijklmnopqrstuvwxyz")


def build_model():
    return nn.GRU(16, len(VOCAB), batch_first=True)


def train(model):
    ctc = nn.CTCLoss()
    optimizer = torch.optim.AdamW(model.parameters())
    return ctc, optimizer
'''
PROJECT_EVAL = AT_IMPORT + '''
import json
from asrproject.train import build_model

model = build_model().eval()
with torch.no_grad():
    model(torch.randn(1, 10, 16))
''' + REPORT

# site-packages stand-ins for the libraries the test venv lacks (what matters here is the
# program's own source, read before either is imported)
TORCHAUDIO = {
    "torchaudio/__init__.py": "from . import transforms\n",
    "torchaudio/transforms.py": '''
        import torch


        class MelSpectrogram(torch.nn.Module):
            def __init__(self, sample_rate=16000, n_mels=16):
                super().__init__()
                self.n_mels = n_mels

            def forward(self, wave):
                frames = wave.unfold(-1, 32, 16)
                return torch.stft(frames.flatten(0, -2), 32, return_complex=True).abs()\\
                    .mean(-1).view(*frames.shape[:-1], -1)[..., : self.n_mels].transpose(-1, -2)
    ''',
}
SPEECHBRAIN = {
    "speechbrain/__init__.py": "from . import nnet, dataio, decoders\nfrom .core import Brain\n",
    "speechbrain/core.py": '''
        import torch


        class Brain:
            def __init__(self, modules, opt_class):
                self.modules, self.opt_class = modules, opt_class

            def fit(self, epochs, data):
                params = self.modules["model"].parameters()
                optimizer = self.opt_class(params)
                for _ in epochs:
                    for x in data:
                        loss = self.modules["model"](x).sum()
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
    ''',
    "speechbrain/nnet/__init__.py": "from . import losses\n",
    "speechbrain/nnet/losses.py": "def ctc_loss(*args, **kwargs):\n    pass\n",
    "speechbrain/dataio/__init__.py": "",
    "speechbrain/dataio/encoder.py": "class CTCTextEncoder:\n    pass\n",
    "speechbrain/decoders.py": "def ctc_greedy_decode(*args):\n    pass\n",
}

PROGRAMS = {
    # name: (files, script, expected: "early" | "untouched")
    "ctc_soundfile": ({"train.py": CTC_SOUNDFILE}, "train.py", "early"),
    "wer_torchaudio": ({"train.py": WER_TORCHAUDIO}, "train.py", "early"),
    "deepspeech2": ({"train.py": DEEPSPEECH2}, "train.py", "early"),
    "speechbrain_ctc": ({"train.py": SPEECHBRAIN_CTC}, "train.py", "early"),
    "ctc_images": ({"train.py": CTC_IMAGES}, "train.py", "untouched"),
    "ctc_text": ({"train.py": CTC_TEXT}, "train.py", "untouched"),
    "keywords": ({"train.py": KEYWORDS}, "train.py", "untouched"),
    "project_eval": ({"asrproject/__init__.py": "", "asrproject/train.py": PROJECT_TRAIN,
                      "evaluate.py": PROJECT_EVAL}, "evaluate.py", "untouched"),
}


def _lay_out(sandbox: Sandbox, name: str) -> tuple[str, dict[str, str]]:
    site = sandbox.work / "site-packages"
    for path, text in {**TORCHAUDIO, **SPEECHBRAIN}.items():
        sandbox.write(site / path, text)
    files, script, _ = PROGRAMS[name]
    for path, text in files.items():
        sandbox.write(path, text)
    return script, {"PYTHONPATH": str(site)}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_what_it_trains_with_decides_and_when(sandbox: Sandbox, name: str) -> None:
    script, env = _lay_out(sandbox, name)
    expected = PROGRAMS[name][2]
    explained = sandbox.run(["-m", "autoalloc", "explain", "--json", "--", "python", script],
                            env=env)
    assert explained.returncode == 0, explained.stderr
    prediction = json.loads(explained.stdout)["prediction"]
    run = sandbox.run([script], env={**env, "AUTOALLOC_DEBUG": "1"})
    assert run.returncode == 0, run.stderr
    seen = at_import(run)
    if expected == "early":
        assert prediction["outcome"] == "apply", prediction
        assert prediction["when"] == "before torch starts", prediction
        assert seen == ES, run.stderr  # in the environment before torch started
        assert "its source shows it trains" in run.stderr
        assert "via the runtime setter" not in run.stderr
    else:
        assert prediction["outcome"] != "apply", prediction
        assert seen is None, run.stderr
        assert "Warning" not in run.stderr and ": none " in run.stderr


def test_the_first_line_names_what_made_it_and_when(sandbox: Sandbox) -> None:
    script, env = _lay_out(sandbox, "ctc_soundfile")
    text = sandbox.run(["-m", "autoalloc", "explain", "--", "python", script], env=env).stdout
    first, second = text.splitlines()[:2]
    assert first == (
        "prediction:   apply before torch starts (speech-training: imports soundfile at "
        "train.py:8; uses torch.nn.CTCLoss at train.py:16; builds torch.optim.AdamW at "
        "train.py:18)"
    )
    assert second.startswith("decision:     apply  rule speech-training from builtin")
    script, env = _lay_out(sandbox, "keywords")
    text = sandbox.run(["-m", "autoalloc", "explain", "--", "python", script], env=env).stdout
    first = text.splitlines()[0]
    assert first.startswith("prediction:   stays off: it trains with audio (soundfile at "
                            "train.py:8) but shows no speech-to-text signal")
    assert first.endswith('[[rules]] / scripts = ["train.py"]; if it is other audio work: '
                          'enable = ["audio-training"]')


def test_evaluation_scripts_of_a_training_project_predict_off(sandbox: Sandbox) -> None:
    """The training module builds the optimizer, the evaluation script does not: explain
    says it stays off (builds no optimizer), never "before torch starts"."""
    script, env = _lay_out(sandbox, "project_eval")
    report = json.loads(sandbox.run(["-m", "autoalloc", "explain", "--json", "--", "python",
                                     script], env=env).stdout)
    assert report["decision"]["action"] == "none"
    assert report["prediction"]["when"] is None
    assert "soundfile" in report["prediction"]["evidence"]  # read, but no optimizer here


def test_a_later_run_reads_the_source_from_the_cache(sandbox: Sandbox) -> None:
    """The source read at `import torch` is remembered across processes: an unchanged script
    is not parsed again; an edit is seen."""
    script, env = _lay_out(sandbox, "ctc_images")
    for _ in range(2):
        assert at_import(sandbox.run([script], env=env)) is None
    cache = sandbox.home / ".cache" / "autoalloc"
    assert any(p.name.startswith("scan-") for p in cache.iterdir())
    sandbox.write(script, CTC_IMAGES.replace("ALPHABET", "import soundfile\nALPHABET"))
    assert at_import(sandbox.run([script], env=env)) == ES  # now it trains with audio


def at_import(run) -> str | None:
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.split("AT_IMPORT ", 1)[1].splitlines()[0])


def test_what_the_program_holds_counts_at_its_first_optimizer(sandbox: Sandbox) -> None:
    """Where the source does not show the optimizer (built by a function of an own module),
    the run decides at the first optimizer, from what the program's code holds and uses."""
    script, env = _lay_out(sandbox, "ctc_soundfile")
    sandbox.write("trainer.py", "import torch\n\n\ndef make(model):\n"
                  "    return torch.optim.AdamW(model.parameters(), lr=1e-3)\n")
    sandbox.write(script, CTC_SOUNDFILE.replace(
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)",
        "import trainer\noptimizer = trainer.make(model)"))
    run = sandbox.run([script], env={**env, "AUTOALLOC_DEBUG": "1"})
    assert at_import(run) is None  # not before torch started
    assert "first optimizer" in run.stderr and "via the runtime setter" in run.stderr
