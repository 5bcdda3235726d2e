"""Unwrap profilers, debuggers, coverage and launchers to the program they run.

``python -m cProfile train.py``, ``coverage run -m pkg.train`` or ``torchrun train.py`` run
another program, in this process or in workers that inherit its environment; autoalloc
decides for that program, so a profiled run gets what the real run gets and a launcher
decides once for all its ranks. Which programs wrap others, and their option grammar, is
data: ``wrappers.toml`` beside this module and the ``[[wrappers]]`` tables of policy files.
The schema of a ``[[wrappers]]`` table is declared in ``schema`` with the policy's; reading
``wrappers.toml`` is ``sources``' job. ``unwrap`` is a pure function of an entry point, a
table and (for ``runpy.run_path``) the ``sys.argv`` the program set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Literal, Optional

from autoalloc import globs
from autoalloc.entrypoint import EntryPoint, parse, program
from autoalloc.records import record

ProgramKind = Literal["python", "command"]
Mode = Literal["script", "module", "code", "command"]

MAX_DEPTH = 8  # `coverage run -m torch.distributed.run ... train.py` is two; more is a loop
PYTHON_NAME = r"python[0-9.]*(\.exe)?\Z"  # an interpreter's file name (a regex)


@record(frozen=True)
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
    # modules, commands and scripts as matchers: the same globs as a rule's
    compiled: globs.RulePatterns = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        compiled = globs.compile_rule(self.scripts, self.modules, self.commands, ())
        object.__setattr__(self, "compiled", compiled)

    def runs(self, entry: EntryPoint) -> bool:
        """Whether ``entry`` is this wrapper (its module, command, or script path)."""
        if entry.kind == "module":
            return self.compiled.module(entry.target)
        if entry.kind == "command" and self.compiled.command(entry.target):
            return True
        if entry.kind in ("script", "command") and self.scripts:
            paths = (p.replace(os.sep, "/").rstrip("/") for p in (entry.path, entry.realpath) if p)
            return self.compiled.script(*paths)
        return False


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
    if mode == "command" and re.match(PYTHON_NAME, os.path.basename(rest[0])):
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


@record(frozen=True)
class Step:
    """One wrapper taken off: which, and the command line it was started with."""

    wrapper: Wrapper
    entry: EntryPoint


@record(frozen=True)
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
