"""Figures from ``AUTOALLOC_REPORT`` reports, the A/B comparison, its verdict and the tables.

Pure functions: reports (dicts) in, figures and text out. A run's figures come from its
rank-0 report (or its only one); ranks that differ from rank 0 are flagged.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from autoalloc.envvars import global_rank

GIB = 1024**3
Figures = dict[str, Any]


def quantile(values: Sequence[float], q: float) -> float | None:
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def step_times(report: Mapping[str, Any]) -> list[float]:
    """Seconds of each step after the warm-up (a step's time: from the previous step's end).
    A long run's report keeps the later steps thinned (``step_sample``: every ``every``-th
    step's time): the full ones are thinned alike, so each time stands for as many steps."""
    ends, sample = report.get("step_ends_s") or [], report.get("step_sample") or {}
    first = max(1, int(report.get("warmup") or 0))  # the first step has no previous end
    times = [ends[i] - ends[i - 1] for i in range(first, len(ends))]
    return times[:: sample.get("every", 1)] + sample.get("times_s", [])


def short_run(steps: int, warmup: int, use: str) -> str:
    """Why ``steps`` optimizer steps gave no step time, and what to ``use`` instead (formatted
    with the warm-up ``w`` and the steps ``s`` after it that would measure them)."""
    if steps < 2:
        return "it ran 1 optimizer step: a step time needs two (from the previous step's end)"
    w, fits = steps // 4, f"its {steps} optimizer steps all fell in the warm-up of {warmup}"
    return f"{fits}: no step was measured; use {use.format(w=w, s=steps - w)}"


def figures(report: Mapping[str, Any]) -> Figures:
    """One process's figures: steps, step time, allocator counters per step, peaks, settings."""
    times = step_times(report)
    cuda_steps = report.get("cuda_steps") or []
    settings = report.get("allocator_settings") or {}
    out: Figures = {
        "steps": report.get("steps", 0),
        "measured_steps": len(times),
        "steps_per_s": len(times) / sum(times) if times and sum(times) > 0 else None,
        "step_ms_median": 1000 * statistics.median(times) if times else None,
        "step_ms_p95": 1000 * quantile(times, 0.95) if times else None,  # type: ignore[operator]
        "cuda": bool(report.get("cuda")),
        "expandable_segments": settings.get("expandable_segments"),
        "device_name": report.get("device_name"),
    }
    if cuda_steps:
        out["mallocs_per_step"] = statistics.fmean(s["num_device_alloc"] for s in cuda_steps)
        out["frees_per_step"] = statistics.fmean(s["num_device_free"] for s in cuda_steps)
        out["retries"] = sum(s["num_alloc_retries"] for s in cuda_steps)
        out["ooms"] = sum(s["num_ooms"] for s in cuda_steps)
    for key in ("peak_reserved", "peak_allocated"):
        if report.get(key) is not None:
            out[f"{key}_gib"] = report[key] / GIB
    return out


def primary(reports: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Rank 0's report, else the one with the most steps."""
    for report in reports:
        if report_rank(report) == 0:
            return report
    return max(reports, key=lambda r: r.get("steps", 0), default=None)


def report_rank(report: Mapping[str, Any]) -> int | None:
    """The global rank a report was written by (None: not a distributed job)."""
    return global_rank(report.get("rank") or {})


def rank_flags(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    """Ranks whose step count or setting differ from rank 0's, or whose step time does by >20%."""
    main = primary(reports)
    if main is None or len(reports) < 2:
        return []
    ref, flags = figures(main), []
    for report in reports:
        if report is main:
            continue
        rank = report_rank(report)
        fig, who = figures(report), f"rank {report.get('pid') if rank is None else rank}"
        if fig["steps"] != ref["steps"]:
            flags.append(f"{who}: {fig['steps']} steps (rank 0: {ref['steps']})")
        if fig["expandable_segments"] != ref["expandable_segments"]:
            flags.append(f"{who}: expandable_segments={fig['expandable_segments']}")
        a, b = fig["step_ms_median"], ref["step_ms_median"]
        if a and b and abs(a / b - 1) > 0.2:
            flags.append(f"{who}: median step {a:.1f} ms (rank 0: {b:.1f} ms)")
    return flags


def run_figures(run: Mapping[str, Any]) -> Figures:
    """A run's figures (its primary report's), with how it ended and its rank flags."""
    main = primary(run["reports"])
    out = figures(main) if main is not None else {"steps": 0, "measured_steps": 0}
    out.update(
        ranks=len(run["reports"]),
        rank_flags=rank_flags(run["reports"]),
        ended_by=main.get("ended_by") if main else None,
        returncode=run["returncode"],
        timed_out=run["timed_out"],
        failed=not run["timed_out"] and run["returncode"] not in (0, None),
    )
    return out


ROWS: tuple[tuple[str, str, str], ...] = (
    ("steps/s", "steps_per_s", ".2f"),
    ("step time median (ms)", "step_ms_median", ".1f"),
    ("step time p95 (ms)", "step_ms_p95", ".1f"),
    ("device mallocs/step", "mallocs_per_step", ".2f"),
    ("alloc retries", "retries", ".0f"),
    ("OOMs", "ooms", ".0f"),
    ("peak reserved (GiB)", "peak_reserved_gib", ".2f"),
    ("peak allocated (GiB)", "peak_allocated_gib", ".2f"),
)


def arm_value(runs: Sequence[Figures], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None and not r.get("failed")]
    return statistics.median(values) if values else None


def ratios(on: Sequence[Figures], off: Sequence[Figures], key: str) -> list[float]:
    """on/off of ``key`` for each repeat (runs paired in the order they ran)."""
    out = []
    for a, b in zip(on, off):
        x, y = a.get(key), b.get(key)
        if x is not None and y and not a.get("failed") and not b.get("failed"):
            out.append(x / y)
    return out


def compare(arms: Mapping[str, Sequence[Figures]], a: str = "on", b: str = "off") -> dict[str, Any]:
    """Per row: each arm's value (median of its runs), the ratio a/b, its spread over repeats."""
    rows = {}
    for _, key, _ in (*ROWS, ("measured steps", "measured_steps", ".0f")):
        va, vb = arm_value(arms.get(a, ()), key), arm_value(arms.get(b, ()), key)
        r = ratios(arms.get(a, ()), arms.get(b, ()), key)
        rows[key] = {
            a: va,
            b: vb,
            "ratio": va / vb if va is not None and vb else None,
            "spread": [min(r), max(r)] if r else None,
        }
    return rows


def verdict(arms: Mapping[str, Sequence[Figures]], a: str = "on", b: str = "off") -> str:
    """One line that says what the runs show, and no more."""
    on, off = arms.get(a, ()), arms.get(b, ())
    ok_on = [r for r in on if not r.get("failed")]
    ok_off = [r for r in off if not r.get("failed")]
    if not ok_on or not ok_off:
        return f"no comparison: every run of the {a if not ok_on else b} arm failed"
    if all(r.get("ranks") == 0 for r in [*ok_on, *ok_off]):
        return "no comparison: no report came back from the command (see the note above)"
    if not any(r.get("cuda") for r in [*ok_on, *ok_off]):
        return (
            "no comparison: the command ran on the CPU, where the CUDA allocator option "
            "does nothing; this run checked the plumbing only, figures need a GPU"
        )
    if not any(r.get("measured_steps") for r in [*ok_on, *ok_off]):
        return "no step was measured (see the notes): step times are not compared, only memory is"
    meds_a = [r["step_ms_median"] for r in ok_on if r.get("step_ms_median")]
    meds_b = [r["step_ms_median"] for r in ok_off if r.get("step_ms_median")]
    ratio = statistics.median(meds_a) / statistics.median(meds_b)
    mallocs = _mallocs(ok_on, ok_off, a, b)
    if len(meds_a) < 2 or len(meds_b) < 2:
        return (
            f"step time {a}/{b} x{ratio:.3f} from one run per arm: no spread to judge it by "
            f"(use --repeat 2 or more){mallocs}"
        )
    if max(meds_a) < min(meds_b):
        return f"{a} is faster: step time x{ratio:.3f} (every {a} run beat every {b} run){mallocs}"
    if min(meds_a) > max(meds_b):
        return f"{a} is slower: step time x{ratio:.3f} (every {b} run beat every {a} run){mallocs}"
    return (
        f"no measurable difference in step time (x{ratio:.3f}; the spread across repeats "
        f"covers it){mallocs}"
    )


def _mallocs(on: Sequence[Figures], off: Sequence[Figures], a: str, b: str) -> str:
    x, y = arm_value(on, "mallocs_per_step"), arm_value(off, "mallocs_per_step")
    return "" if x is None or y is None else f"; device mallocs/step {b} {y:.2f} -> {a} {x:.2f}"


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_ab(result: Mapping[str, Any], a: str = "on", b: str = "off", notes: bool = True) -> str:
    """The side-by-side table of an A/B, its notes and its verdict."""
    arms = {name: [run["figures"] for run in runs] for name, runs in result["runs_by_arm"].items()}
    rows = compare(arms, a, b)
    ran = [r for runs in arms.values() for r in runs if not r.get("failed")]
    cpu = bool(ran) and not any(r.get("cuda") for r in ran)
    head = f"{'':<24}{a:>12}{b:>12}" + ("" if cpu else f"{a + '/' + b:>10}  spread over repeats")
    lines = [head, "-" * len(head)]
    # On the CPU the allocator option does nothing: step times there differ by noise alone
    # (x3 either way on a busy machine) and would read as a verdict. Only the step counts.
    shown = (("measured steps", "measured_steps", ".0f"),) if cpu else ROWS
    for label, key, spec in shown:
        row = rows[key]
        line = f"{label:<24}{_cell(row[a], spec):>12}{_cell(row[b], spec):>12}"
        if not cpu and row["ratio"] is not None:
            spread = row["spread"]
            line += f"{row['ratio']:>10.3f}" + (
                f"  {spread[0]:.3f}-{spread[1]:.3f}" if spread else ""
            )
        lines.append(line)
    for name in (a, b):
        es = sorted({str(r.get("expandable_segments")) for r in arms.get(name, ())})
        ok = sum(1 for r in arms.get(name, ()) if not r.get("failed"))
        lines.append(
            f"{name}: {ok}/{len(arms.get(name, ()))} runs ok; "
            f"torch reported expandable_segments={'/'.join(es)}"
        )
    if notes:
        lines.extend(f"note: {note}" for note in result.get("notes", ()))
    if cpu:
        lines.append(
            "CPU: step times and memory are not compared (the option acts on CUDA memory only; "
            "ab.json keeps the raw figures); this checked the plumbing (arms, stop, reports)"
        )
    lines.append("verdict: " + verdict(arms, a, b))
    return "\n".join(lines)


def _setting(report: Mapping[str, Any]) -> str:
    decision = report.get("decision") or {}
    es = (report.get("allocator_settings") or {}).get("expandable_segments")
    rule = f" (rule {decision['rule']})" if decision.get("rule") else ""
    return f"expandable_segments={es}, {decision.get('action') or 'no decision'}{rule}"


def differing_ranks(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line naming the ranks whose setting differs from rank 0's (nodes of one job decide
    separately: a node-local policy can make them disagree); nothing when all agree."""
    ranked = [r for r in reports if isinstance(report_rank(r), int)]
    main = next((r for r in ranked if report_rank(r) == 0), None)
    if main is None:
        return []
    ref = _setting(main)
    odd: dict[str, list[tuple[int, str]]] = {}
    for report in ranked:
        if _setting(report) != ref:
            host = str(report.get("host", "?")).split(".")[0]
            odd.setdefault(_setting(report), []).append((report_rank(report) or 0, host))
    return [
        f"ranks differ: rank {', '.join(f'{r} ({h})' for r, h in sorted(who))} got {setting}; "
        f"rank 0 got {ref}"
        for setting, who in odd.items()
    ]


NAME_WIDTH = 33  # the report column: longer names keep their end, after a marker


def cut_left(text: str, width: int = NAME_WIDTH) -> str:
    """``text`` in ``width`` characters: a longer one loses its beginning, marked ``…``."""
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def rank_cell(report: Mapping[str, Any]) -> str:
    """The rank column: the global rank; a process with only ``LOCAL_RANK`` (Lightning's
    re-launched DDP ranks, before the process group sets ``RANK``) as ``local N``."""
    rank = report_rank(report)
    if rank is not None:
        return str(rank)
    local = (report.get("rank") or {}).get("LOCAL_RANK")
    return f"local {local}" if isinstance(local, int) else "-"


def _at(when: str) -> str:
    if when == "import torch":
        return "at `import torch`"
    if when == "adaptive":
        return "when adaptive saw the re-allocations"
    return f"at its {when}"  # its first optimizer; its import of M


def applied_text(decision: Mapping[str, Any]) -> str:
    """When and how a report's decision reached torch, as a sentence's end: ``rule R at its
    first optimizer, through the runtime setter, before any optimizer step``."""
    rule = f"rule {decision.get('rule')}" if decision.get("rule") else "autoalloc"
    when, how = str(decision.get("when") or "import torch"), decision.get("how")
    if how == "environment":
        way = "in the environment, before torch started"
    elif how == "runtime setter":
        way = "through the runtime setter"
        if decision.get("setter_error"):
            way += f" (torch rejected it: {decision['setter_error']})"
    else:
        way = "with nothing written"
    step = decision.get("at_step")
    if how != "runtime setter" or not isinstance(step, int):
        return f"{rule} {_at(when)}, {way}"
    steps = f"after {step} optimizer step{'' if step == 1 else 's'}"
    steps = steps if step else "before any optimizer step"
    return f"{rule} {_at(when)}, {way}, {steps}"


def _decision_cell(decision: Mapping[str, Any]) -> str:
    """The decision column: action and rule, and for an apply how it reached torch."""
    what = str(decision.get("action") or "-")
    if decision.get("rule"):
        what += f" {decision['rule']}"
    if decision.get("action") != "apply":
        return what
    if decision.get("how") == "environment":
        return f"{what} (environment, before torch started)"
    if decision.get("how") == "runtime setter":
        return f"{what} (runtime setter at {decision.get('when')}, step {decision.get('at_step')})"
    return what


def render_reports(reports: Sequence[Mapping[str, Any]]) -> str:
    """``autoalloc report``: one row per process report."""
    head = (
        f"{'report':<34}{'rank':>8}{'steps':>7}{'steps/s':>9}{'med ms':>8}{'p95 ms':>8}"
        f"{'mallocs':>8}{'retries':>8}{'OOMs':>5}{'resv GiB':>9}{'alloc GiB':>10}  ES     decision"
    )
    lines = [head, "-" * len(head)]
    for report in reports:
        fig = figures(report)
        name = cut_left(os.path.basename(str(report.get("file", report.get("pid", "?")))))
        lines.append(
            f"{name:<34}{rank_cell(report):>8}{fig['steps']:>7}"
            f"{_cell(fig['steps_per_s'], '.2f'):>9}{_cell(fig['step_ms_median'], '.1f'):>8}"
            f"{_cell(fig['step_ms_p95'], '.1f'):>8}{_cell(fig.get('mallocs_per_step'), '.2f'):>8}"
            f"{_cell(fig.get('retries'), 'd'):>8}{_cell(fig.get('ooms'), 'd'):>5}"
            f"{_cell(fig.get('peak_reserved_gib'), '.2f'):>9}"
            f"{_cell(fig.get('peak_allocated_gib'), '.2f'):>10}"
            f"  {fig['expandable_segments']!s:<6} {_decision_cell(report.get('decision') or {})}"
        )
    lines += differing_ranks(reports)
    lines += _signal_lines(reports)
    devices = sorted({str(r.get("device_name")) for r in reports})
    lines.append(
        f"device: {', '.join(devices)}; step time: wall time from the previous optimizer step's end"
    )
    lines.append("ES: expandable_segments, as torch itself reported it at the process's exit")
    if not any(r.get("cuda") for r in reports):
        lines.append(
            "mallocs (device mallocs per step), retries, OOMs, resv/alloc GiB (peak memory): "
            "CUDA allocator counters; these processes did not use CUDA, so they show -"
        )
    return "\n".join(lines)


def _signal_lines(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per process that survived a signal and went on (its report covers it all),
    that left no final report, or whose steps gave no step time (and what to set)."""
    out = []
    for report in reports:
        caught = [s for s in report.get("signals") or () if isinstance(s, dict)]
        who = cut_left(os.path.basename(str(report.get("file", report.get("pid", "?")))))
        if caught and report.get("ended_by") == "exit":
            got = ", ".join(f"{s.get('signal')} at step {s.get('at_step')}" for s in caught)
            out.append(f"{who}: went on after {got}; its report covers the whole run")
        if report.get("ended_by") == "running":
            out.append(f"{who}: no final report (the process ended without a normal exit, e.g. "
                       "os._exit or SIGKILL, or runs still): figures up to its last interim one")
        if report.get("steps") and not step_times(report):
            warmup, use = int(report.get("warmup") or 0), "AUTOALLOC_REPORT_WARMUP={w}"
            out.append(f"{who}: {short_run(report['steps'], warmup, use)}")
    return out
