"""Silence: a process that matches no rule behaves byte for byte as if autoalloc were not installed.

How "without the hook" is made: the dev venv cannot be changed (other test runs use it at the
same time), and ``AUTOALLOC_DISABLE=1`` or ``python -S`` are not "not installed" (the first
still loads the hook, the second drops all of site-packages). So the test builds one throwaway
venv from the same base interpreter (``--without-pip``) whose site-packages holds a path line
to the dev venv's site-packages (path lines add a directory to ``sys.path`` without
processing the ``.pth`` files in it) and copies of the dev venv's ``.pth`` files except
autoalloc's: torch, pip, numpy and the editable autoalloc are importable exactly as in the dev
venv, but the hook is not installed. Each invocation runs there twice, with the hook's
``autoalloc.pth`` (and ``.start``) copied in and with them removed: same interpreter path,
same ``sys.path`` (bar nothing), same working directory, same environment. A control
invocation proves the copy does arm the watcher.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import REPO, Sandbox

WATCHERS = "import sys; print(sum(bool(getattr(f, 'autoalloc_watcher', False)) for f in sys.meta_path))"

SLOW = pytest.mark.slow
# Two cases in the quick run (torch imported; a tool whose output holds paths), all with --full.
CORPUS = [
    pytest.param(["-c", "pass"], None, id="c-pass", marks=SLOW),
    pytest.param(["-c", "import torch"], None, id="c-import-torch"),
    pytest.param(["-m", "json.tool", "small.json"], None, id="m-json.tool", marks=SLOW),
    pytest.param(["-m", "pip", "--version"], None, id="m-pip-version"),
    pytest.param(
        ["-i"],
        "import torch\n1 + 1\nprint('repl', torch.ones(2).sum().item())\n",
        id="repl-from-stdin",
        marks=SLOW,
    ),
    pytest.param(
        [], "import sys\nprint('stdin script', sys.argv)\n", id="script-from-stdin", marks=SLOW
    ),
    pytest.param(["tools/plain_tool.py", "--flag"], None, id="script-importing-torch", marks=SLOW),
    pytest.param(
        ["-c", "import warnings; warnings.warn('theirs'); raise SystemExit(3)"],
        None,
        id="c-warns-exit-3",
        marks=SLOW,
    ),
]

PLAIN_TOOL = """\
import sys
import torch
x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
print("plain tool", sys.argv[1:], x.sum().item(), file=sys.stdout)
print("to stderr", file=sys.stderr)
"""


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of the same base interpreter that sees the dev venv's packages but not the hook."""
    root = tmp_path_factory.mktemp("silence")
    venv = root / "venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    py = venv / "bin" / "python"
    purelib = Path(
        subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       check=True, capture_output=True, text=True).stdout.strip()
    )
    dev = Path(sysconfig.get_paths()["purelib"])
    (purelib / "00_dev_venv.pth").write_text(f"{dev}\n")
    for pth in dev.glob("*.pth"):
        if pth.name != "autoalloc.pth":
            shutil.copy(pth, purelib / pth.name)
    assert (dev / "autoalloc.pth").read_bytes() == (REPO / "autoalloc.pth").read_bytes()
    return venv


def hook(venv: Path, installed: bool) -> None:
    """The wheel's root files in the twin's site-packages (the .pth looks for its module beside it)."""
    purelib = next((venv / "lib").glob("python3*/site-packages"))
    for name in ("autoalloc.pth", "autoalloc.start", "_autoalloc_startup.py", "_autoalloc_loader.py"):
        if installed:
            shutil.copy(REPO / name, purelib / name)
        else:
            (purelib / name).unlink(missing_ok=True)


def run(sandbox: Sandbox, venv: Path, args: list[str], stdin: str | None) -> tuple[int, bytes, bytes]:
    result = subprocess.run(
        [str(venv / "bin" / "python"), *args],
        cwd=sandbox.work,
        env=sandbox.env,
        input=stdin.encode() if stdin is not None else b"",
        capture_output=True,
        timeout=300,
    )
    return result.returncode, result.stdout, result.stderr


@pytest.fixture
def corpus_sandbox(sandbox: Sandbox) -> Sandbox:
    sandbox.write("small.json", '{"b": [1, 2, {"c": null}], "a": "\\u00e9"}\n')
    sandbox.write("tools/plain_tool.py", PLAIN_TOOL)
    # Policy files the hook reads and that match none of these invocations.
    sandbox.write("autoalloc.toml", '[[rules]]\nname = "other"\nscripts = ["train_other.py"]\n')
    sandbox.user_policy("[allocator]\ngarbage_collection_threshold = 0.7\n")
    return sandbox


@pytest.mark.parametrize(("args", "stdin"), CORPUS)
def test_non_matching_invocations_are_byte_identical(
    twin: Path, corpus_sandbox: Sandbox, args: list[str], stdin: str | None
) -> None:
    hook(twin, installed=True)
    try:
        assert run(corpus_sandbox, twin, ["-c", WATCHERS], None)[1] == b"1\n"  # control: the hook is live
        with_hook = run(corpus_sandbox, twin, args, stdin)
    finally:
        hook(twin, installed=False)
    assert run(corpus_sandbox, twin, ["-c", WATCHERS], None)[1] == b"0\n"  # control: and now it is not
    without_hook = run(corpus_sandbox, twin, args, stdin)
    assert with_hook == without_hook
    # ... and none of it is autoalloc's: no trace line, no warning. (Not a search for the word:
    # pip --version prints its path, and the checkout's folder is usually called autoalloc.)
    for line in (with_hook[1] + with_hook[2]).splitlines():
        assert not line.startswith(b"autoalloc:") and b"AutoallocWarning" not in line, line
