"""Unwrap profilers, debuggers, coverage and launchers to the program they run.

``python -m cProfile train.py``, ``coverage run -m pkg.train`` or ``torchrun train.py`` run
another program, in this process or in workers that inherit its environment; autoalloc
decides for that program, so a profiled run gets what the real run gets and a launcher
decides once for all its ranks. Which programs wrap others, and their option grammar, is
data: ``wrappers.toml`` beside this module and the ``[[wrappers]]`` tables of policy files.
``validate`` turns one TOML table into a ``Wrapper``; ``unwrap`` is a pure function of an
entry point, a table and (for ``runpy.run_path``) the ``sys.argv`` the program set.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Optional

from autoalloc.entrypoint import EntryPoint, parse, program

ProgramKind = Literal["python", "command"]
Mode = Literal["script", "module", "code", "command"]

BUILTIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrappers.toml")
MAX_DEPTH = 8  # `coverage run -m torch.distributed.run ... train.py` is two; more is a loop
_LISTS = (
    "modules", "commands", "scripts", "subcommands", "value_options", "flag_options",
    "module_options", "code_options", "command_options", "no_program", "separators",
)
_FLAGS = ("launcher", "options_take_value", "split_at_separator", "after_separator")
_KEYS = frozenset({"name", "description", "program", *_LISTS, *_FLAGS})
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}\Z")
_PYTHON_RE = re.compile(r"python[0-9.]*(\.exe)?\Z")
_MAX_LIST = 1000
_MAX_STR = 4096


class WrapperError(ValueError):
    """A ``[[wrappers]]`` table that cannot be used; the message names the key."""


@dataclass(frozen=True)
class Wrapper:
    """One program that runs another, and the grammar of its command line (see wrappers.toml)."""

    name: str
    layer: str = "builtin"
    description: str = ""
    launcher: bool = False
    modules: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()
    subcommands: tuple[str, ...] = ()
    value_options: tuple[str, ...] = ()
    flag_options: tuple[str, ...] = ()
    options_take_value: bool = False
    module_options: tuple[str, ...] = ()
    code_options: tuple[str, ...] = ()
    command_options: tuple[str, ...] = ()
    no_program: tuple[str, ...] = ()
    separators: tuple[str, ...] = ("--",)
    split_at_separator: bool = False
    after_separator: bool = False
    program: ProgramKind = "python"

    def runs(self, entry: EntryPoint) -> bool:
        """Whether ``entry`` is this wrapper."""
        if entry.kind == "module":
            return entry.target in self.modules
        if entry.kind == "command" and entry.target in self.commands:
            return True
        if entry.kind in ("script", "command") and self.scripts:
            paths = [p for p in (entry.path, entry.realpath) if p]
            return any(_path_ends(p, s) for p in paths for s in self.scripts)
        return False


def _path_ends(path: str, suffix: str) -> bool:
    path = path.replace(os.sep, "/").rstrip("/")
    return path == suffix or path.endswith("/" + suffix.strip("/"))


def _str_list(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > _MAX_LIST:
        raise WrapperError(f"{where} must be a list of strings")
    if not all(isinstance(v, str) and v and len(v) <= _MAX_STR for v in value):
        raise WrapperError(f"{where} must be a list of non-empty strings")
    return tuple(value)


def validate(data: object, where: str, layer: str) -> Wrapper:
    """One ``[[wrappers]]`` table, checked; raises WrapperError naming the key."""
    if not isinstance(data, dict):
        raise WrapperError(f"{where} must be a table")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise WrapperError(f"{where}: name must be letters, digits, '-', '_' or '.' (at most 100)")
    where = f'{where} ("{name}")'
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        from autoalloc.messages import did_you_mean

        hint = did_you_mean(unknown[0], _KEYS)
        raise WrapperError(f"{where}: unknown key {unknown[0]!r}{hint}")
    fields: dict = {k: _str_list(data[k], f"{where}: {k}") for k in _LISTS if k in data}
    for key in _FLAGS:
        if key in data and not isinstance(data[key], bool):
            raise WrapperError(f"{where}: {key} must be true or false")
        fields[key] = data.get(key, False)
    if data.get("program", "python") not in ("python", "command"):
        raise WrapperError(f"{where}: program must be 'python' or 'command'")
    description = data.get("description", "")
    if not isinstance(description, str) or len(description) > _MAX_STR:
        raise WrapperError(f"{where}: description must be a string")
    if not any(fields.get(k) for k in ("modules", "commands", "scripts")):
        raise WrapperError(f"{where} needs at least one of modules, commands, scripts")
    return Wrapper(name, layer, description, program=data.get("program", "python"), **fields)


def validate_all(data: object, layer: str) -> tuple[Wrapper, ...]:
    """The ``wrappers`` array of a policy file; raises WrapperError."""
    if not isinstance(data, list) or len(data) > _MAX_LIST:
        raise WrapperError("wrappers must be an array of tables ([[wrappers]])")
    table = tuple(validate(item, f"wrapper {i + 1}", layer) for i, item in enumerate(data))
    names = [w.name for w in table]
    for name in names:
        if names.count(name) > 1:
            raise WrapperError(f"two wrappers are named {name!r}")
    return table


@functools.lru_cache(maxsize=1)
def builtin() -> tuple[Wrapper, ...]:
    """The built-in table (``wrappers.toml``); empty if it cannot be read, which never happens
    in an intact installation and must not stop the decision."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - older interpreters in CI
        import tomli as tomllib
    try:
        with open(BUILTIN_PATH, "rb") as f:
            return validate_all(tomllib.load(f).get("wrappers", []), "builtin")
    except (OSError, ValueError):
        return ()


@functools.lru_cache(maxsize=1)
def _builtin_text() -> str:
    try:
        with open(BUILTIN_PATH, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError):
        return ""


def may_wrap(entry: EntryPoint) -> bool:
    """Whether a built-in wrapper could be ``entry``: its module, command or file name is
    quoted in the table. Most programs are not wrappers, and reading the text is much
    cheaper than parsing the table, which ``builtin()`` does only when this says so."""
    if entry.kind in ("module", "command"):
        name = entry.target
    elif entry.kind == "script":
        name = os.path.basename(entry.path.rstrip("/"))
    else:
        return False
    text = _builtin_text()
    return bool(name) and (f'"{name}"' in text or f'/{name}"' in text)


# ---------------------------------------------------------------- the grammar


def _listed(name: str, options: Sequence[str]) -> bool:
    return any(name == o or (o.endswith("*") and name.startswith(o[:-1])) for o in options)


def _known(wrapper: Wrapper) -> tuple[str, ...]:
    return (
        *wrapper.value_options, *wrapper.flag_options, *wrapper.module_options,
        *wrapper.code_options, *wrapper.command_options, *wrapper.no_program,
    )


def _attached(arg: str, options: Sequence[str]) -> str | None:
    """The value glued to a short option (``-mpkg.mod``, ``-oout.prof``), else None."""
    for option in options:
        if len(option) == 2 and option[0] == "-" and arg.startswith(option) and len(arg) > 2:
            return arg[2:]
    return None


def _start(wrapper: Wrapper, args: Sequence[str]) -> int | None:
    """Where the wrapper's options begin: after its subcommand (None: not a running subcommand)."""
    if not wrapper.subcommands:
        return 0
    best = None
    for sub in wrapper.subcommands:
        words = sub.split()
        if list(args[: len(words)]) == words and (best is None or len(words) > best):
            best = len(words)
    return best


def _target(mode: Mode, rest: Sequence[str], cwd: str | None) -> EntryPoint | None:
    if not rest:
        return None
    if mode == "module":
        return EntryPoint("module", rest[0], tuple(rest[1:]))
    if mode == "code":
        return EntryPoint("code", "", tuple(rest[1:]))
    if mode == "command" and _PYTHON_RE.match(os.path.basename(rest[0])):
        return parse(list(rest), cwd)
    if rest[0] == "-":
        return None
    return program(rest[0], rest[1:], cwd)


def _separated(
    wrapper: Wrapper, mode: Mode, rest: Sequence[str], cwd: str | None
) -> EntryPoint | None:
    """The program after a separator: ``-- train.py``, ``-- -m pkg.train``, ``-- -c CODE``."""
    for options, kind in ((wrapper.module_options, "module"), (wrapper.code_options, "code")):
        if rest and rest[0] in options:
            return _target(kind, rest[1:], cwd)  # type: ignore[arg-type]
        glued = _attached(rest[0], options) if rest else None
        if glued is not None:
            return _target(kind, [glued, *rest[1:]], cwd)  # type: ignore[arg-type]
    return _target(mode, rest, cwd)


def program_of(wrapper: Wrapper, args: Sequence[str], cwd: str | None) -> EntryPoint | None:
    """The program ``wrapper`` runs when started with ``args``, or None (no program: help,
    ``--pid`` attach, another subcommand)."""
    i = _start(wrapper, args)
    if i is None:
        return None
    mode: Mode = "command" if wrapper.program == "command" else "script"
    if wrapper.split_at_separator or wrapper.after_separator:
        cut = next((j for j in range(i, len(args)) if args[j] in wrapper.separators), None)
        if cut is not None:
            return _separated(wrapper, mode, args[cut + 1 :], cwd)
        if wrapper.after_separator:
            return None
    while i < len(args):
        arg = args[i]
        if arg in wrapper.separators:
            return _separated(wrapper, mode, args[i + 1 :], cwd)
        if not arg.startswith("-") or arg == "-":
            return _target(mode, args[i:], cwd)
        name, eq, value = arg.partition("=")
        if _listed(name, wrapper.no_program):
            return None
        for options, kind in ((wrapper.module_options, "module"), (wrapper.code_options, "code")):
            glued = value if eq and _listed(name, options) else _attached(arg, options)
            if glued is not None:
                return _target(kind, [glued, *args[i + 1 :]], cwd)  # type: ignore[arg-type]
            if _listed(name, options):
                mode = kind  # type: ignore[assignment]
        if _listed(name, wrapper.command_options):
            mode = "command"
        takes_value = _listed(name, wrapper.value_options) or (
            wrapper.options_take_value and not _listed(name, _known(wrapper))
        )
        if takes_value and not eq and _attached(arg, wrapper.value_options) is None:
            i += 1
        i += 1
    return None


# ---------------------------------------------------------------- unwrapping


@dataclass(frozen=True)
class Step:
    """One wrapper taken off: which, and the command line it was started with."""

    wrapper: Wrapper
    entry: EntryPoint


@dataclass(frozen=True)
class Unwrapped:
    """The program to decide for, and the wrappers around it (outermost first)."""

    entry: EntryPoint
    steps: tuple[Step, ...] = ()

    def launcher(self) -> Optional[Step]:
        """The outermost launcher, whose workers run the program."""
        return next((s for s in self.steps if s.wrapper.launcher), None)

    def describe(self) -> str:
        return " -> ".join([*(s.wrapper.name for s in self.steps), self.entry.describe()])


# The program replaced sys.argv[0] (runpy.run_path, or a wrapper the table does not know).
ARGV0 = Wrapper(
    "sys.argv", layer="runtime",
    description="sys.argv[0] names another script when torch is imported (runpy.run_path, %run)",
)


def _replaced_argv0(
    entry: EntryPoint, argv: Sequence[object] | None, cwd: str | None
) -> EntryPoint | None:
    """The script ``sys.argv[0]`` names when it is not the program the command line started.

    ``runpy.run_path`` and in-process wrappers set ``sys.argv[0]`` to the script they run
    before running it. A ``-m`` module is left alone: there ``sys.argv[0]`` is the module's
    file, which the command line does not name.
    """
    if entry.kind not in ("script", "command", "code", "stdin", "repl") or not argv:
        return None
    first = argv[0]
    if not isinstance(first, str) or not first.endswith((".py", ".pyw")):
        return None
    candidate = program(first, [a for a in argv[1:] if isinstance(a, str)], cwd)
    try:
        if not os.path.isfile(candidate.path):
            return None
        if entry.realpath and os.path.samefile(candidate.realpath, entry.realpath):
            return None
    except (OSError, ValueError):
        return None
    return candidate


def unwrap(
    entry: EntryPoint,
    table: Sequence[Wrapper],
    cwd: str | None,
    argv: Sequence[object] | None = None,
) -> Unwrapped:
    """The program ``entry`` runs once every wrapper in ``table`` is taken off.

    ``argv``: this process's ``sys.argv`` at the decision (None for a command line that
    has not started, as in ``explain``); a script it names in ``sys.argv[0]`` that is not
    the unwrapped program is the program (``runpy.run_path``).
    """
    steps: list[Step] = []
    for _ in range(MAX_DEPTH):
        wrapper = next((w for w in table if w.runs(entry)), None)
        inner = program_of(wrapper, entry.args, cwd) if wrapper is not None else None
        if wrapper is None or inner is None:
            break
        steps.append(Step(wrapper, entry))
        entry = inner
    if not any(s.wrapper.launcher for s in steps):  # a launcher's sys.argv is its own
        replaced = _replaced_argv0(entry, argv, cwd)
        if replaced is not None:
            steps.append(Step(ARGV0, entry))
            entry = replaced
    return Unwrapped(entry, tuple(steps))


def worker_argv(unwrapped: Unwrapped, python: str) -> list[str] | None:
    """For a launcher, the interpreter command line each worker gets (``python -u TARGET
    ARGS``), else None; None too when the workers are not Python programs."""
    if unwrapped.launcher() is None:
        return None
    entry = unwrapped.entry
    if entry.kind == "script":
        return [python, "-u", entry.path, *entry.args]
    if entry.kind == "module":
        return [python, "-u", "-m", entry.target, *entry.args]
    return None


def as_dict(unwrapped: Unwrapped) -> list[Mapping[str, object]]:
    """The wrappers taken off, outermost first, as plain data (for ``explain --json``)."""
    return [
        {"name": s.wrapper.name, "layer": s.wrapper.layer, "launcher": s.wrapper.launcher,
         "kind": s.entry.kind, "target": s.entry.target}
        for s in unwrapped.steps
    ]
