"""What a user who is not root meets, and usage mistakes: one line and an exit status, never a
traceback; the pyproject table an autoalloc.toml hides is named; long values are quoted short.

Tests that need another user fork, drop to ``nobody`` in the child (the interpreter is
already loaded: the test venv's python lives below /root) and call autoalloc's functions
there on the real file system.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from autoalloc import cli, decide, entrypoint, layercache, sources
from autoalloc.messages import shortened
from tests.helpers import (
    PY,
    REPO,
    Sandbox,
    assert_untouched,
    autoalloc_warnings,
    clean_env,
)

NOBODY = 65534
needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become another user"
)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can enter (pytest's tmp_path sits below a root-only one)."""
    path = Path(tempfile.mkdtemp(prefix="autoalloc-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(work: Callable[[], object]) -> object:
    """``work()``'s JSON-able result, computed in a child running as user ``nobody``."""
    import encodings.utf_8_sig  # noqa: F401  (loaded now: below /root, out of nobody's reach)
    import statistics  # noqa: F401

    import platformdirs  # noqa: F401
    import tomllib  # noqa: F401

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            data = json.dumps(work()).encode()
            os.write(write, data)
        except BaseException as exc:
            os.write(write, json.dumps({"child error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


# ---------------------------------------------------------------- #20.5 an unreachable HOME


@needs_root
def test_unreachable_home_is_silent(open_dir: Path) -> None:
    # `docker run --user 1000` on an image whose HOME is /root: HOME below a directory this
    # user cannot enter. No warning (it is not the user's mistake); explain and doctor show it.
    locked = open_dir / "root-home"
    (locked / ".config").mkdir(parents=True)
    locked.chmod(0o700)
    project = open_dir / "project"
    project.mkdir()
    env = {"HOME": str(locked), "XDG_CONFIG_HOME": str(locked / ".config")}

    def work() -> object:
        layercache._ENABLED[:] = []  # as explain and doctor read (another test may enable it)
        layers = sources.read_layers(entrypoint.EntryPoint("unknown"), env, str(project))
        policy = sources.load(entrypoint.EntryPoint("unknown"), env, str(project))
        user = next(layer for layer in layers if layer.layer == "user")
        return [user.status, user.message, decide.layer_warnings(policy)]

    got = as_nobody(work)
    assert isinstance(got, list), got
    status, message, warnings = got
    assert warnings == []
    assert status == "missing" and "not searchable" in message


# ---------------------------------------------------------------- #20.8 init


@needs_root
def test_init_in_an_unwritable_directory_is_one_line(open_dir: Path) -> None:
    directory = open_dir / "ro"
    directory.mkdir()

    def work() -> object:
        os.chdir(directory)
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = cli.main(["init"])
        return [code, err.getvalue()]

    got = as_nobody(work)
    assert isinstance(got, list), got
    code, err = got
    assert code == 1
    assert err.splitlines() == [
        f"autoalloc init: cannot write {directory}/autoalloc.toml: Permission denied"
    ]


# ---------------------------------------------------------------- #20.7 ab usage errors


@pytest.mark.parametrize(
    "options", [["--steps", "-5"], ["--repeat", "0"], ["--steps", "0"], ["--warmup", "-1"]]
)
def test_ab_rejects_counts_below_one(
    options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ab", *options, "--", PY, "-c", "pass"]) == 2
    assert f"{options[0]} must be at least" in capsys.readouterr().err


def test_ab_with_an_interpreter_without_autoalloc_says_so_before_running(tmp_path: Path) -> None:
    # A venv that does not have autoalloc (no pip: nothing to install, nothing to download).
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "other")],
        check=True,
        timeout=120,
    )
    other = tmp_path / "other" / "bin" / "python"
    marker = tmp_path / "ran"
    result = subprocess.run(
        [
            PY,
            "-m",
            "autoalloc",
            "ab",
            "--out",
            str(tmp_path / "out"),
            "--",
            str(other),
            "-c",
            f"open({str(marker)!r}, 'w')",
        ],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert f"{other} does not have autoalloc" in result.stderr
    assert "ab -- ..." in result.stderr and "Traceback" not in result.stderr
    # the test venv's autoalloc is this checkout, installed editable: the line installs it
    assert f"{other} -m pip install {REPO}" in result.stderr
    assert not marker.exists()  # the program never ran


def test_the_install_line_names_where_this_autoalloc_came_from() -> None:
    """autoalloc is not on the package index: the line ab prints installs it from the clone,
    the wheel or the repository URL it was installed from (PEP 610), never `pip install
    autoalloc`."""
    from autoalloc.ab.interpreter import install_line

    def line(origin: str | None) -> str:
        return install_line("/v/bin/python", origin)

    editable = '{"url": "file:///home/me/my%20src/autoalloc", "dir_info": {"editable": true}}'
    assert line(editable) == "/v/bin/python -m pip install '/home/me/my src/autoalloc'"
    wheel = '{"url": "file:///w/autoalloc-0.1.0-py3-none-any.whl", "archive_info": {}}'
    assert line(wheel) == "/v/bin/python -m pip install /w/autoalloc-0.1.0-py3-none-any.whl"
    vcs = '{"url": "https://example.org/autoalloc", "vcs_info": {"vcs": "git", "commit_id": "ab1"}}'
    assert line(vcs) == "/v/bin/python -m pip install git+https://example.org/autoalloc@ab1"
    for unknown in ("", "not json", '{"no": "url"}', "[]"):
        assert "-m pip install ./autoalloc, from the folder that holds your clone" in line(unknown)


def test_ab_default_output_is_outside_the_project_and_named(tmp_path: Path) -> None:
    env = {**clean_env(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    (tmp_path / "home").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    result = subprocess.run(
        [
            PY,
            "-m",
            "autoalloc",
            "ab",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--repeat",
            "1",
            "--timeout",
            "60",
            "--",
            PY,
            "-c",
            "pass",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert list(project.iterdir()) == []  # nothing written into the project
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("ab: logs, reports")]
    where = Path(line.split(" go to ")[1].split(" (--out")[0])
    assert where.is_relative_to(tmp_path / "cache" / "autoalloc")
    assert (where / "ab.json").exists()


# ---------------------------------------------------------------- #21.2 a shadowed pyproject

PYPROJECT = """\
[project]
name = "x"

[tool.autoalloc]
[[tool.autoalloc.rules]]
name = "mine"
scripts = ["train_mine.py"]
"""


def test_autoalloc_toml_wins_and_the_ignored_table_is_named(sandbox: Sandbox) -> None:
    sandbox.write("pyproject.toml", PYPROJECT)
    sandbox.write("autoalloc.toml", "# autoalloc init\n")
    script = sandbox.script("train_mine.py")
    run = sandbox.run([str(script)])
    assert_untouched(run)  # the pyproject rule "mine" would apply: its table is not read
    (warning,) = autoalloc_warnings(run.stderr)
    assert "pyproject.toml beside it has a [tool.autoalloc] table, which is ignored" in warning
    check = sandbox.run(["-m", "autoalloc", "check"])
    assert check.returncode == 1
    assert "[tool.autoalloc] table, which is ignored" in check.stdout
    assert not [line for line in check.stdout.splitlines() if line.endswith("work/autoalloc.toml")]
    named = sandbox.run(["-m", "autoalloc", "check", "pyproject.toml"])
    assert named.returncode == 1 and "Its [tool.autoalloc] table, which is ignored" in named.stdout
    explain = sandbox.run(["-m", "autoalloc", "explain", "--", "python", str(script)])
    assert "[tool.autoalloc] table, which is ignored" in explain.stdout


def test_pyproject_alone_is_read(sandbox: Sandbox) -> None:
    sandbox.write("pyproject.toml", PYPROJECT)
    check = sandbox.run(["-m", "autoalloc", "check"])
    assert check.returncode == 0 and "ok " in check.stdout and "ignored" not in check.stdout


# ---------------------------------------------------------------- #20.9 short quotes


def test_shortened_keeps_messages_short() -> None:
    huge = "k" * 900_000
    text = shortened(huge)
    assert len(text) < 100 and text.startswith("'kkk") and "(900000 characters)" in text
    assert shortened("ok") == "'ok'" and shortened("\x1b[31m") == "'\\x1b[31m'"


def test_huge_unknown_key_and_huge_env_value_give_short_warnings(sandbox: Sandbox) -> None:
    key = "x" * 900_000
    sandbox.write("autoalloc.toml", f"{key} = 1\n")
    script = sandbox.script("train.py", "import torch\n", probe=False)
    run = sandbox.run([str(script)], env={"PYTORCH_CUDA_ALLOC_CONF": "garbage" * 14_000})
    assert run.returncode == 0, run.stderr
    assert len(run.stderr) < 4000, len(run.stderr)
    check = sandbox.run(["-m", "autoalloc", "check"])
    assert len(check.stdout) < 1000 and "900000 characters" in check.stdout
