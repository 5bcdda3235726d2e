"""The ``autoalloc`` command (``python -m autoalloc``): explain, doctor, init, check, ab, report,
bench, cache."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from autoalloc import cachedir, layerpaths, sources
from autoalloc.envvars import CONFIG_VAR
from autoalloc.version import __version__

if TYPE_CHECKING:
    from autoalloc.policy import LayerConfig, LayerStatus, Rule

HEADER = """\
# autoalloc policy (WHERE). Everything below is commented out: this file changes nothing
# until you uncomment a line. See what it does with `autoalloc explain -- python train.py`,
# and validate it with `autoalloc check`.
# Layers, lowest first: built-in < site < user < project (autoalloc.toml or
# pyproject.toml [tool.autoalloc]) < the file named by AUTOALLOC_CONFIG.
"""

# Written with --force where it hides the project policy that applied here: then the file
# changes something at once, and says what.
HIDING = """\
# autoalloc policy (project). This file replaces the project policy
#   POLICY
# for every program under this directory: the nearest project file is used, and project
# files are not merged, so that file's rules and settings no longer apply here. Everything
# below is commented out: until you uncomment a line, programs here get only the built-in,
# site and user layers. See the result with `autoalloc explain -- python train.py`, and
# validate this file with `autoalloc check`.
"""

# Appended to a pyproject.toml (init --into-pyproject).
PYPROJECT_HEADER = """\
# autoalloc policy (project, in pyproject.toml). Everything below is commented out: it
# changes nothing until you uncomment [tool.autoalloc] and the lines you want below it.
# See what it does with `autoalloc explain -- python train.py`, and validate it with
# `autoalloc check`.
"""

PYPROJECT_HIDING = """\
# Uncommenting [tool.autoalloc] makes this file the project policy here, in place of
#   POLICY
# (the nearest project file is used; project files are not merged).
"""

BODY = """\

# enabled = false                # autoalloc does nothing where this file governs
# on_conflict = "keep"           # keep | override: when PYTORCH_*ALLOC_CONF already sets a key
# on_setter = "warn"             # warn | merge: when a later runtime setter call drops options
# disable = ["hf-asr-examples"]  # switch off rules of lower layers (built-in ones) by name

# Options that "apply" rules use unless they give their own.
# [allocator]
# expandable_segments = true
# garbage_collection_threshold = 0.8

# The first matching rule decides; this file's rules are tried before lower layers'.
# [[rules]]
# name = "my-asr-train"
# scripts = ["**/train_asr*.py"]   # globs on the script path; a bare name matches the file name
# modules = ["myproj.train*"]      # python -m module names
# commands = ["my-train"]          # console-script names
# imports = ["myproj.asr.data"]    # importing this module triggers the rule
# argv = ["*conformer*"]           # and at least one argument must match
# action = "apply"                 # apply | skip
# allocator = { garbage_collection_threshold = 0.8 }

# [[rules]]
# name = "my-inference"
# scripts = ["**/infer*.py"]
# action = "skip"
"""

def starter(where: str, hides: str | None = None) -> str:
    """The starter file for ``where`` (``project``, ``user``), every line commented out; its
    header says what it changes: nothing, unless it ``hides`` the project policy there."""
    if hides is not None:
        return HIDING.replace("POLICY", hides) + BODY
    return HEADER.replace("WHERE", where) + BODY


def pyproject_section(hides: str | None = None) -> str:
    """The starter as a commented ``[tool.autoalloc]`` section of a pyproject.toml."""
    body = (
        BODY.replace("\n# enabled", "\n# [tool.autoalloc]\n# enabled", 1)
        .replace("# [allocator]", "# [tool.autoalloc.allocator]")
        .replace("# [[rules]]", "# [[tool.autoalloc.rules]]")
    )
    note = PYPROJECT_HIDING.replace("POLICY", hides) if hides is not None else ""
    return "\n" + PYPROJECT_HEADER + note + body


def _cmd_explain(args: argparse.Namespace) -> int:
    from autoalloc.explain import explain, render

    report = explain(args.command or None, imported=args.imports, trains=args.trains)
    text = render(report, verbose=args.verbose)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else text)
    return 2 if report.get("prediction", {}).get("outcome") == "missing" else 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from autoalloc.doctor import render, status

    result = status()
    print(json.dumps(result.as_dict(), indent=2, sort_keys=True) if args.json else render(result))
    return 0 if result.ok else 1


def _cmd_init(args: argparse.Namespace) -> int:
    if args.into_pyproject:
        return _init_pyproject(os.getcwd())
    if args.user:
        from autoalloc import layercache

        return _write_starter(layercache.config_path("user"), starter("user"))
    path = os.path.join(os.getcwd(), "autoalloc.toml")
    if os.path.lexists(path):
        return _refuse(f"{path} exists; not overwriting it")
    governing = _project_policy_here()
    if governing is not None and not args.force:
        return _refuse(_hiding(governing, path))
    text = starter("project", hides=governing)
    written = _write_starter(path, text)
    if written == 0 and governing is not None:
        print(f"it replaces {governing} for the programs under {os.path.dirname(path)}")
    return written


def _refuse(why: str) -> int:
    print(f"autoalloc init: {why}", file=sys.stderr)
    return 1


def _project_policy_here() -> str | None:
    """The project policy file the hook reads in the working directory (a broken one
    included), or None: there is none, or it is another user's and ignored."""
    project = next(layer for layer in _layers_here() if layer.layer == "project")
    return project.path if project.status in ("found", "error") else None


def _hiding(governing: str, path: str) -> str:
    """Why init does not write ``path``: it would hide the project policy ``governing``."""
    directory = os.path.dirname(path)
    beside = os.path.dirname(governing) == directory
    where = "beside it" if beside else f"under {directory}"
    section = (
        ""
        if beside
        else "; or, in a pyproject.toml of this directory, a commented [tool.autoalloc] "
        "section with `autoalloc init --into-pyproject`, which changes nothing until you "
        "uncomment it"
    )
    return (
        f"{governing} holds the project policy here; a new {path} would replace it for "
        f"every program {where} (the nearest project file is used; project files are not "
        "merged), although every line of the new file is commented out. Add your rules to "
        f"{governing} instead (a rule's scripts can name files of this directory); or "
        f"write the starter anyway with `autoalloc init --force`{section}."
    )


def _write_starter(path: str, text: str) -> int:
    if os.path.lexists(path):
        return _refuse(f"{path} exists; not overwriting it")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "x", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:  # an unwritable directory, a read-only file system, a full disk
        return _refuse(f"cannot write {path}: {exc.strerror or exc}")
    print(f"wrote {path}")
    return 0


def _init_pyproject(directory: str) -> int:
    """Append a commented ``[tool.autoalloc]`` section to the pyproject.toml of
    ``directory``: it changes nothing until uncommented."""
    path = os.path.join(directory, "pyproject.toml")
    if os.path.lexists(os.path.join(directory, "autoalloc.toml")):
        return _refuse(
            f"{os.path.join(directory, 'autoalloc.toml')} exists: it wins over a "
            "[tool.autoalloc] table in the pyproject.toml beside it; edit it instead"
        )
    try:
        data = sources.read_file(path)[0]
        table = sources.policy_table(path, data)
    except FileNotFoundError:
        return _refuse(f"no {path}: `autoalloc init` writes ./autoalloc.toml instead")
    except sources.LayerError as exc:
        return _refuse(f"{path}: {str(exc).rstrip('.')}; not changed")
    # the table, or the commented section an earlier init appended: not a string naming it
    if table is not None or b"\n# [tool.autoalloc" in data:
        return _refuse(f"{path} has a [tool.autoalloc] section already; not changed")
    governing = _project_policy_here()
    text = pyproject_section(hides=governing)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text if data.endswith(b"\n") or not data else "\n" + text)
    except OSError as exc:
        return _refuse(f"cannot write {path}: {exc.strerror or exc}")
    print(f"appended a commented [tool.autoalloc] section to {path}")
    return 0


def _check_file(
    path: str, known: frozenset[str], layers: Sequence[LayerStatus] = ()
) -> list[str]:
    """What is wrong with one policy file (nothing: it is valid, and says so); ``known``:
    the rule names of the other layers, which its ``disable`` and ``enable`` may name;
    ``layers``: the layers read here, whose module sets below it its rules may use."""
    if os.path.basename(path) == "pyproject.toml":
        beside = os.path.join(os.path.dirname(path), "autoalloc.toml")
        if os.path.isfile(beside) and sources.shadowed_table(beside) is not None:
            return [sources.shadow_note(of_pyproject=True)]
    problems = _file_problems(path, known, layers)
    shadowed = sources.shadowed_table(path)
    return problems + ([sources.shadow_note()] if shadowed is not None else [])


def _file_problems(
    path: str, known: frozenset[str], layers: Sequence[LayerStatus] = ()
) -> list[str]:
    from autoalloc.policy import PolicyError, Source, salvage, unknown_switches

    layer = "project" if os.path.basename(path) in layerpaths.PROJECT_FILES else "user"
    if os.path.abspath(path) == sources.BUILTIN_PATH:
        layer = "builtin"  # its rules may come in parts of one name
    try:
        data = sources.read_file(path)[0]
        table = sources.policy_table(path, data)
    except FileNotFoundError:
        return ["no such file"]
    except sources.LayerError as exc:
        return [f"{str(exc).rstrip('.')}; the file is ignored"]
    if table is None:
        return ["no [tool.autoalloc] table"]
    try:
        config, problems = salvage(table, Source(layer, path), allow_trust=layer != "project")
    except PolicyError as exc:
        return [f"{exc}; the file is ignored"]
    config, linked = _linked(config, layers)
    names = known | {rule.name for rule in config.rules}
    problems = [
        *sources.pyproject_problems(path, data),
        *unknown_switches(config, names, sources.wrapper_names),
        *problems,
        *linked,
        *_dead_triggers(config.rules),
    ]
    if not problems and sources.shadowed_table(path) is None:
        count = len(config.rules)
        print(f"ok     {path}  ({count} rule{'' if count == 1 else 's'})")
    return list(problems)


def _linked(config: LayerConfig, layers: Sequence[LayerStatus]) -> tuple[LayerConfig, list[str]]:
    """``config`` with its references to the module sets of the ``layers`` below its own
    expanded, and a sentence for each it could not expand."""
    from autoalloc.modulesets import link
    from autoalloc.policy import LAYERS

    if not config.pending:
        return config, []
    rank = LAYERS.index(config.source.layer)  # type: ignore[arg-type]
    below = [layer.config for layer in layers if layer.config is not None
             and LAYERS.index(layer.layer) < rank]  # fmt: skip
    *_, (linked, problems) = link([*below, config])
    return linked, [problem.sentence() for problem in problems]


def _dead_triggers(rules: Sequence[Rule]) -> list[str]:
    from autoalloc import selfimports

    return [text for rule in rules for text in selfimports.messages(rule)]


def _cmd_check(args: argparse.Namespace) -> int:
    from autoalloc.envvars import DISABLE_VAR, disable_problem

    layers = _layers_here()
    known = frozenset(rule.name for layer in layers if layer.config for rule in layer.config.rules)
    paths = list(args.paths)
    failed = 0
    if not paths:
        paths, failed = _layer_paths(layers)
    unclear = disable_problem(os.environ.get(DISABLE_VAR))
    if unclear is not None:
        failed += 1
        print(f"error  {DISABLE_VAR}: {unclear.removeprefix('autoalloc: ')}")
    for path in paths:
        errors = _check_file(path, known, layers)
        failed += bool(errors)
        for error in errors:
            print(f"error  {path}: {error}")
    return 1 if failed else 0


def _layers_here() -> list[LayerStatus]:
    """The layers the hook reads for a program started in the working directory."""
    from autoalloc import entrypoint

    return sources.read_layers(
        entrypoint.EntryPoint("unknown"), os.environ, entrypoint.current_cwd()
    )


def _layer_paths(layers: Sequence[LayerStatus]) -> tuple[list[str], int]:
    """The files of ``layers`` (AUTOALLOC_CONFIG's included), and how many layers are
    errors that no file shows: a named AUTOALLOC_CONFIG that does not exist. A
    pyproject.toml the project search passed over gets a line of its own, not an error."""
    paths, failed = [], 0
    for layer in layers:
        if layer.path and layer.layer == "env" and not os.path.lexists(layer.path):
            failed += 1
            print(f"error  {layer.path}: {layer.message} ({CONFIG_VAR})")
        elif layer.path and layer.status == "skipped":
            print(f"note   {layer.path}: {layer.message}")
        elif layer.path and layer.status in ("found", "error", "untrusted"):
            paths.append(layer.path)
    return paths, failed


AB_HELP = """\
Run CMD with the allocator options on and off, R times each, interleaved (on, off, on, off),
stop each run after W warm-up + N optimizer steps, and put the two side by side: steps/s, step
time median and p95, device mallocs per step, retries, OOMs, peak reserved and allocated
memory, the ratio on/off with its spread across repeats, and a one-line verdict. Writes
OUT/ab.json and, with matplotlib installed (pip install matplotlib), OUT/ab.png.

on:  the options the policy's deciding rule applies for CMD (see `autoalloc explain -- CMD`),
     the way your job gets them: at `import torch`, or for a program decided later (at its
     first optimizer, at an import trigger) then, through the runtime setter; when no rule
     applies any, the policy's [allocator] defaults.
off: AUTOALLOC_DISABLE=1 and expandable_segments:False; the rest of the environment unchanged.

CMD's Python must have autoalloc installed (the reports come from its startup hook): ab checks
first and, where it is missing, prints the pip command that installs this autoalloc there
from where this one came (a clone, a wheel, a repository URL).

An ab run is a measurement, not a training run: each run ends after warm-up + N steps
(AUTOALLOC_AB_STOP_AFTER; every rank of a torchrun job stops at the same step) with exit
status 0, whatever the trainer had planned. Checkpoints, logs and outputs the command writes
are not its business: point them somewhere disposable.

example: autoalloc ab --steps 50 -- python train.py --config my.yaml
"""


def _ab_options(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--steps", type=int, default=50, help="optimizer steps measured after the warm-up (50)")
    add("--warmup", type=int, default=20, help="warm-up steps left out of the figures (20)")
    add("--repeat", type=int, default=2, help="runs per arm, interleaved (2)")
    add("--timeout", type=float, default=1800, help="seconds one run may take (1800)")
    add(
        "--out",
        help="directory for logs, reports, ab.json, ab.png (default: a new directory under "
        "the user cache directory, named on stderr; never inside your project)",
    )
    add("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to measure")


def _ab_usage_error(args: argparse.Namespace) -> str | None:
    if not args.command:
        return "no command: autoalloc ab [options] -- CMD ..."
    for name, least in (("steps", 1), ("repeat", 1), ("warmup", 0), ("timeout", 1)):
        if getattr(args, name) < least:
            return f"--{name} must be at least {least}, not {getattr(args, name)}"
    return None


def _ab_outlook(command: list[str]) -> tuple[dict, dict | None]:
    """What the real run of ``command`` decides: ``explain``'s report at ``import torch`` and,
    when a rule can still decide later, its report once the program has imported what its
    source imports and built its optimizer (None: nothing to ask)."""
    from autoalloc.explain import explain

    now = explain(command)
    prediction = now.get("prediction") or {}
    if now["decision"]["action"] != "none" or not now.get("late") or not prediction.get("rule"):
        return now, None
    imported = sorted(prediction["evidence"])  # what its source imports (explain's prediction)
    return now, explain(command, imported=imported, trains=True)


def _cmd_ab(args: argparse.Namespace) -> int:
    from autoalloc.ab import arms as ab_arms
    from autoalloc.ab import interpreter, runner, table
    from autoalloc.ab.plot import plot

    command = args.command
    usage = _ab_usage_error(args)
    if usage is not None:
        print(f"autoalloc ab: error: {usage}", file=sys.stderr)
        return 2
    foreign = interpreter.lacks_autoalloc(command)
    if foreign is not None:
        print(f"autoalloc ab: {interpreter.advice(foreign)}", file=sys.stderr)
        return 2
    now, later = _ab_outlook(command)
    arms = ab_arms.ab_arms(command, now, os.environ, later)
    for arm in arms:
        print(f"{arm.name}: {arm.how}", file=sys.stderr)
    out = args.out or cachedir.run_dir("ab")
    print(f"ab: logs, reports and results go to {out} (--out to choose)", file=sys.stderr)
    steps, warmup, repeat = args.steps, max(1, args.warmup), args.repeat
    plan = runner.Plan(steps=steps, warmup=warmup, repeat=repeat, timeout=args.timeout, out=out)
    runs = runner.run_all(arms, plan)
    data = runner.result(arms, plan, runs, [])
    text = table.render_ab(data)
    os.makedirs(out, exist_ok=True)
    png = plot(data, os.path.join(out, "ab.png"), "autoalloc ab: " + " ".join(command)[:80])
    data["png"], data["table"] = png, text
    with open(os.path.join(out, "ab.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    print(text)
    written = f" and {png}" if png else " (no PNG: matplotlib is not installed)"
    print(f"wrote {os.path.join(out, 'ab.json')}{written}")
    return 1 if any(run.failed for run in runs) else 0


def _cmd_cache(args: argparse.Namespace) -> int:
    if args.clear:
        try:
            removed = cachedir.clear()
        except OSError as exc:
            print(f"autoalloc cache: not cleared: {exc}", file=sys.stderr)
            return 1
        print(f"removed {removed} file{'' if removed == 1 else 's'}")
        return 0
    state = cachedir.describe()
    if args.json:
        print(json.dumps(state, indent=2, sort_keys=True))
        return 0 if state["used"] else 1
    print(f"layer cache: {state['path'] or '(none)'}")
    if not state["used"]:
        print(f"not used: {state['reason']}")
        return 1
    if state["reason"]:
        print(state["reason"])
    temporary = f", {state['temporary']} temporary" if state["temporary"] else ""
    print(f"{state['entries']} entries{temporary}, {state['bytes']:,} bytes")
    return 0


def _cache_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clear", action="store_true", help="remove every entry")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _cmd_report(args: argparse.Namespace) -> int:
    from autoalloc.ab import reports

    return reports.command(args.paths, args.json, sys.stdout, sys.stderr)


def _explain_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every rule, built-in ones included")  # fmt: skip
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="decide as if the program imported MODULE (repeatable): what a notebook "
                   "or a script that imports a toolkit would get")  # fmt: skip
    p.add_argument("--trains", action="store_true", help="decide as once the program has built "
                   "its optimizer (rules with training = true)")  # fmt: skip
    p.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to explain"
    )


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _init_options(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--project", action="store_true", help="./autoalloc.toml (default)")
    where.add_argument("--user", action="store_true", help="the user config file (platformdirs)")
    where.add_argument("--into-pyproject", action="store_true",
                       help="append a commented [tool.autoalloc] section to ./pyproject.toml "
                       "instead")  # fmt: skip
    p.add_argument("--force", action="store_true", help="write ./autoalloc.toml even where it "
                   "replaces the project policy of a pyproject.toml beside it or of a file above "
                   "(never overwrites a file)")  # fmt: skip


def _check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH")


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--json", action="store_true", help="the reports as one JSON list")


def _bench_options(p: argparse.ArgumentParser) -> None:
    from autoalloc.bench import command

    p.description = command.DESCRIPTION
    command.declare(p)


def _cmd_bench(args: argparse.Namespace) -> int:
    from autoalloc.bench import command

    return command.run(args)


@dataclass(frozen=True)
class Command:
    """One subcommand: its line in the list, its ``--help`` text, its options, what runs it."""

    name: str
    help: str
    options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""  # the --help text (default: ``help``)
    usage: str | None = None
    raw: bool = False  # the description is laid out already (line breaks kept)


COMMANDS = (
    Command(
        name="explain",
        help="show what autoalloc would do for a command, without running it",
        description="Show the entry point as autoalloc sees it, every policy layer, the rules "
        "in match order, the deciding rule and the resulting environment, without running "
        "CMD. Example: autoalloc explain -- python examples/asr/asr_ctc/speech_to_text_ctc.py",
        options=_explain_options,
        run=_cmd_explain,
    ),
    Command(
        name="doctor",
        help="import torch and report what it actually uses",
        description="Import torch in this process and report what torch itself says is in "
        "effect, what autoalloc decided and why, whether the hook is installed and live, and "
        "anything that defeats it. Exit status 0 when the policy's intent is in effect (or "
        "nothing was intended), 1 otherwise.",
        options=_json_option,
        run=_cmd_doctor,
    ),
    Command(
        name="init",
        help="write a commented starter policy (refuses to overwrite)",
        description="Write a commented starter policy: ./autoalloc.toml (--project, the "
        "default), the user config file (--user), or a commented [tool.autoalloc] section "
        "appended to ./pyproject.toml (--into-pyproject). An existing file is never "
        "overwritten. Where a project policy applies already (a pyproject.toml "
        "[tool.autoalloc] beside, an autoalloc.toml or pyproject.toml above), a new "
        "./autoalloc.toml would replace it: init names it and writes nothing, unless --force.",
        options=_init_options,
        run=_cmd_init,
    ),
    Command(
        name="check",
        help="validate policy files; exit 1 on errors",
        description="Validate policy files (autoalloc.toml, pyproject.toml [tool.autoalloc], "
        "user/site config.toml). Without PATH, checks every layer the hook reads for the "
        "working directory, the file named by AUTOALLOC_CONFIG included (a name that does not "
        "exist is an error). Exit status 1 when any file has an error: usable in pre-commit "
        "and CI.",
        options=_check_options,
        run=_cmd_check,
    ),
    Command(
        name="ab",
        help="A/B of your own command with the allocator options on and off",
        description=AB_HELP,
        usage="autoalloc ab [options] -- CMD ...",
        raw=True,
        options=_ab_options,
        run=_cmd_ab,
    ),
    Command(
        name="report",
        help="render AUTOALLOC_REPORT files as a table",
        description="Render the reports AUTOALLOC_REPORT=PATH wrote: files, directories, or - "
        "(standard input: a job's stderr after AUTOALLOC_REPORT=-). Every file that holds "
        "something else gets one line on stderr saying why. Exit status 0 when every path "
        "held reports, 1 when none did or some file was skipped, 2 on a usage error.",
        options=_report_options,
        run=_cmd_report,
    ),
    Command(
        name="cache",
        help="show or clear the layer cache (validated policy files of earlier processes)",
        description="Show where the layer cache is, how many entries and bytes it holds, or "
        "why the hook does not use it (a directory another user owns or can write, a symbolic "
        "link another user may change); --clear removes its entries (nothing else in the "
        "directory: ab's results stay). Exit status 1 when it is not used or cannot be cleared.",
        options=_cache_options,
        run=_cmd_cache,
    ),
    Command(
        name="bench",
        help="GPU A/B benchmark of dynamic-shape ASR-like training (CPU smoke run without a GPU)",
        options=_bench_options,  # and bench's description
        run=_cmd_bench,
    ),
)


def parser() -> argparse.ArgumentParser:
    """The whole command line: one subparser per entry of ``COMMANDS``."""
    p = argparse.ArgumentParser(
        prog="autoalloc",
        description="Sets PyTorch's CUDA allocator options (expandable_segments) for matching "
        "programs, before torch initializes CUDA.",
    )
    p.add_argument("--version", action="version", version=f"autoalloc {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    for command in COMMANDS:
        one = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            usage=command.usage,
            formatter_class=argparse.RawDescriptionHelpFormatter
            if command.raw
            else argparse.HelpFormatter,
        )
        command.options(one)
        one.set_defaults(run=command.run)
    return p


class _PipeGuard:
    """Standard output for a command whose reader may go away (``autoalloc check | head -1``):
    once a write or flush meets a closed pipe, the rest goes to ``os.devnull``, and the
    command runs on to its own exit status, without a traceback."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _to_devnull(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _to_devnull(self._stream)
            try:
                self._stream.flush()  # what the pipe did not take, now to devnull
            except (OSError, ValueError):
                pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _to_devnull(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at devnull, as Python's documentation advises for a
    closed pipe (signal module, "Note on SIGPIPE"), so that no later flush fails again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """``autoalloc COMMAND ...``; bare ``autoalloc`` lists the commands. Quiet on a closed
    pipe (``autoalloc check | head -1``): no traceback, and the command's own exit status."""
    stdout = sys.stdout
    guarded = stdout is not None and not isinstance(stdout, _PipeGuard)
    if guarded:
        sys.stdout = _PipeGuard(stdout)  # type: ignore[assignment]
    try:
        try:
            return _dispatch(list(sys.argv[1:] if argv is None else argv))
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
            if guarded and isinstance(sys.stdout, _PipeGuard):
                sys.stdout = stdout
    except BrokenPipeError:  # written past the guard (``sys.stdout.buffer``): status unknown
        if stdout is not None:
            _to_devnull(stdout)
        return 1


def _dispatch(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        return 0
    if getattr(args, "command", None) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return args.run(args)
