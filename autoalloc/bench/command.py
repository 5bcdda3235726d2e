"""``autoalloc bench``: the ``ab`` runner on the synthetic workload, with its extra arms.

Arms (``ARMS``, each run its own process of ``python -m autoalloc.bench.workload``):
autoalloc's hook on a rule of a policy the bench writes (``AUTOALLOC_CONFIG``) against
autoalloc off, NeMo's runtime setter, and one fixed batch shape with and without the option.

The memory cap comes from a probe run (each bucket's worst batch), so that peak allocated
memory sits near ``--fill`` of the cap. Without a GPU (or with ``--smoke``) it says so and
runs the CPU smoke path: every arm for a few steps of a tiny model, to check the plumbing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from autoalloc.ab import runner, table
from autoalloc.ab.arms import Arm
from autoalloc.ab.plot import plot
from autoalloc.allocconf import ALL_VARS, CUDA_VAR
from autoalloc.bench import schedule
from autoalloc.bench.workload import (
    ES_ON,
    GIB,
    MODEL_OPTIONS,
    PRESETS,
    SETTINGS_TAG,
    presets,
    shape_options,
)
from autoalloc.envvars import DISABLE_VAR, REPORT_VAR

HOOK_RULE = "autoalloc-bench"
WORKLOAD = "autoalloc.bench.workload"
POLICY = f"""\
# Written by `autoalloc bench` for its "on" arm (AUTOALLOC_CONFIG: the highest layer).
[allocator]
expandable_segments = true

[[rules]]
name = "{HOOK_RULE}"
description = "the on arm of autoalloc bench"
modules = ["{WORKLOAD}"]
action = "apply"
"""
# name -> (workload arguments, environment, intended expandable_segments)
ARMS: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "on": ((), "hook", True),
    "off": ((), "off", False),
    "setter": (("--setter",), "plain", True),
    "static-on": (("--static",), "env-on", True),
    "static-off": (("--static",), "off", False),
}
PAIRS = (("on", "off"), ("setter", "off"), ("static-on", "static-off"))


def arm_env(kind: str, policy: str) -> dict[str, str | None]:
    """An arm's environment changes: the allocator variables are the arm's alone."""
    env: dict[str, str | None] = dict.fromkeys(ALL_VARS)
    env.update(AUTOALLOC_DISABLE="1", AUTOALLOC_CONFIG=None)
    if kind == "hook":
        env.update(AUTOALLOC_DISABLE=None, AUTOALLOC_CONFIG=policy)
    elif kind == "off":
        env[CUDA_VAR] = "expandable_segments:False"
    elif kind == "env-on":
        env[CUDA_VAR] = ES_ON
    return env


# What each kind of arm environment does, as the report says it.
_HOW = {
    "hook": f"autoalloc's hook (rule {HOOK_RULE})",
    "off": "disabled, expandable_segments:False",
    "plain": "runtime setter after the model is on the GPU",
    "env-on": f"{CUDA_VAR}={ES_ON}",
}


def make_arms(names: Sequence[str], base: Sequence[str], policy: str) -> list[Arm]:
    arms = []
    for name in names:
        extra, kind, intent = ARMS[name]
        env = arm_env(kind, policy)
        arms.append(Arm(name=name, command=(*base, *extra), env=env, intent=intent, how=_HOW[kind]))
    return arms


DESCRIPTION = (
    "A/B of PyTorch's caching allocator on a synthetic dynamic-shape ASR training loop near "
    "the memory cap (python -m autoalloc.bench.workload), on the runner of `autoalloc ab`: "
    "autoalloc's hook vs off, NeMo's runtime setter, and static-shape controls. Without a GPU "
    "it says so, runs the CPU smoke path (plumbing only) and exits 0."
)


def parser() -> argparse.ArgumentParser:
    """``python -m autoalloc.bench``'s parser; ``autoalloc bench`` declares the same options."""
    p = argparse.ArgumentParser(prog="autoalloc bench", description=DESCRIPTION)
    declare(p)
    return p


def declare(p: argparse.ArgumentParser) -> None:
    """Bench's options; those it hands to the workload are the workload's own declarations."""
    for flag, text in (
        ("--quick", "small model, 60 steps: a few minutes on one GPU"),
        ("--smoke", "the CPU smoke path even when a GPU is present"),
        ("--check-settings", "only check that each arm's process gets the allocator setting it "
         "intends (no training; exact on CUDA builds even without a GPU)"),
    ):  # fmt: skip
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated arms (default: {','.join(ARMS)})"
    )
    p.add_argument("--repeats", type=int, help="runs per arm, interleaved" + presets("repeats"))
    p.add_argument("--steps", type=int, help="measured steps per run" + presets("steps"))
    p.add_argument("--warmup", type=int, help="warm-up steps" + presets("warmup"))
    shape_options(p, with_presets=True)
    p.add_argument(
        "--fill", type=float, default=0.88, help="target peak allocated / cap (default 0.88)"
    )
    p.add_argument("--cap-gb", type=float, help="memory cap in GiB instead of calibrating it")
    p.add_argument("--no-cap", action="store_true", help="no memory cap (no pressure)")
    p.add_argument(
        "--out",
        help="working directory (runs, logs, results; default: a new directory under the user "
        "cache directory, named on stderr; never inside your project)",
    )
    p.add_argument("--json", help="results JSON (default OUT/bench.json)")
    p.add_argument("--png", help="plot (default OUT/bench.png; needs matplotlib)")
    p.add_argument("--deadline", type=float, help="seconds: start no run that would end after this")
    p.add_argument("--arm-timeout", type=float, help="seconds one run may take")
    p.add_argument(
        "--python", default=sys.executable, help="interpreter for the runs (default: this one)"
    )


def settings(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """The preset with the command line's overrides (the model's own, except on the smoke path)."""
    conf = dict(PRESETS[mode])
    keys = ("repeats", "steps", "warmup", "max_duration", "buckets", "arm_timeout")
    for key in keys + (MODEL_OPTIONS if mode != "smoke" else ()):
        if getattr(args, key, None) is not None:
            conf[key] = getattr(args, key)
    return conf


def workload_args(
    args: argparse.Namespace, mode: str, conf: dict[str, Any], cap_gb: float | None
) -> list[str]:
    """The workload's command line for a run (every arm adds its own flags)."""
    steps, device = str(conf["steps"] + conf["warmup"]), "cpu" if mode == "smoke" else "cuda"
    out = [*_base(args), "--preset", mode, "--seed", str(args.seed), "--steps", steps]
    out += ["--device", device]
    for key in ("max_duration", "buckets", *MODEL_OPTIONS):
        out += [f"--{key.replace('_', '-')}", str(conf[key])]
    return out + (["--cap-gb", f"{cap_gb:.4f}"] if cap_gb else [])


def calibrate(
    args: argparse.Namespace, mode: str, conf: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Probe the GPU in a process of its own: is there one, what peak does the worst batch take?"""
    path = os.path.join(os.path.abspath(args.out), "probe.json")
    command = [*workload_args(args, mode, conf, None), "--probe", path, "--device", "auto"]
    print(
        "autoalloc bench: probing the GPU and calibrating the memory cap "
        f"({conf['buckets']} buckets) ...",
        file=sys.stderr,
        flush=True,
    )
    env = {**os.environ, DISABLE_VAR: "1"}
    env.pop(REPORT_VAR, None)
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=conf["arm_timeout"]
    )
    try:
        with open(path, encoding="utf-8") as f:
            probe = json.load(f)
    except (OSError, ValueError):
        return {"error": f"the probe exited {done.returncode}: {done.stderr[-2000:]}"}, []
    if not probe.get("cuda_available"):
        return probe, []
    notes = []
    cap = None
    if not args.no_cap:
        cap = args.cap_gb * GIB if args.cap_gb else probe["peak_allocated"] / args.fill
    if cap and cap > 0.95 * probe["total_memory"]:
        cap = 0.95 * probe["total_memory"]
        notes.append(
            "the calibrated cap exceeds 95% of the GPU: capped at 95%; lower --max-duration"
        )
    if probe.get("ooms"):
        notes.append(
            f"the probe ran out of memory on {probe['ooms']} batches: lower --max-duration"
        )
    return {**probe, "cap_bytes": cap, "fill": args.fill}, notes


def check_all_settings(args: argparse.Namespace, arms: Sequence[Arm]) -> int:
    """Each arm in its own process, set up, not trained: does torch report what it intends?"""
    results: dict[str, Any] = {}
    for arm in arms:
        # a report to nowhere: the recorder it installs is how the process learns its decision
        env = arm.environ({**os.environ, REPORT_VAR: os.devnull})
        command = [*arm.command, "--check-settings"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        line = next((x for x in done.stdout.splitlines() if x.startswith(SETTINGS_TAG)), None)
        result = json.loads(line[len(SETTINGS_TAG) :]) if line else {"error": done.stderr[-2000:]}
        seen = result.get("allocator_settings", {})
        hooked = ARMS[arm.name][1] != "hook" or result.get("decision", {}).get("rule") == HOOK_RULE
        result["ok"] = seen.get("expandable_segments") is arm.intent and hooked
        results[arm.name] = result
        print(
            f"{arm.name:<12}expandable_segments={seen.get('expandable_segments')} "
            f"(intended {arm.intent}) "
            f"from {seen.get('source')}" + ("" if result["ok"] else "  <- NOT AS INTENDED")
        )
    path = args.json or os.path.join(args.out, "settings.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results.values()) else 1


def _base(args: argparse.Namespace) -> list[str]:
    return [args.python, "-m", WORKLOAD]


def checks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The project's GPU goals, as pass/miss lines (informational: they never fail the run)."""
    arms = {name: [run["figures"] for run in runs] for name, runs in data["runs_by_arm"].items()}
    if not any(f.get("cuda") for runs in arms.values() for f in runs):
        return []
    rows = table.compare(arms, "on", "off")
    static = table.compare(arms, "static-on", "static-off")["step_ms_median"]["ratio"]
    mallocs = "on: device mallocs per step after warm-up ~0 (<= 0.05)"
    goals = (  # (check, value, centre, the most |value - centre| may be)
        ("on: median step time <= 0.8 x off", rows["step_ms_median"]["ratio"], 0.0, 0.8),
        (mallocs, rows["mallocs_per_step"]["on"], 0.0, 0.05),
        ("static shapes: on within +-2% of off", static, 1.0, 0.02),
    )
    return [
        {"check": check, "value": value, "ok": abs(value - centre) <= most}
        for check, value, centre, most in goals
        if value is not None
    ]


def hook_notes(data: dict[str, Any]) -> list[str]:
    """The on arm measures autoalloc only if its hook really applied the bench's rule."""
    notes = []
    for run in data["runs_by_arm"].get("on", ()):
        for report in run["reports"]:
            if report.get("decision", {}).get("rule") != HOOK_RULE:
                notes.append(
                    f"on run {run['repeat']}: autoalloc's hook did not apply rule {HOOK_RULE} "
                    f"({report.get('decision')}): is autoalloc installed in "
                    f"{report.get('argv', ['?'])[0]}?"
                )
    return notes


def render(data: dict[str, Any]) -> str:
    bench = data["bench"]
    sched, cal = bench["schedule"], bench["calibration"]
    lines = [
        f"autoalloc bench ({bench['mode']}): {bench['device_name']}, torch {bench['torch']}, "
        f"{data['plan']['steps']} steps after {data['plan']['warmup']} warm-up, "
        f"{data['plan']['repeat']} repeat(s)",
        f"schedule: {sched['buckets']} buckets, batch sizes {sched['batch_size_range']}, "
        f"{sched['distinct_shapes']} distinct shapes in {sched['steps']} steps",
    ]
    if cal.get("cap_bytes"):
        lines.append(
            f"memory cap: {cal['cap_bytes'] / GIB:.2f} GiB of {cal['total_memory'] / GIB:.1f} GiB; "
            "probe "
            f"peak allocated {cal['peak_allocated'] / GIB:.2f} GiB, target fill {cal['fill']:.2f}"
        )
    for a, b in PAIRS:
        if data["runs_by_arm"].get(a) and data["runs_by_arm"].get(b):
            lines += ["", f"== {a} vs {b}", table.render_ab(data, a, b, notes=False)]
    lines.append("")
    lines += [
        f"check: {c['check']}: {c['value']:.3f} -> {'ok' if c['ok'] else 'MISS'}"
        for c in bench["checks"]
    ]
    lines += [f"note: {note}" for note in data["notes"]]
    return "\n".join(lines)


def run_bench(args: argparse.Namespace, arms_wanted: list[str]) -> int:
    """Calibrate (or fall back to the CPU smoke path), run the arms, report."""
    t0 = time.perf_counter()
    mode = "smoke" if args.smoke else ("quick" if args.quick else "full")
    conf = settings(args, mode)
    calibration: dict[str, Any] = {}
    notes: list[str] = []
    if mode != "smoke":
        calibration, notes = calibrate(args, mode, conf)
        if "error" in calibration:
            print(
                f"autoalloc bench: the calibration probe failed: {calibration['error']}",
                file=sys.stderr,
            )
            return 1
        if not calibration.get("cuda_available"):
            print(
                "autoalloc bench: no CUDA GPU available here: running the CPU smoke path instead "
                "(every arm for a few steps of a tiny model); allocator figures need a GPU.",
                flush=True,
            )
            notes.append(
                "no CUDA GPU: CPU smoke path; this checks the plumbing, the figures need a GPU"
            )
            mode, conf, calibration = "smoke", settings(args, "smoke"), {}
    cap = calibration.get("cap_bytes")
    base = workload_args(args, mode, conf, cap / GIB if cap else None)
    arms = make_arms(arms_wanted, base, _write_policy(args.out))
    plan = runner.Plan(
        steps=conf["steps"], warmup=conf["warmup"], repeat=conf["repeats"],
        timeout=conf["arm_timeout"], out=args.out, deadline=args.deadline,
    )
    runs = runner.run_all(arms, plan)
    data = runner.result(arms, plan, runs, notes)
    data["notes"] += hook_notes(data)
    data["bench"] = bench_meta(args, mode, conf, calibration, runs)
    data["bench"]["checks"] = checks(data)
    data["bench"]["total_s"] = round(time.perf_counter() - t0, 1)
    write_outputs(args, data)
    return 1 if any(run.failed for run in runs) else 0


def bench_meta(
    args: argparse.Namespace,
    mode: str,
    conf: dict[str, Any],
    calibration: dict[str, Any],
    runs: Sequence[runner.Run],
) -> dict[str, Any]:
    report = next((r for run in runs for r in run.reports), {})
    plan = schedule.make_schedule(
        conf["steps"] + conf["warmup"], conf["max_duration"], conf["buckets"], args.seed
    )
    return {
        "mode": mode,
        "gpu": bool(calibration.get("cuda_available")),
        "device_name": report.get("device_name", "?"),
        "torch": report.get("torch", "?"),
        "config": {k: v for k, v in conf.items() if k != "arm_timeout"},
        "calibration": calibration,
        "schedule": schedule.schedule_summary(plan),
        "command": "autoalloc bench " + " ".join(sys.argv[2:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _write_policy(out: str) -> str:
    path = os.path.join(os.path.abspath(out), "policy.toml")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(POLICY)
    return path


def write_outputs(args: argparse.Namespace, data: dict[str, Any]) -> None:
    json_path = args.json or os.path.join(args.out, "bench.json")
    png_path = args.png or os.path.join(args.out, "bench.png")
    for path in (json_path, png_path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    meta = data["bench"]
    title = f"autoalloc bench ({meta['mode']}): {meta['device_name']}, torch {meta['torch']}"
    data["png"] = plot(data, png_path, title)
    text = render(data)
    data["table"] = text
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    print(text)
    print(
        f"\nwrote {json_path}"
        + (f" and {data['png']}" if data["png"] else " (no PNG: matplotlib is not installed)")
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autoalloc.bench``: the same as ``autoalloc bench``."""
    return run(parser().parse_args(list(argv) if argv is not None else None))


def output_dir(args: argparse.Namespace) -> str:
    """``--out``, or (decided once, kept in ``args``) a new private directory under the user
    cache directory, as ``autoalloc ab`` uses: named on stderr."""
    if args.out is None:
        from autoalloc import cachedir

        args.out = cachedir.run_dir("bench")
        print(f"bench: logs, runs and results go to {args.out} (--out to choose)", file=sys.stderr)
    return str(args.out)


def run(args: argparse.Namespace) -> int:
    """Run the bench the options ask for; the exit status."""
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        print(f"autoalloc bench: unknown arm(s) {unknown}; known: {list(ARMS)}", file=sys.stderr)
        return 2
    os.makedirs(output_dir(args), exist_ok=True)
    if args.check_settings:
        return check_all_settings(args, make_arms(arms, _base(args), _write_policy(args.out)))
    return run_bench(args, arms)
