"""``explain``'s prediction: a program's own source read (``autoalloc.scan``), never run.

In process: what the reader finds (imports with their lines, Hugging Face model classes,
configuration tags, the optimizer, what only the run can tell, own modules followed,
installed ones not). End to end: ``autoalloc explain`` on scripts, and the prediction
against what the real hook then does on the same scripts (real torch): they must agree.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from autoalloc import scan
from tests.helpers import Sandbox, probe_result

LIBS = ("/nonexistent-lib/",)


def _scan(
    tmp_path: Path, files: dict[str, str], args: tuple[str, ...] = (), script: str = "train.py"
) -> scan.Scan:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return scan.scan(str(tmp_path / script), args, str(cwd if script != "train.py" else tmp_path),
                     LIBS)


def test_own_packages_are_found_at_the_checkout_root_and_under_src(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    found = _scan(tmp_path, {
        "examples/asr/train.py": "import slam_llm.pipeline\n",
        "src/slam_llm/__init__.py": "",
        "src/slam_llm/pipeline.py": "import soundfile\n",
    }, script="examples/asr/train.py")
    assert found.names["soundfile"] == "pipeline.py:1"


def test_imports_with_their_lines_and_own_modules_followed(tmp_path: Path) -> None:
    found = _scan(tmp_path, {
        "train.py": """
            import torch
            from mylib.data import load
            from . import nothing_here
            def main():
                import soundfile as sf
        """,
        "mylib/__init__.py": "",
        "mylib/data.py": "import sentencepiece\nfrom .text import T\n"
                         "def later():\n    import librosa\n",
        "mylib/text.py": "import jiwer\n",
    })
    assert "librosa" not in found.names  # a helper's function-level import runs only if called
    assert found.names["soundfile"] == "train.py:6"  # inside a function: the run imports it too
    assert found.names["sentencepiece"] == "data.py:1"
    assert found.names["jiwer"] == "text.py:1"  # a relative import of an own module, followed
    assert {"sentencepiece", "jiwer", "mylib.data.load"} <= found.imported()
    assert len(found.files) == 4 and found.complete


def test_hugging_face_model_classes_name_their_model_package(tmp_path: Path) -> None:
    found = _scan(tmp_path, {"train.py": """
        from transformers import WhisperForConditionalGeneration, Wav2Vec2BertForCTC
        from transformers import AutoModelForCTC
    """})
    assert found.names["transformers.models.whisper"] == "train.py:2"
    assert "transformers.models.wav2vec2_bert" in found.names
    assert "transformers.models.wav2vec2" not in found.names  # the longest prefix wins
    assert any("AutoModelForCTC" in u and "checkpoint" in u for u in found.unknown)
    assert scan.hf_model("Wav2Vec2Processor") == "wav2vec2" and scan.hf_model("ASTModel") == "audio_spectrogram_transformer"
    assert scan.hf_model("Wavy") is None and scan.hf_model("SEWDModel") == "sew_d"


@pytest.mark.parametrize(
    ("code", "optimizer"),
    [
        ("import torch\nopt = torch.optim.AdamW([])", "torch.optim.AdamW at train.py:2"),
        ("from torch.optim import SGD as S\nS([])", "torch.optim.SGD at train.py:2"),
        ("from torch import optim\noptim.Adam([])", "torch.optim.Adam at train.py:2"),
        # a LightningModule alone is not training (inference scripts load one): its .fit is
        ("import lightning as L\nclass M(L.LightningModule):\n    def configure_optimizers(s):"
         "\n        pass", None),
        ("import lightning as L\nt = L.Trainer()\nt.fit(None)",
         ".fit() at train.py:3 (the trainer builds the optimizer)"),
        ("import torch\nopt = getattr(torch.optim, 'Adam')([])",
         "getattr(torch.optim, ...) at train.py:2"),
        ("from transformers import Trainer\nclass CTCTrainer(Trainer):\n    pass\nCTCTrainer()",
         "CTCTrainer at train.py:4 (it builds the optimizer)"),
        ("from torch.utils.data import optim\nimport torch\nfrom x.y import Adam\n", None),
        ("from transformers import Seq2SeqTrainer\nt = Seq2SeqTrainer()",
         "transformers.Seq2SeqTrainer at train.py:2 (it builds the optimizer)"),
        ("import deepspeed\ndeepspeed.initialize()", "deepspeed.initialize at train.py:2"),
        ("import speechbrain as sb\nb = sb.Brain()\nb.fit()",
         ".fit() at train.py:3 (the trainer builds the optimizer)"),
        ("import torch\nmodel = torch.nn.Linear(2, 2)\nmodel(torch.zeros(2))", None),
    ],
)
def test_where_it_builds_an_optimizer(tmp_path: Path, code: str, optimizer: str | None) -> None:
    assert _scan(tmp_path, {"train.py": code}).optimizer == optimizer


def test_configuration_files_name_classes(tmp_path: Path) -> None:
    found = _scan(tmp_path, {
        "train.py": "import speechbrain\nhparams = 'hparams/train.yaml'\n",
        "hparams/train.yaml": "tokenizer: !new:sentencepiece.SentencePieceProcessor\n"
                              "model:\n  _target_: mypkg.models.Conformer\n",
        "other.yaml": "loss: !name:speechbrain.nnet.losses.ctc_loss\n",
    }, args=("other.yaml", "--lr", "1"))
    assert found.names["sentencepiece.SentencePieceProcessor"] == "train.yaml:1"
    assert "mypkg.Conformer" in found.names  # the package's public name, as the run names it
    assert found.names["speechbrain.nnet.losses.ctc_loss"] == "other.yaml:1"
    assert len(found.configs) == 2


def test_installed_code_is_not_read_and_budgets_hold(tmp_path: Path) -> None:
    files = {"train.py": "import biglib\n", "biglib/__init__.py": "import soundfile\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = scan.scan(str(tmp_path / "train.py"), (), str(tmp_path), (str(tmp_path / "biglib") + "/",))
    assert "soundfile" not in found.names  # biglib is installed code here: its imports are its own
    many = {"train.py": "\n".join(f"import m{i}" for i in range(300))}
    many.update({f"m{i}.py": "" for i in range(300)})
    found = _scan(tmp_path, many)
    assert not found.complete and len(found.files) == scan.MAX_FILES
    assert len(found.unread) == 300 + 1 - scan.MAX_FILES
    assert found.unread[0].endswith(" (over the budget of files)")
    with pytest.raises(FileNotFoundError):
        scan.scan(str(tmp_path / "nope.py"), (), str(tmp_path), LIBS)


def test_no_clock_bounds_the_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files and bytes bound what is read, never the time it takes: a loaded machine decides
    as an idle one (a clock that jumps an hour per call changes nothing)."""
    import time

    hour = iter(range(0, 10**9, 3600))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(hour)))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(hour)))
    files = {"train.py": "import a\n", "a.py": "import b\n", "b.py": "import soundfile\n"}
    found = _scan(tmp_path, files)
    assert found.complete and found.names["soundfile"] == "b.py:1"
    assert scan.named_in([str(tmp_path / "b.py")], ["soundfile"]) == {
        "soundfile": f"{tmp_path / 'b.py'}:1"}


def test_what_the_code_uses_among_the_names_asked_for(tmp_path: Path) -> None:
    found = scan.scan(
        str(_write(tmp_path, "train.py", """
            import torch.nn as nn
            import torch.nn.functional as F
            import evaluate
            from mytool import tgt
            ctc = nn.CTCLoss(blank=0)
            metric = evaluate.load("wer")
            def step(x):
                return F.ctc_loss(x, x, x, x)
        """)), (), str(tmp_path), LIBS,
        wanted={"torch.nn.CTCLoss", "torch.nn.functional.ctc_loss", "evaluate.load:wer"})
    assert found.names["torch.nn.CTCLoss"] == "train.py:6"
    assert found.names["evaluate.load:wer"] == "train.py:7"
    assert found.names["torch.nn.functional.ctc_loss"] == "train.py:9"
    assert set(found.uses) == {"torch.nn.CTCLoss", "evaluate.load:wer",
                               "torch.nn.functional.ctc_loss"}
    _write(tmp_path, "tgt.py", "")
    own = scan.scan(str(_write(tmp_path, "t2.py", "import tgt\nimport soundfile\n")), (),
                    str(tmp_path), LIBS)
    assert own.own == ("tgt",) and "tgt" not in own.imported({"tgt", "soundfile"})
    assert "soundfile" in own.imported({"tgt", "soundfile"})


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# End to end: the prediction and the real hook on the same scripts. ``site-packages/`` holds
# stand-ins for the libraries the test venv lacks; which code imports them is what matters.
TRAIN = "import torch\nmodel = torch.nn.Linear(4, 2)\nopt = torch.optim.AdamW(model.parameters())\n"
PROGRAMS = {
    # (script, expected outcome); the hook must then apply exactly when "apply" is predicted
    "speech": ("import soundfile, jiwer\n" + TRAIN, "apply"),
    "text_with_library_audio": ("import textstack\n" + TRAIN, "off"),
    "tts": ("import soundfile, phonemizer\n" + TRAIN, "off"),
    "no_optimizer": ("import soundfile, jiwer, torch\ntorch.zeros(1)\n", "depends"),
    "in_function": ("import jiwer\ndef load():\n    import soundfile\nload()\n" + TRAIN, "apply"),
}


def _programs(sandbox: Sandbox) -> dict[str, str]:
    site = sandbox.work / "lib" / "site-packages"
    sandbox.write(site / "textstack" / "__init__.py", "import soundfile, jiwer\n")
    for name in ("jiwer", "phonemizer"):
        sandbox.write(site / name / "__init__.py", "")
    for name, (body, _) in PROGRAMS.items():
        sandbox.script(f"{name}.py", body)
    return {"PYTHONPATH": str(site)}


def _predicted(sandbox: Sandbox, env: dict[str, str], name: str) -> dict:
    result = sandbox.run(["-m", "autoalloc", "explain", "--json", "--", "python", f"{name}.py"], env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["prediction"]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_prediction_agrees_with_what_the_hook_does(sandbox: Sandbox, name: str, full: bool) -> None:
    if not full and name != "speech":
        pytest.skip("quick run: one program (--full: all)")
    env = _programs(sandbox)
    prediction = _predicted(sandbox, env, name)
    assert prediction["outcome"] == PROGRAMS[name][1], prediction
    run = sandbox.run([f"{name}.py"], env=env)
    assert run.returncode == 0, run.stderr
    applied = probe_result(run.stdout)["applied"] is not None
    assert applied is (prediction["outcome"] == "apply"), (prediction, run.stderr)


def test_explain_first_line_answers_and_a_missing_script_is_an_error(sandbox: Sandbox) -> None:
    env = _programs(sandbox)
    text = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "speech.py"], env=env).stdout
    first = text.splitlines()[0]
    assert first.startswith("prediction:   apply before torch starts (speech-training: ")
    assert "soundfile at speech.py:1" in first and "builds torch.optim.AdamW at speech.py:4" in first
    assert "check:" not in text  # no generic example: the script was read
    tts = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "tts.py"], env=env).stdout
    assert tts.splitlines()[0] == (
        'prediction:   stays off: trains other audio (audio-training would take it: '
        'enable = ["audio-training"])'
    )
    # what it did not read is said, and a source that cannot be parsed is no "stays off"
    sandbox.write("deep.py", "x = 1" + "+1" * 20000 + "\n")
    sandbox.write("big.py", "x = 1\n" + "#" * (3 << 20) + "\n")
    sandbox.script("uses_deep.py", "try:\n    import deep\nexcept RecursionError:\n    pass\n"
                   "import big, soundfile\nimport torch\ntorch.optim.SGD([torch.zeros(1)], 0.1)\n")
    report = sandbox.run(["-m", "autoalloc", "explain", "--json", "--", "python", "uses_deep.py"],
                         env=env)
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    prediction = json.loads(report.stdout)["prediction"]
    assert prediction["complete"] is False
    assert {u.rpartition(" (")[2] for u in prediction["unread"]} == {
        "cannot be parsed: RecursionError)", "larger than 1 MiB)"}
    assert "; not read: " in prediction["text"]
    assert "deep.py (cannot be parsed: RecursionError)" in prediction["text"]
    assert "big.py (larger than 1 MiB)" in prediction["text"]
    text = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "deep.py"], env=env)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0] == (
        "prediction:   depends on what its source does: it could not be read (cannot be "
        "parsed: RecursionError)")
    missing = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "nope.py"], env=env)
    assert missing.returncode == 2
    assert missing.stdout.startswith("prediction:   no such script: ")
