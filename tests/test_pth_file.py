"""The startup files themselves: what every Python process of the environment executes.

``autoalloc.pth`` must be one plain, auditable line (security scanners and EDR rules read
it; cf. the litellm ``.pth`` compromise): ASCII, LF, no BOM (a BOM makes Python <= 3.12
skip the line silently), no ``exec``/``eval``/encoded payload, starting with ``import `` (the
only lines ``site`` executes), and named so that it sorts after editable-install ``.pth``
files. Behaviour: with the package present it arms one watcher; without it, nothing.
The line loads ``_autoalloc_startup``, the wheel's top-level copy of ``autoalloc/_startup.py``
(one import instead of two), which arms itself when imported under that name, after checking
that the file lies beside the ``.pth`` (``sitedir``: the directory ``site.addpackage`` is
processing, in scope where it executes the line, on every Python that runs ``.pth`` import
lines for this package, 3.9 to 3.14; 3.15+ runs ``autoalloc.start`` instead). So a ``.pth``
left behind costs nothing and says nothing. (Asking the import system's path finder instead
cost ``python -c pass`` 1.34 M instructions against this line's 1.07 M, on Python 3.11.)
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.hook

PTH = REPO / "autoalloc.pth"
START = REPO / "autoalloc.start"
STARTUP = REPO / "autoalloc" / "_startup.py"
TOP_LEVEL = "_autoalloc_startup"  # the name the wheel gives the copy of STARTUP at its root
LOADER = REPO / "autoalloc" / "_loader.py"  # at the root as _autoalloc_loader
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
    # It names exactly the file it looks for beside itself and the module it imports.
    assert re.findall(r"""sitedir \+ "/([^"/]+)\.py"\)""", line) == [TOP_LEVEL]
    assert re.findall(r"""__import__\("([^"]+)"\)""", line) == [TOP_LEVEL]
    assert line.rstrip("\n").endswith(f'__import__("{TOP_LEVEL}")')  # and calls nothing


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


def test_start_file_names_the_same_entry_point(tmp_path: Path) -> None:
    data = START.read_bytes()
    assert data == f"{TOP_LEVEL}:main\n".encode()
    assert START.stem == PTH.stem  # PEP 829: a matching .start disables the .pth import line
    site_dir = _site_dir(tmp_path, top_level=True)
    entry = data.decode().strip()
    code = f"import pkgutil, sys\nsys.path.append({str(site_dir)!r})\n"
    code += f"print(pkgutil.resolve_name({entry!r}))"
    result = _python_s(code, tmp_path)
    assert result.stdout.startswith("<function main at "), result.stderr


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTOALLOC_"))}


def _python_s(code: str, cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``python -S`` (no installed hook) running ``code``."""
    argv = [sys.executable, "-S", *flags, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=cwd)


def _site_dir(tmp_path: Path, top_level: bool) -> Path:
    """A site-packages as a wheel leaves it: the .pth and (``top_level``) the startup module."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir(exist_ok=True)
    (site_dir / PTH.name).write_bytes(PTH.read_bytes())
    if top_level:
        (site_dir / f"{TOP_LEVEL}.py").write_bytes(STARTUP.read_bytes())
        (site_dir / "_autoalloc_loader.py").write_bytes(LOADER.read_bytes())
    return site_dir


def _run_pth_line(
    tmp_path: Path, top_level: bool, package: bool, flags: tuple[str, ...] = (), after: str = ""
) -> subprocess.CompletedProcess[str]:
    """Process a copy of the .pth with ``site.addsitedir`` in ``python -S`` (no installed hook).

    ``top_level``: the wheel's top-level startup module lies beside it; ``package``: the
    ``autoalloc`` package is importable (an editable install whose checkout was removed
    has the first without the second).
    """
    site_dir = _site_dir(tmp_path, top_level)
    elsewhere = tmp_path / "elsewhere"  # the package alone (the checkout has the top-level link)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "autoalloc", elsewhere / "autoalloc", ignore=ignore)
    code = (
        "import sys, site\n"
        f"sys.path[:] = [p for p in sys.path if 'site-packages' not in p and p != {str(REPO)!r}]\n"
        + (f"sys.path.append({str(elsewhere)!r})\n" if package else "")
        + f"site.addsitedir({str(site_dir)!r})\n"
        + after
        + f"print({WATCHERS}, {TOP_LEVEL!r} in sys.modules, 'autoalloc' in sys.modules)\n"
    )
    return _python_s(code, tmp_path, *flags)


def test_pth_line_arms_the_watcher_when_the_package_is_there(tmp_path: Path) -> None:
    result = _run_pth_line(tmp_path, top_level=True, package=True)
    # one module imported at start-up: not even the autoalloc package
    assert (result.returncode, result.stdout, result.stderr) == (0, "1 True False\n", "")


@pytest.mark.parametrize("package", [False, True], ids=["nothing-left", "package-elsewhere"])
def test_pth_line_does_nothing_without_its_module(tmp_path: Path, package: bool) -> None:
    """Only the .pth left behind: no error line, nothing imported, nothing armed."""
    result = _run_pth_line(tmp_path, top_level=False, package=package)
    assert (result.returncode, result.stdout, result.stderr) == (0, "0 False False\n", "")


def test_pth_line_is_silent_when_the_package_is_gone(tmp_path: Path) -> None:
    """An editable install whose checkout was removed: the module beside the .pth arms the
    watcher, and ``import torch`` (here: any import of the name) says nothing about it."""
    probe = "try:\n    import torch\nexcept ImportError:\n    pass\n"
    result = _run_pth_line(tmp_path, top_level=True, package=False, after=probe)
    assert (result.returncode, result.stdout, result.stderr) == (0, "1 True False\n", "")


def test_pth_line_in_isolated_mode_arms_nothing(tmp_path: Path) -> None:
    result = _run_pth_line(tmp_path, top_level=True, package=True, flags=("-I",))
    assert (result.returncode, result.stdout, result.stderr) == (0, "0 True False\n", "")


def test_pth_line_twice_arms_one_watcher(tmp_path: Path) -> None:
    """venvs process site-packages twice (cpython#75723): the line runs twice, one watcher."""
    site_dir = _site_dir(tmp_path, top_level=True)
    add = f"site.addsitedir({str(site_dir)!r})\n"
    code = f"import site, sys\n{add}{add}print({WATCHERS})\n"
    result = _python_s(code, tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "1\n", "")


def test_both_copies_of_the_startup_module_arm_one_watcher(tmp_path: Path) -> None:
    """The .pth's module and ``autoalloc._startup`` (the package's copy) share one watcher."""
    site_dir = _site_dir(tmp_path, top_level=True)
    code = (
        f"import sys\nsys.path[:0] = [{str(site_dir)!r}, {str(REPO)!r}]\n"
        f"import {TOP_LEVEL}, autoalloc._startup\n"
        f"{TOP_LEVEL}.main(); autoalloc._startup.main(); {TOP_LEVEL}.main()\nprint({WATCHERS})\n"
    )
    result = _python_s(code, tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "1\n", "")


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


def test_startup_module_imports_only_what_the_interpreter_has_loaded() -> None:
    """_startup runs in every process: it imports nothing beyond os and sys (loaded by site
    already), and ``_autoalloc_loader`` at the first lookup of a watched name; that imports
    nothing beyond them and _thread (built in, loaded by importlib's bootstrap before site
    runs) until a watched module executes (the hook, then)."""
    assert _imported(STARTUP) == {"os", "sys", "_autoalloc_loader"}
    assert _imported(LOADER) == {"os", "sys", "_thread", "autoalloc"}
    bare = subprocess.run(
        [sys.executable, "-S", "-I", "-c", "import sys; print('_thread' in sys.modules)"],
        capture_output=True, text=True, timeout=60,
    )
    assert bare.stdout.strip() == "True"  # there before any .pth runs, even without site
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


def test_startup_module_keeps_no_module_but_sys_in_its_globals() -> None:
    """The armed watcher keeps this module's globals alive until late shutdown: a global ``os``
    there makes every ``python -c pass`` pay for clearing ``os`` the slow way at exit."""
    import autoalloc._startup as startup

    modules = {k for k, v in vars(startup).items() if type(v) is type(sys)}
    assert modules <= {"sys"}
