"""The ``autoalloc`` command (also ``python -m autoalloc``): explain, doctor, init, check, bench."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from autoalloc import __version__, sources

STARTER = """\
# autoalloc policy (WHERE). Reference: `autoalloc explain`, README "Policy".
# Layers, lowest first: built-in < site < user < project (autoalloc.toml or
# pyproject.toml [tool.autoalloc]) < the file named by AUTOALLOC_CONFIG.

# enabled = false          # autoalloc does nothing where this file governs
# on_conflict = "keep"     # keep | override: when PYTORCH_*ALLOC_CONF already sets a key
# disable = ["nemo-asr-train"]   # switch off rules of lower layers by name

# Options "apply" rules use unless they give their own.
[allocator]
expandable_segments = true
# garbage_collection_threshold = 0.8

# The first matching rule decides (this file's rules are tried before lower layers').
[[rules]]
name = "my-asr-train"
scripts = ["**/train_asr*.py"]     # globs on the script path; a bare name matches the file name
# modules = ["myproj.train*"]      # python -m module names
# commands = ["my-train"]          # console-script names
# imports = ["myproj.asr.data"]    # importing this module triggers the rule
# argv = ["*conformer*"]           # and at least one argument must match
action = "apply"                   # apply | skip
# allocator = { garbage_collection_threshold = 0.8 }

# [[rules]]
# name = "my-inference"
# scripts = ["**/infer*.py"]
# action = "skip"
"""


def _cmd_explain(args: argparse.Namespace) -> int:
    from autoalloc.explain import explain, render

    report = explain(args.command or None)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else render(report))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from autoalloc.doctor import render, status

    result = status()
    print(json.dumps(result.as_dict(), indent=2, sort_keys=True) if args.json else render(result))
    return 0 if result.ok else 1


def _cmd_init(args: argparse.Namespace) -> int:
    if args.user:
        path, where = sources.user_path(), "user"
    else:
        path, where = os.path.join(os.getcwd(), "autoalloc.toml"), "project"
    if os.path.lexists(path):
        print(f"autoalloc init: {path} exists; not overwriting it", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "x", encoding="utf-8") as f:
        f.write(STARTER.replace("WHERE", where))
    print(f"wrote {path}")
    return 0


def _check_file(path: str) -> str | None:
    from autoalloc.policy import PolicyError, Source, validate

    layer = "project" if os.path.basename(path) in sources.PROJECT_FILES else "user"
    try:
        table = sources.policy_table(path, sources.read_bytes(path))
    except FileNotFoundError:
        return "no such file"
    except sources.LayerError as exc:
        return str(exc)
    if table is None:
        return "no [tool.autoalloc] table"
    try:
        config = validate(table, Source(layer, path), allow_trust=layer != "project")
    except PolicyError as exc:
        return str(exc)
    print(f"ok     {path}  ({len(config.rules)} rules)")
    return None


def _cmd_check(args: argparse.Namespace) -> int:
    from autoalloc import entrypoint

    paths = list(args.paths)
    if not paths:
        policy = sources.load(entrypoint.EntryPoint("unknown"), os.environ, entrypoint.current_cwd())
        paths = [s.path for s in policy.layers if s.path and s.status in ("found", "error", "untrusted")]
    failed = 0
    for path in paths:
        error = _check_file(path)
        if error:
            failed += 1
            print(f"error  {path}: {error}")
    return 1 if failed else 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from autoalloc import bench

    return bench.main(args.bench_args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autoalloc",
        description="Sets PyTorch's CUDA allocator options (expandable_segments) for matching programs, "
        "before torch initializes CUDA.",
    )
    p.add_argument("--version", action="version", version=f"autoalloc {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    e = sub.add_parser(
        "explain",
        help="show what autoalloc would do for a command, without running it",
        description="Show the entry point as autoalloc sees it, every policy layer, the rules in match order, "
        "the deciding rule and the resulting environment, without running CMD. "
        "Example: autoalloc explain -- python examples/asr/asr_ctc/speech_to_text_ctc.py",
    )
    e.add_argument("--json", action="store_true", help="machine-readable output")
    e.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to explain")
    e.set_defaults(func=_cmd_explain)

    d = sub.add_parser(
        "doctor",
        help="import torch and report what it actually uses",
        description="Import torch in this process and report what torch itself says is in effect, what "
        "autoalloc decided and why, whether the hook is installed and live, and anything that defeats it. "
        "Exit status 0 when the policy's intent is in effect (or nothing was intended), 1 otherwise.",
    )
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=_cmd_doctor)

    i = sub.add_parser(
        "init",
        help="write a commented starter policy (refuses to overwrite)",
        description="Write a commented starter policy: ./autoalloc.toml (--project, the default) or the user "
        "config file (--user). An existing file is never overwritten.",
    )
    where = i.add_mutually_exclusive_group()
    where.add_argument("--project", action="store_true", help="./autoalloc.toml (default)")
    where.add_argument("--user", action="store_true", help="the user config file (platformdirs)")
    i.set_defaults(func=_cmd_init)

    c = sub.add_parser(
        "check",
        help="validate policy files; exit 1 on errors",
        description="Validate policy files (autoalloc.toml, pyproject.toml [tool.autoalloc], user/site "
        "config.toml). Without PATH, checks every layer that applies to the working directory. "
        "Exit status 1 when any file has an error: usable in pre-commit and CI.",
    )
    c.add_argument("paths", nargs="*", metavar="PATH")
    c.set_defaults(func=_cmd_check)

    b = sub.add_parser(
        "bench",
        help="GPU A/B benchmark of dynamic-shape ASR-like training (CPU smoke run without a GPU)",
        add_help=False,
    )
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    b.set_defaults(func=_cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # argparse.REMAINDER would reject bench's own leading options (--quick, --help)
        from autoalloc import bench

        return bench.main(argv[1:])
    args = parser().parse_args(argv)
    if getattr(args, "command", None) and args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return args.func(args)
