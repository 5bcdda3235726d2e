"""Who am I: turn the interpreter's command line into the program being run.

``parse(argv, cwd)`` is a pure function of the full interpreter command line
(``sys.orig_argv``): it skips the interpreter's own options and tells a script, a
``-m`` module, a console script, ``-c`` code, stdin or the REPL apart.
``current()`` reads the command line of this process. Wrappers (profilers, debuggers,
launchers) are taken off by ``wrappers.unwrap``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Literal

from autoalloc.records import record

Kind = Literal["script", "module", "command", "code", "stdin", "repl", "unknown"]

# Interpreter options that consume the next argument when their value is not attached.
_SHORT_WITH_VALUE = frozenset("WX")
_LONG_WITH_VALUE = frozenset({"--check-hash-based-pycs"})
_SCRIPT_SUFFIXES = (".py", ".pyw", ".pyc", ".pyz")
_WRAPPER_SUFFIXES = ("-script.pyw", "-script.py", ".exe")


@record(frozen=True)
class EntryPoint:
    """The program a Python process runs.

    ``kind`` is one of ``script``, ``module``, ``command`` (a console-script wrapper or
    another extension-less executable script), ``code`` (``-c``), ``stdin``, ``repl`` or
    ``unknown``. ``target`` is the absolute script path, the module name, the command's
    basename or ``""``; ``args`` are the program's own arguments.
    """

    kind: Kind
    target: str = ""
    args: tuple[str, ...] = ()
    path: str = ""  # for scripts and commands: the absolute path as given (symlinks kept)
    realpath: str = ""  # the same with symlinks resolved

    def describe(self) -> str:
        if self.kind in ("script", "command", "module"):
            return f"{self.kind} {self.target}"
        return self.kind


def program(path: str, args: Sequence[str], cwd: str | None) -> EntryPoint:
    """The entry point of running the file ``path``: a script, a directory or a command."""
    given = os.path.join(cwd, path) if cwd and not os.path.isabs(path) else path
    absolute = os.path.normpath(given)
    try:
        real = os.path.realpath(absolute)
    except (OSError, ValueError):
        real = absolute
    base = os.path.basename(absolute)
    lower = base.lower()
    script = lower.endswith(_SCRIPT_SUFFIXES) and not lower.endswith(_WRAPPER_SUFFIXES)
    if script or os.path.isdir(absolute):  # `python pkgdir` runs pkgdir/__main__.py
        return EntryPoint("script", absolute, tuple(args), path=absolute, realpath=real)
    for suffix in _WRAPPER_SUFFIXES:
        if lower.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return EntryPoint("command", base, tuple(args), path=absolute, realpath=real)


def parse(argv: Sequence[str], cwd: str | None = None, stdin_isatty: bool = False) -> EntryPoint:
    """Classify a full interpreter command line (``[python, *options, target, *args]``)."""
    if not argv:
        return EntryPoint("unknown")
    i = 1
    n = len(argv)
    while i < n:
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg == "-" or not arg.startswith("-"):
            break
        if arg.startswith("--"):
            i += 2 if arg in _LONG_WITH_VALUE else 1
            continue
        j = 1
        while j < len(arg):
            flag = arg[j]
            attached = arg[j + 1 :]
            if flag in "cm":
                if attached:
                    value, rest = attached, argv[i + 1 :]
                elif i + 1 < n:
                    value, rest = argv[i + 1], argv[i + 2 :]
                else:
                    return EntryPoint("unknown")
                if flag == "c":
                    return EntryPoint("code", "", tuple(rest))
                return EntryPoint("module", value, tuple(rest))
            if flag in _SHORT_WITH_VALUE:
                if not attached:
                    i += 1  # the value is the next argument
                break
            j += 1
        i += 1
    if i >= n:
        return EntryPoint("repl" if stdin_isatty else "stdin")
    if argv[i] == "-":
        return EntryPoint("stdin", "", tuple(argv[i + 1 :]))
    return program(argv[i], argv[i + 1 :], cwd)


def _strings(value: object) -> list[str] | None:
    if not isinstance(value, (list, tuple)):
        return None
    return [a for a in value if isinstance(a, str)]


def _is_python_process() -> bool:
    """Whether this process's executable is the interpreter (not a program embedding it)."""
    try:
        return bool(sys.executable) and os.path.samefile("/proc/self/exe", sys.executable)
    except (OSError, ValueError):
        return False


def command_line() -> list[str]:
    """This process's full command line: ``sys.orig_argv``, ``/proc/self/cmdline``, ``sys.argv``.

    An embedded interpreter has an empty ``sys.orig_argv`` (3.10+) and a host program's
    ``/proc/self/cmdline``, which is not a Python command line: then only ``sys.argv``
    counts. Whatever a program did to ``sys.argv`` (deleted it, filled it with
    non-strings), this returns a list of strings.
    """
    orig = _strings(getattr(sys, "orig_argv", None))
    if orig:
        return orig
    if not hasattr(sys, "orig_argv") and _is_python_process():  # Python 3.9 on Linux
        try:
            with open("/proc/self/cmdline", "rb") as f:
                raw = f.read(1 << 20)
            if raw:
                enc = sys.getfilesystemencoding()
                return [a.decode(enc, "surrogateescape") for a in raw.rstrip(b"\0").split(b"\0")]
        except (OSError, LookupError):
            pass
    python = sys.executable if isinstance(sys.executable, str) and sys.executable else "python"
    argv = _strings(getattr(sys, "argv", None)) or []
    if not argv or not argv[0]:  # no program name: stdin, or an embedding application
        return [python]
    return [python, *argv]


def current_cwd() -> str | None:
    """The working directory, or None when it was deleted or is unreadable."""
    try:
        return os.getcwd()
    except OSError:
        return None


def current() -> EntryPoint:
    """The entry point of this process."""
    try:
        isatty = os.isatty(0)
    except OSError:
        isatty = False
    return parse(command_line(), current_cwd(), isatty)
