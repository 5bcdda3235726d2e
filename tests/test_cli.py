"""The command line: explain (golden JSON), init, check, help."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autoalloc import cli
from tests.helpers import Sandbox

GOLDEN = Path(__file__).parent / "golden" / "explain_project_rule.json"


def autoalloc(sandbox: Sandbox, *args: str, **kw):
    return sandbox.run(["-m", "autoalloc", *args], **kw)


def normalize(report: dict, sandbox: Sandbox) -> dict:
    """Replace what differs between machines: temp paths, the interpreter, the repo, torch."""
    import autoalloc

    text = json.dumps(report)
    for old, new in (
        (str(sandbox.root), "<tmp>"),
        (str(Path(autoalloc.__file__).parent), "<autoalloc>"),
        (sys.executable, "<python>"),
    ):
        text = text.replace(old, new)
    data = json.loads(text)
    version = data["torch"]["version"]
    data["torch"] = {"version": "<version>", "flavour": data["torch"]["flavour"], "path": "<torch>"}
    data["decision"]["notes"] = [n.replace(version, "<version>") for n in data["decision"]["notes"]]
    # the built-in rule set has its own tests; here only that it is listed after the project's
    builtin = [r["name"] for r in data["rules"] if r["layer"] == "builtin"]
    assert "nemo-asr-train" in builtin and "hf-asr-examples" not in builtin
    data["rules"] = [r for r in data["rules"] if r["layer"] != "builtin"] + ["<builtin rules>"]
    return data


def test_explain_json_golden(sandbox: Sandbox) -> None:
    sandbox.write(
        "pyproject.toml",
        """\
        [tool.autoalloc]
        disable = ["hf-asr-examples"]

        [tool.autoalloc.allocator]
        garbage_collection_threshold = 0.8

        [[tool.autoalloc.rules]]
        name = "conformer-train"
        description = "our trainer"
        scripts = ["recipes/**/train_*.py"]
        argv = ["*conformer*"]
        """,
    )
    sandbox.write("recipes/ls/train_ctc.py", "")
    result = autoalloc(
        sandbox,
        "explain",
        "--json",
        "--",
        "python",
        "recipes/ls/train_ctc.py",
        "--model",
        "conformer",
        env={"PYTORCH_CUDA_ALLOC_CONF": "max_non_split_rounding_mb:64"},
    )
    assert result.returncode == 0, result.stderr
    data = normalize(json.loads(result.stdout), sandbox)
    if os.environ.get("AUTOALLOC_REGEN_GOLDEN"):  # review the diff like code
        GOLDEN.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data == json.loads(GOLDEN.read_text())


def test_explain_text_and_launcher(sandbox: Sandbox) -> None:
    sandbox.write("icefall/egs/librispeech/ASR/zipformer/train.py", "")
    cwd = sandbox.work / "icefall/egs/librispeech/ASR"
    result = autoalloc(
        sandbox, "explain", "--", "torchrun", "--nproc_per_node=2", "./zipformer/train.py", "--max-duration", "1000", cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"entry point:  script {cwd}/zipformer/train.py" in out
    assert "as seen by the workers of torchrun" in out
    assert "decision:     apply  rule icefall-train from builtin" in out
    assert "PYTORCH_CUDA_ALLOC_CONF: (unset) -> 'expandable_segments:True'" in out
    none = autoalloc(sandbox, "explain", "--", "python", "-c", "pass")
    assert "watching:     asrkit" not in none.stdout and "espnet2.train.trainer" in none.stdout


def test_explain_says_first_what_a_program_decided_late_will_get(sandbox: Sandbox) -> None:
    """Own fine-tuning script, no rule names it: not `decision: none`, but what it gets once
    it trains, which imports count, and the command that checks it."""
    sandbox.write("finetune_whisper.py", "")
    late = autoalloc(sandbox, "explain", "--", "python", "finetune_whisper.py")
    lines = late.stdout.splitlines()
    # first what its source says (an empty script: nothing), then what such a program gets
    assert lines[0] == "prediction:   stays off: builds no optimizer"
    assert lines[1].startswith("decision:     late: none now, 'expandable_segments:True' once it")
    assert "trains (builds an optimizer)" in lines[1] and "speech-training" in lines[1]
    assert any(
        x.startswith("  speech-training: trains after importing one of torchaudio, soundfile")
        for x in lines
    )
    assert not any(x.startswith("check:") for x in lines)  # the script was read: no example
    generic = autoalloc(sandbox, "explain", "--", "python", "-c", "import torch").stdout
    assert (
        "check:        autoalloc explain --import torchaudio --import transformers --trains -- "
        "python -c 'import torch'"
        in generic.splitlines()
    )
    check = autoalloc(
        sandbox,
        "explain",
        "--import",
        "torchaudio",
        "--import",
        "transformers",
        "--trains",
        "--",
        "python",
        "finetune_whisper.py",
    )
    assert check.stdout.startswith("decision:     apply  rule speech-training from builtin")
    listed = json.loads(autoalloc(sandbox, "explain", "--json", "--", "python", "finetune_whisper.py").stdout)
    speech = next(r for r in listed["rules"] if r["name"] == "speech-training")
    assert "phonemizer" in speech["not_imports"] and "jiwer" in speech["not_imports_unless"]
    # nothing can decide later once the late rules are off: then it is `none`
    sandbox.user_policy('disable = ["speech-training", "asr-toolkit-imports"]\n')
    off = autoalloc(sandbox, "explain", "--", "python", "finetune_whisper.py")
    assert off.stdout.splitlines()[0] == "decision:     none"


@pytest.mark.hook
def test_init_writes_and_refuses_to_overwrite(sandbox: Sandbox) -> None:
    first = autoalloc(sandbox, "init")
    assert first.returncode == 0 and (sandbox.work / "autoalloc.toml").exists()
    assert autoalloc(sandbox, "check", "autoalloc.toml").returncode == 0
    again = autoalloc(sandbox, "init", "--project")
    assert again.returncode == 1 and "not overwriting" in again.stderr
    user = autoalloc(sandbox, "init", "--user")
    assert user.returncode == 0 and sandbox.user_config.exists()
    assert autoalloc(sandbox, "init", "--user").returncode == 1


@pytest.mark.hook
def test_check(sandbox: Sandbox) -> None:
    good = sandbox.write("good.toml", '[[rules]]\nname = "a"\nscripts = ["x.py"]\n')
    bad = sandbox.write("bad.toml", "[allocator]\nmax_split_size_mb = 2\n")
    py = sandbox.write("pyproject.toml", "[tool.autoalloc]\nenabled = 1\n")
    result = autoalloc(sandbox, "check", str(good), str(bad), str(py))
    assert result.returncode == 1
    assert f"ok     {good}  (1 rule)\n" in result.stdout
    assert (
        f"error  {bad}: allocator.max_split_size_mb: must be >= 20. "
        "The option 'max_split_size_mb' is ignored.\n"
    ) in result.stdout
    assert f"error  {py}: enabled must be true or false. The setting 'enabled' is ignored.\n" in (
        result.stdout
    )
    assert autoalloc(sandbox, "check", str(good)).returncode == 0
    # without paths: every layer that applies here (the broken pyproject.toml)
    layers = autoalloc(sandbox, "check")
    assert layers.returncode == 1 and "builtin.toml" in layers.stdout and str(py) in layers.stdout


@pytest.mark.hook
@pytest.mark.parametrize("cmd", [c.name for c in cli.COMMANDS])
def test_help(sandbox: Sandbox, cmd: str) -> None:
    result = autoalloc(sandbox, cmd, "--help")
    assert result.returncode == 0 and f"usage: autoalloc {cmd}" in result.stdout, result.stderr


@pytest.mark.hook
def test_bare_autoalloc_lists_the_commands(sandbox: Sandbox) -> None:
    result = autoalloc(sandbox)
    assert result.returncode == 0 and result.stderr == ""
    listed = re.findall(r"^    (\S+)", result.stdout, re.MULTILINE)  # wrapped help: deeper
    assert listed == [c.name for c in cli.COMMANDS]


# Every command, run so that its first write meets a closed pipe (`... | head -3` that has
# ended): quiet, whatever the command, with PYTHONUNBUFFERED=1 as training containers set it.
CLOSED_PIPE = [
    ["explain", "--", "python", "train.py"],
    ["explain", "--json"],
    ["doctor"],
    ["init"],
    ["check", "autoalloc.toml"],
    ["report", "report.json"],
    ["ab", "--help"],
    ["bench", "--help"],
    ["--version"],
    [],
]


@pytest.mark.hook
@pytest.mark.parametrize("argv", CLOSED_PIPE, ids=[" ".join(a) or "bare" for a in CLOSED_PIPE])
def test_a_closed_pipe_is_quiet(sandbox: Sandbox, argv: list[str]) -> None:
    if argv[:1] != ["init"]:  # init writes it, and refuses to overwrite one
        sandbox.write("autoalloc.toml", '[[rules]]\nname = "a"\nscripts = ["x.py"]\n')
    sandbox.write("report.json", json.dumps({"pid": 1, "steps": 0, "step_times": []}))
    sandbox.write("train.py", "")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: EPIPE every time
    try:
        result = subprocess.run(
            [sys.executable, "-m", "autoalloc", *argv],
            cwd=sandbox.work,
            env={**sandbox.env, "PYTHONUNBUFFERED": "1"},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=180,
        )
    finally:
        os.close(write)
    assert "Error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1)


def test_console_script_and_module_agree(sandbox: Sandbox) -> None:
    exe = Path(sys.executable).parent / "autoalloc"
    a = sandbox.run([str(exe), "explain", "--json"], python="")
    b = autoalloc(sandbox, "explain", "--json")
    assert a.returncode == b.returncode == 0 and json.loads(a.stdout) == json.loads(b.stdout)
