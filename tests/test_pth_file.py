"""The startup files themselves: what every Python process of the environment executes.

``autoalloc.pth`` must be one plain, auditable line (security scanners and EDR rules read
it; cf. the litellm ``.pth`` compromise): ASCII, LF, no BOM (a BOM makes Python <= 3.12
skip the line silently), no ``exec``/``eval``/encoded payload, starting with ``import `` (the
only lines ``site`` executes), and named so that it sorts after editable-install ``.pth``
files. Behaviour: with the package present it arms one watcher; without it, nothing.
"""

from __future__ import annotations

import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.hook

PTH = REPO / "autoalloc.pth"
START = REPO / "autoalloc.start"
WATCHERS = "sum(bool(getattr(f, 'autoalloc_watcher', False)) for f in sys.meta_path)"


def test_pth_is_one_plain_ascii_line() -> None:
    data = PTH.read_bytes()
    assert not data.startswith(b"\xef\xbb\xbf")
    data.decode("ascii")
    assert b"\r" not in data and b"\t" not in data
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    line = data.decode().rstrip("\n")
    assert line.startswith("import ")
    assert all(32 <= ord(c) < 127 for c in line)
    compile(line, "autoalloc.pth", "exec")  # site.py exec()s the line as it is


def test_pth_has_no_exec_eval_or_encoded_content() -> None:
    line = PTH.read_text()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", line))
    assert not words & {"exec", "eval", "compile", "base64", "b64decode", "codecs", "marshal", "pickle", "zlib",
                        "subprocess", "system", "popen", "urllib", "socket", "getattr", "globals", "open"}
    assert not re.search(r"\\x|\\u|\\[0-7]{3}|[A-Za-z0-9+/]{40,}", line)  # no escapes, no long encoded blobs
    # It names exactly the module it imports and the function it calls.
    assert re.findall(r"""__import__\("([^"]+)"\)\._startup\.main\(\)""", line) == ["autoalloc._startup"]


def test_pth_sorts_after_editable_install_files() -> None:
    """site processes .pth files in sorted order: editable finders must run before the hook."""
    names = [
        "__editable__.autoalloc-0.1.0.pth",
        "__editable___autoalloc_0_1_0_finder.pth",
        "_editable_impl_autoalloc.pth",
        "_virtualenv.pth",
        "00-custom.pth",
        "Autoalloc.pth",
    ]
    assert sorted([*names, PTH.name])[-1] == PTH.name
    assert not PTH.name.startswith(".")  # hidden .pth files are skipped by newer Pythons
    assert re.fullmatch(r"[a-z][a-z0-9_]*\.pth", PTH.name)


def test_start_file_names_the_same_entry_point() -> None:
    data = START.read_bytes()
    assert data == b"autoalloc._startup:main\n"
    assert START.stem == PTH.stem  # PEP 829: a matching .start disables the .pth import line
    import autoalloc._startup

    assert pkgutil.resolve_name(data.decode().strip()) is autoalloc._startup.main


def _run_pth_line(tmp_path: Path, with_package: bool) -> subprocess.CompletedProcess[str]:
    """Process a copy of the .pth with ``site.addsitedir`` in ``python -S`` (no installed hook)."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    (site_dir / PTH.name).write_bytes(PTH.read_bytes())
    code = (
        "import sys, site\n"
        f"sys.path[:] = [p for p in sys.path if 'site-packages' not in p and p != {str(REPO)!r}]\n"
        + (f"sys.path.append({str(REPO)!r})\n" if with_package else "")
        + f"site.addsitedir({str(site_dir)!r})\n"
        + f"print({WATCHERS}, 'autoalloc._startup' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTOALLOC_"))}
    return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)


def test_pth_line_arms_the_watcher_when_the_package_is_there(tmp_path: Path) -> None:
    result = _run_pth_line(tmp_path, with_package=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "1 True\n", "")


def test_pth_line_does_nothing_without_the_package(tmp_path: Path) -> None:
    result = _run_pth_line(tmp_path, with_package=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "0 False\n", "")


def test_pth_line_twice_arms_one_watcher(tmp_path: Path) -> None:
    """venvs process site-packages twice (cpython#75723): the line runs twice, one watcher."""
    line = PTH.read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTOALLOC_"))}
    code = f"import sys\nsys.path.insert(0, {str(REPO)!r})\n{line}{line}print({WATCHERS})\n"
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "1\n", "")


def test_startup_module_imports_only_what_the_interpreter_has_loaded() -> None:
    """_startup runs in every process: it imports nothing beyond os and sys (loaded by site already)."""
    source = (REPO / "autoalloc" / "_startup.py").read_text()
    top_level = re.findall(r"^(?:import|from)\s+([\w.]+)", source, flags=re.M)
    assert set(top_level) <= {"os", "sys"}
    code = (
        "import os, sys; before = set(sys.modules); import autoalloc._startup as s; s.main(); "
        "print(sorted(set(sys.modules) - before))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTOALLOC_"))}
    result = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}"],
        capture_output=True, text=True, env=env,
    )
    assert result.stdout.strip() == "['autoalloc', 'autoalloc._startup']", result.stderr
