"""Hostile environments: whatever the process finds around it, the hook never harms it.

Each test starts real interpreters of the test venv (hook installed, real torch 2.13): a
script that matches the built-in ``nemo-asr-train`` rule and, where it matters, one that
matches nothing. The deleted working directory, an unset or bogus ``HOME``, policy files
that are directories, symlink loops, FIFOs or 100 MB sparse files, a read-only file system
without ``__pycache__``, the interpreter flags ``-I -E -S -s``, ``-W error``, a missing or
odd ``sys.argv``, an interpreter embedded in a C program, the hook run twice, and the
package removed while its ``.pth`` stays (on every CPython 3.9-3.13 found).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import (
    ES,
    NEMO,
    PROBE,
    PY,
    REPO,
    Sandbox,
    assert_applied,
    assert_untouched,
    autoalloc_warnings,
    probe_result,
)

PLAIN = "tools/plain_tool.py"  # matches no rule
WATCHERS = "import sys; print(sum(bool(getattr(f, 'autoalloc_watcher', False)) for f in sys.meta_path))"




def scripts(sandbox: Sandbox) -> tuple[Path, Path]:
    return sandbox.script(NEMO), sandbox.script(PLAIN)


# -- the working directory, HOME ----------------------------------------------------------------


def test_deleted_working_directory(sandbox: Sandbox) -> None:
    """The hook decides as usual, and the process ends exactly as it does without autoalloc.

    torch 2.13 (CPU) itself cannot be imported from a deleted directory (oneMKL: "Cannot load
    libtorch_cpu.so", exit 2), so the decision is read from the ``AUTOALLOC_DEBUG`` trace, and
    exit code, stdout and the rest of stderr are compared with ``AUTOALLOC_DISABLE=1``.
    """
    nemo, plain = scripts(sandbox)
    gone = sandbox.root / "gone"
    cases = [
        ([str(nemo)], f"autoalloc: script {nemo}: apply rule nemo-asr-train"),
        ([str(plain)], f"autoalloc: script {plain}: none"),
        (["-c", PROBE], "autoalloc: code: none"),  # -c finds its project from the working directory: none
    ]
    for args, decided in cases:
        outcomes = []
        for env in ({"AUTOALLOC_DEBUG": "1"}, {"AUTOALLOC_DISABLE": "1"}):
            gone.mkdir()
            result = sandbox.run(
                ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone), PY, *args], python="", env=env
            )
            assert "Traceback" not in result.stderr, result.stderr
            outcomes.append(result)
        hooked, plain_run = outcomes
        trace = [line for line in hooked.stderr.splitlines(keepends=True) if line.startswith("autoalloc: ")]
        assert any(line.startswith(decided) for line in trace), hooked.stderr
        assert not any("internal error" in line for line in trace), hooked.stderr
        rest = "".join(line for line in hooked.stderr.splitlines(keepends=True) if line not in trace)
        assert (hooked.returncode, hooked.stdout, rest) == (plain_run.returncode, plain_run.stdout, plain_run.stderr)


@pytest.mark.parametrize(
    "home",
    # Unset in the quick run (in process: test_untrusted's no-home test); the rest with --full.
    [
        pytest.param(None, id="unset"),
        pytest.param("/nonexistent/home", id="nowhere", marks=pytest.mark.slow),
        pytest.param("/etc/hostname", id="a-file", marks=pytest.mark.slow),
        pytest.param("", id="empty", marks=pytest.mark.slow),
    ],
)
def test_home_unset_or_bogus(sandbox: Sandbox, home: str | None, full: bool) -> None:
    nemo, plain = scripts(sandbox)
    env = {"HOME": home, "XDG_CONFIG_HOME": None, "XDG_CONFIG_DIRS": None}
    result = sandbox.run([str(nemo)], env=env)
    assert_applied(result, "nemo-asr-train")
    assert result.stderr == ""
    if home is None and full:  # and a process no rule matches stays untouched
        result = sandbox.run([str(plain)], env=env)
        assert_untouched(result)
        assert result.stderr == ""


# -- policy files that cannot be read -----------------------------------------------------------


def unreadable(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "directory":
        path.mkdir()
        (path / "config.toml").write_text("enabled = false\n")
    elif kind == "symlink-loop":
        path.symlink_to(path.name)
    elif kind == "fifo":  # opening it for reading would block until a writer comes: none will
        os.mkfifo(path)
    elif kind == "sparse-100MB":
        with open(path, "wb") as f:
            f.write(b"enabled = false\n")
            f.truncate(100 * 1024 * 1024)
    else:
        raise AssertionError(kind)


# Every kind with --full; how each kind is refused is checked in process in the quick run
# (test_policy, the two hook tests below: a FIFO is never opened).
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("directory", marks=pytest.mark.slow),
        pytest.param("symlink-loop", marks=pytest.mark.slow),
        pytest.param("fifo", marks=pytest.mark.slow),  # as the others: rarely met
        pytest.param("sparse-100MB", marks=pytest.mark.slow),
    ],
)
def test_unreadable_policy_files_in_every_layer(sandbox: Sandbox, kind: str) -> None:
    """Site, user, project and AUTOALLOC_CONFIG files of this kind: one warning each, the process runs on."""
    nemo, plain = scripts(sandbox)
    env_file = sandbox.root / "env-policy.toml"
    files = [sandbox.site_config, sandbox.user_config, sandbox.work / "NeMo" / "autoalloc.toml", env_file]
    for path in files:
        unreadable(path, kind)
    result = sandbox.run([str(nemo)], env={"AUTOALLOC_CONFIG": str(env_file)}, timeout=120)
    assert_applied(result, "nemo-asr-train")
    warnings = autoalloc_warnings(result.stderr)
    assert len(warnings) == len(files), result.stderr
    for path, warning in zip(files, warnings):
        assert str(path) in warning
    # The non-matching script reads the same files (its project is the sandbox) and says nothing else.
    (sandbox.work / "autoalloc.toml").symlink_to(files[2])
    result = sandbox.run([str(plain)], env={"AUTOALLOC_CONFIG": str(env_file)}, timeout=120)
    assert_untouched(result)
    assert len(autoalloc_warnings(result.stderr)) == len(files), result.stderr


@pytest.mark.hook
def test_oversized_file_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoalloc import sources

    sparse = tmp_path / "autoalloc.toml"
    unreadable(sparse, "sparse-100MB")
    read = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(n) or real_read(fd, n))
    with pytest.raises(sources.LayerError, match="larger than 1024 KiB"):
        sources.read_file(str(sparse))
    assert read == []
    # A file that claims a small size is still read at most MAX_BYTES + 1 bytes.
    data, st = sources.read_file("/proc/self/status")
    assert 0 < len(data) <= sources.MAX_BYTES and st.st_size == 0
    assert all(n <= sources.MAX_BYTES + 1 for n in read)


@pytest.mark.hook
def test_fifo_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoalloc import sources

    fifo = tmp_path / "autoalloc.toml"
    os.mkfifo(fifo)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    with pytest.raises(sources.LayerError, match="not a regular file"):
        sources.read_file(str(fifo))
    assert opened == []


# -- read-only file system ----------------------------------------------------------------------


def _can_bind_read_only(tmp: Path) -> bool:
    probe = tmp / "ro-probe"
    probe.mkdir()
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{probe}" "{probe}" && ! touch "{probe}/x" 2>/dev/null'],
        capture_output=True,
    )
    return result.returncode == 0


@pytest.mark.slow  # a hostile set-up rarely met: the full run
def test_read_only_file_system_without_pycache(sandbox: Sandbox) -> None:
    """Package and project on a read-only mount, no ``__pycache__``: the hook compiles in memory and works."""
    if shutil.which("unshare") is None or not _can_bind_read_only(sandbox.root):
        pytest.skip("no mount namespace with a read-only bind mount here")
    ro = sandbox.root / "ro"
    shutil.copytree(REPO / "autoalloc", ro / "autoalloc", ignore=shutil.ignore_patterns("__pycache__"))
    nemo = sandbox.script(NEMO, body="import autoalloc as _a; print('FROM', _a.__file__)\n")
    sandbox.write("NeMo/autoalloc.toml", "[allocator]\ngarbage_collection_threshold = 0.5\n")
    mounts = " && ".join(f'mount --bind -o ro "{d}" "{d}"' for d in (ro, sandbox.work))
    for extra in ({}, {"PYTHONDONTWRITEBYTECODE": "1"}):
        env = {"PYTHONPATH": str(ro), **extra}  # found before site-packages: the .pth imports this copy
        result = sandbox.run(["unshare", "-m", "sh", "-c", f'{mounts} && exec "$0" "$1"', PY, str(nemo)], python="", env=env)
        assert result.returncode == 0, result.stderr
        assert f"FROM {ro / 'autoalloc' / '__init__.py'}" in result.stdout
        probe = probe_result(result.stdout)
        assert probe["getter"] == f"{ES},garbage_collection_threshold:0.5"
        assert result.stderr == ""
    assert not list(ro.rglob("__pycache__")) and not list(sandbox.work.rglob("__pycache__"))


# -- interpreter flags --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "hooked"),
    # -I end to end in the quick run: test_e2e_core::test_isolated_mode_is_respected
    [pytest.param("-I", False, marks=pytest.mark.slow), ("-E", True), ("-S", False),
     pytest.param("-s", True, marks=pytest.mark.slow)],  # like -E: the hook works
)
def test_interpreter_flags(sandbox: Sandbox, flag: str, hooked: bool) -> None:
    """``-I``: the hook returns at once; ``-S``: site (and so the hook) never runs; ``-E``, ``-s``: it works."""
    nemo, _ = scripts(sandbox)
    watchers = sandbox.run([flag, "-c", WATCHERS])
    assert watchers.returncode == 0 and watchers.stderr == ""
    assert watchers.stdout.strip() == ("1" if hooked else "0")
    loaded = sandbox.run([flag, "-c", "import sys; print('_autoalloc_startup' in sys.modules)"])
    assert loaded.stdout.strip() == str(flag != "-S")  # -I: imported, returned at once
    if flag == "-S":  # no site-packages at all: torch is not importable, nothing to probe
        return
    result = sandbox.run([flag, str(nemo)])
    (assert_applied if hooked else assert_untouched)(result)
    assert result.stderr == ""


def test_warnings_as_errors_and_ignored(sandbox: Sandbox) -> None:
    """A bad policy file under ``-W error`` warns nothing fatal; under ``-W ignore:autoalloc``
    it is silent (each filter the docs show is checked against the warning in test_docs)."""
    nemo, _ = scripts(sandbox)
    sandbox.user_policy("enabled = maybe\n")
    result = sandbox.run(["-W", "error", str(nemo)])
    assert_applied(result, "nemo-asr-train")
    result = sandbox.run(["-W", "ignore:autoalloc", str(nemo)])  # by message: works from the start
    assert_applied(result, "nemo-asr-train")
    assert result.stderr == ""


@pytest.mark.slow  # more filters: the docs' own forms are checked in test_docs
def test_other_warning_filters(sandbox: Sandbox) -> None:
    """By category (not what the docs show): Python drops the option at startup (it cannot
    import autoalloc before site runs, and says so), autoalloc applies it when it warns."""
    nemo, _ = scripts(sandbox)
    sandbox.user_policy("enabled = maybe\n")
    result = sandbox.run(["-W", "ignore::autoalloc.AutoallocWarning", str(nemo)])
    assert_applied(result, "nemo-asr-train")
    assert autoalloc_warnings(result.stderr) == []
    result = sandbox.run([str(nemo)], env={"PYTHONWARNINGS": "ignore"})
    assert_applied(result, "nemo-asr-train")
    assert result.stderr == ""


def test_closed_standard_streams(sandbox: Sandbox) -> None:
    """No stdin, no stdout, no stderr: the matching script still gets its options (it reports to a file)."""
    out = sandbox.root / "probe.out"
    nemo = sandbox.script(NEMO, body=f"import sys\nsys.stdout = open({str(out)!r}, 'w')\n")
    sandbox.user_policy("enabled = maybe\n")  # a warning to write to the closed stderr
    result = sandbox.run(["sh", "-c", 'exec "$0" "$1" <&- >&- 2>&-', PY, str(nemo)], python="")
    assert result.returncode == 0
    probe = probe_result(out.read_text())
    assert probe["getter"] == ES


# -- sys.argv and embedding ---------------------------------------------------------------------


# Each odd value is classified in process (test_command_line_survives_odd_sys_values below);
# through an interpreter, all with --full.
@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param("del sys.argv", marks=pytest.mark.slow),
        pytest.param("sys.argv = None", marks=pytest.mark.slow),
        pytest.param("sys.argv = [None, 3, b'x']", marks=pytest.mark.slow),
        pytest.param("sys.argv = 'train.py'", marks=pytest.mark.slow),
        pytest.param("sys.argv = []", marks=pytest.mark.slow),
        pytest.param("del sys.orig_argv; del sys.argv", marks=pytest.mark.slow),
    ],
)
def test_missing_or_odd_argv(sandbox: Sandbox, mangle: str) -> None:
    """What a program (or an embedding application) does to ``sys.argv`` before ``import torch``."""
    if "orig_argv" in mangle and sys.version_info < (3, 10):
        pytest.skip("no sys.orig_argv before 3.10")
    code = f"import sys\n{mangle}\n{PROBE}"
    result = sandbox.run(["-c", code], env={"AUTOALLOC_DEBUG": "1"})
    assert_untouched(result)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert "autoalloc: code: none" in result.stderr or "autoalloc: stdin: none" in result.stderr, result.stderr
    # A matching script that rewrites its argv is still recognised from the interpreter's command line.
    if mangle.startswith("del"):
        nemo = sandbox.script(NEMO, body=f"import sys\n{mangle}\n")
        assert_applied(sandbox.run([str(nemo)]), "nemo-asr-train")


EMBED_C = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
int main(int argc, char **argv) {
    PyStatus status;
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    /* the venv's interpreter path: pyvenv.cfg is found and site-packages (with the hook) used */
    /* argv[1] is a decoy: the host's command line must not be read as a Python one */
    status = PyConfig_SetBytesString(&config, &config.program_name, argv[2]);
    if (PyStatus_Exception(status)) return 2;
    status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) return 3;
    FILE *f = fopen(argv[3], "r");
    if (!f) return 4;
    int rc = PyRun_SimpleFile(f, argv[3]);
    fclose(f);
    if (Py_FinalizeEx() < 0) return 5;
    return rc == 0 ? 0 : 6;
}
"""


def test_embedded_interpreter(sandbox: Sandbox) -> None:
    """A C program embedding Python: the host's own command line (here one that looks like a
    matching ``python NeMo/...`` call) must not be taken for the interpreter's."""
    cc = shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    libdir = sysconfig.get_config_var("LIBDIR")
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    if not cc or not sysconfig.get_config_var("Py_ENABLE_SHARED") or not (Path(include) / "Python.h").exists():
        pytest.skip("needs a C compiler and a shared libpython")
    source = sandbox.write(sandbox.root / "embed.c", EMBED_C, base=Path("/"))
    exe = sandbox.root / "embed"
    lib = ldlib.removeprefix("lib").split(".so")[0]
    build = subprocess.run(
        [cc, str(source), "-o", str(exe), f"-I{include}", f"-L{libdir}", f"-l{lib}", f"-Wl,-rpath,{libdir}"],
        capture_output=True, text=True,
    )
    assert build.returncode == 0, build.stderr
    nemo, _ = scripts(sandbox)
    probe = sandbox.write(sandbox.root / "embedded_probe.py", "import sys\nprint('ARGV', sys.argv)\n" + PROBE, base=Path("/"))
    # The host's /proc/self/cmdline reads like "python <the NeMo trainer> ...", a matching command line.
    result = sandbox.run([str(exe), str(nemo), PY, str(probe)], python="", env={"AUTOALLOC_DEBUG": "1"})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "ARGV ['']" in result.stdout
    assert "autoalloc: stdin: none" in result.stderr, result.stderr  # the hook ran, and decided for itself
    assert probe_result(result.stdout)["getter"] == ""


# -- the hook itself: twice, or gone ------------------------------------------------------------


@pytest.mark.slow  # a hostile set-up rarely met: the full run
def test_hook_run_twice_arms_one_watcher(sandbox: Sandbox) -> None:
    result = sandbox.run(["-c", "import autoalloc._startup as s; s.main(); s.main(); " + WATCHERS])
    assert result.stdout.strip() == "1" and result.stderr == ""
    nemo = sandbox.script(NEMO, body="import autoalloc._startup as s\ns.main(); s.main()\n")
    bad = sandbox.user_policy("enabled = maybe\n")  # one warning: printed once, not once per main()
    result = sandbox.run([str(nemo)])
    assert_applied(result, "nemo-asr-train")
    assert len(autoalloc_warnings(result.stderr)) == 1
    bad.unlink()
    # After torch is imported, main() arms nothing new.
    result = sandbox.run(["-c", f"import torch, autoalloc._startup as s; {WATCHERS}; s.main(); {WATCHERS}"])
    before, after = result.stdout.split()
    assert before == after and result.stderr == ""


def _runs(exe: str | None) -> bool:
    if not exe:
        return False
    try:
        return subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def find_python(minor: int) -> str | None:
    """CPython 3.<minor>: pyenv's first (its shims fail unless a version is selected), then PATH."""
    if minor == sys.version_info.minor:
        return sys.executable
    pyenv = Path(os.path.expanduser("~/.pyenv/versions"))
    candidates = sorted(pyenv.glob(f"3.{minor}.*/bin/python3.{minor}"), reverse=True)
    which = shutil.which(f"python3.{minor}")
    return next((str(c) for c in [*candidates, which] if _runs(c and str(c))), None)


def _minors() -> list:
    """3.9-3.13; the quick run keeps this interpreter's, the others run with --full."""
    here = sys.version_info.minor
    marks = {minor: () if minor == here else pytest.mark.slow for minor in range(9, 14)}
    return [pytest.param(minor, id=f"3.{minor}", marks=mark) for minor, mark in marks.items()]


@pytest.mark.parametrize("minor", _minors())
def test_pth_left_behind_after_uninstall(tmp_path: Path, minor: int) -> None:
    """The package gone, its ``.pth`` left in site-packages: every start prints nothing, exits 0."""
    python = find_python(minor)
    if python is None:
        pytest.skip(f"python3.{minor} is not installed")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    shutil.copy(REPO / "autoalloc.pth", Path(purelib) / "autoalloc.pth")
    shutil.copy(REPO / "autoalloc.start", Path(purelib) / "autoalloc.start")
    # An empty leftover directory (pip can leave one behind) must not count as the package either.
    (Path(purelib) / "autoalloc" / "__pycache__").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTOALLOC_"))}
    for args, stdin in ((["-c", "pass"], None), (["-c", "import sys; sys.exit(0)"], None), (["-"], "x = 1\n"),
                        (["-c", "import sys; assert 'autoalloc' not in sys.modules, sys.modules['autoalloc']"], None)):
        result = subprocess.run([str(py), *args], input=stdin, capture_output=True, text=True, env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), args
    # Control: with the package next to it, the same .pth does arm the watcher.
    shutil.rmtree(Path(purelib) / "autoalloc")
    shutil.copytree(REPO / "autoalloc", Path(purelib) / "autoalloc", ignore=shutil.ignore_patterns("__pycache__"))
    # and the top-level copies of the startup modules, as the wheel has them
    shutil.copy(REPO / "autoalloc" / "_startup.py", Path(purelib) / "_autoalloc_startup.py")
    shutil.copy(REPO / "autoalloc" / "_loader.py", Path(purelib) / "_autoalloc_loader.py")
    result = subprocess.run([str(py), "-c", WATCHERS], capture_output=True, text=True, env=env, cwd=tmp_path)
    # arming needs nothing but the stdlib (platformdirs and tomli are needed only at `import torch`)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "1", "")


@pytest.mark.hook
@pytest.mark.parametrize(
    ("orig", "argv", "expected"),
    [
        (None, None, None),  # both missing: /proc/self/cmdline where this is the interpreter
        ([], [""], ["PY"]),  # embedded: orig_argv empty, never the host's /proc/self/cmdline
        ([], ["train.py", 3, None], ["PY", "train.py"]),
        ([], "train.py", ["PY"]),
        (["py", b"-c", "-c", "x"], None, ["py", "-c", "x"]),
        ((), (), ["PY"]),
    ],
)
def test_command_line_survives_odd_sys_values(monkeypatch: pytest.MonkeyPatch, orig, argv, expected) -> None:
    from autoalloc import entrypoint

    for name, value in (("orig_argv", orig), ("argv", argv)):
        if value is None:
            monkeypatch.delattr(sys, name, raising=False)
        else:
            monkeypatch.setattr(sys, name, value, raising=False)
    line = entrypoint.command_line()
    assert all(isinstance(a, str) for a in line)
    if expected is None:  # read from /proc/self/cmdline: this very pytest process
        with open("/proc/self/cmdline", "rb") as f:
            assert line == [os.fsdecode(a) for a in f.read().rstrip(b"\0").split(b"\0")]
    else:
        assert line == [sys.executable if a == "PY" else a for a in expected]
    entrypoint.current()  # and the classification never raises
