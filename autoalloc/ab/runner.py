"""Run the arms of an A/B: each run of the command in its own process, with progress as it goes.

One runner serves ``autoalloc ab`` (the user's command, on and off) and ``autoalloc bench``
(the synthetic workload and its extra arms). Each run gets ``AUTOALLOC_REPORT`` (a
directory of its own), the warm-up and the stop-after step count, and the runner reads
back the reports the run's processes wrote. A run that outlives ``timeout`` is sent
SIGTERM (its processes write their reports), then SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from autoalloc.ab.arms import Arm, interleave
from autoalloc.ab.table import applied_text, primary, run_figures, short_run
from autoalloc.envvars import PROGRESS_VAR, REPORT_VAR, STOP_VAR, WARMUP_VAR

TERM_GRACE_S = 15.0
STDERR_TAIL = 12


@dataclass
class Run:
    """One run of one arm: how it ended and the reports its processes wrote."""

    arm: str
    repeat: int
    command: list[str]
    returncode: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    directory: str = ""
    stderr_tail: list[str] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """The command failed: a non-zero exit that was not ours (a stop, or a timeout we sent)."""
        return not self.timed_out and self.returncode not in (0, None)


@dataclass(frozen=True)
class Plan:
    """What every run measures."""

    steps: int
    warmup: int
    repeat: int
    timeout: float
    out: str
    deadline: float | None = None  # seconds: start no run that would end after this


class Progress:
    """Which arm and step a run is at: a bar on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO, total_runs: int, total_steps: int, warmup: int = 0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.total_runs = total_runs
        self.total_steps = total_steps
        self.warmup = warmup
        self.last_line = 0.0
        self.last_steps = -1
        self.current = 0

    def update(self, index: int, arm: str, repeat: int, steps: int, elapsed: float) -> None:
        head = f"[{index}/{self.total_runs}] {arm} (repeat {repeat}): "
        if index != self.current:  # a new run: its own first line
            self.current, self.last_line, self.last_steps = index, 0.0, -1
        if self.tty:
            done = min(1.0, steps / self.total_steps) if self.total_steps else 0.0
            bar = "#" * int(done * 30)
            self.stream.write(f"\r{head}[{bar:<30}] {self.where(steps)} {elapsed:5.0f} s ")
            self.stream.flush()
        elif steps != self.last_steps and (
            elapsed - self.last_line >= 5 or steps >= self.total_steps
        ):
            self.last_line, self.last_steps = elapsed, steps
            print(f"{head}{self.where(steps)} after {elapsed:.0f} s", file=self.stream, flush=True)

    def where(self, steps: int) -> str:
        """``warm-up step 9/20`` during the warm-up, then ``step 3/20`` of the measured ones."""
        if steps <= self.warmup:
            return f"warm-up step {steps}/{self.warmup}"
        return f"step {steps - self.warmup}/{self.total_steps - self.warmup}"

    def done(self, index: int, run: Run) -> None:
        steps = max((r.get("steps", 0) for r in run.reports), default=0)
        how = "timed out" if run.timed_out else "done"
        how = f"FAILED (exit {run.returncode})" if run.failed else how
        if self.tty:
            self.stream.write("\r\033[K")
        line = f"[{index}/{self.total_runs}] {run.arm} (repeat {run.repeat}): {how}, "
        line += f"{steps} step{'' if steps == 1 else 's'}, {run.wall_s:.1f} s"
        print(line, file=self.stream, flush=True)


def read_reports(directory: str) -> list[dict[str, Any]]:
    """The reports in a run's directory, rank order (processes without a rank last)."""
    from autoalloc.ab.reports import by_rank, read_directory

    return by_rank(r for v in read_directory(directory) for r in v.reports)


def _read_steps(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run's process group (reports get written), SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_environment(
    arm: Arm, plan: Plan, directory: str, base: Mapping[str, str]
) -> dict[str, str]:
    env = arm.environ(base)
    env[REPORT_VAR] = os.path.join(directory, "reports") + os.sep
    env[WARMUP_VAR] = str(plan.warmup)
    env[STOP_VAR] = str(plan.steps)
    env[PROGRESS_VAR] = os.path.join(directory, "progress")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_once(arm: Arm, repeat: int, index: int, plan: Plan, progress: Progress) -> Run:
    """One run of ``arm``: start it, follow it, end it at the timeout, read its reports."""
    directory = os.path.join(os.path.abspath(plan.out), "runs", f"{arm.name}-{repeat}")
    shutil.rmtree(directory, ignore_errors=True)  # a previous ab run's, in the same --out
    os.makedirs(os.path.join(directory, "reports"))
    env = run_environment(arm, plan, directory, os.environ)
    run = Run(arm.name, repeat, list(arm.command), directory=directory)
    started = time.perf_counter()
    with (
        open(os.path.join(directory, "stdout.log"), "wb") as out,
        open(os.path.join(directory, "stderr.log"), "wb") as err,
    ):
        try:
            process = subprocess.Popen(
                list(arm.command),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # the whole job (torchrun's ranks, workers) ends together
            )
        except OSError as exc:
            err.write(f"cannot start {arm.command[0]!r}: {exc}\n".encode())
            run.returncode = 127
        else:
            run.returncode, run.timed_out = _follow(process, run, index, plan, progress, started)
    run.wall_s = round(time.perf_counter() - started, 2)
    with open(os.path.join(directory, "stderr.log"), encoding="utf-8", errors="replace") as f:
        run.stderr_tail = f.read().splitlines()[-STDERR_TAIL:]
    run.reports = read_reports(os.path.join(directory, "reports"))
    progress.done(index, run)
    return run


def _follow(
    process: subprocess.Popen[bytes],
    run: Run,
    index: int,
    plan: Plan,
    progress: Progress,
    started: float,
) -> tuple[int | None, bool]:
    progress_file = os.path.join(run.directory, "progress")
    total = plan.steps + plan.warmup
    try:
        while True:
            try:
                return process.wait(0.2), False
            except subprocess.TimeoutExpired:
                pass
            elapsed = time.perf_counter() - started
            progress.update(
                index, run.arm, run.repeat, min(total, _read_steps(progress_file)), elapsed
            )
            if elapsed > plan.timeout:
                _end(process)
                return process.returncode, True
    except KeyboardInterrupt:
        _end(process)
        raise


def run_all(arms: Sequence[Arm], plan: Plan, stream: TextIO = sys.stderr) -> list[Run]:
    """Every arm ``plan.repeat`` times, interleaved, one after the other."""
    order = interleave(arms, plan.repeat)
    progress = Progress(stream, len(order), plan.steps + plan.warmup, plan.warmup)
    started, runs = time.perf_counter(), []
    for i, (arm, repeat) in enumerate(order, 1):
        elapsed = time.perf_counter() - started
        if plan.deadline and runs and elapsed + runs[-1].wall_s > plan.deadline:
            print(
                f"[{i}/{len(order)}] {arm.name} (repeat {repeat}): skipped (--deadline)",
                file=stream,
            )
            continue
        runs.append(run_once(arm, repeat, i, plan, progress))
    return runs


def result(
    arms: Sequence[Arm], plan: Plan, runs: Sequence[Run], notes: Sequence[str]
) -> dict[str, Any]:
    """The A/B as data (the JSON): plan, arms, every run with its figures, notes."""
    by_arm: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    for run in runs:
        data = asdict(run)
        data["figures"] = run_figures(data)
        by_arm[run.arm].append(data)
    return {
        "schema": "autoalloc-ab/1",
        "plan": asdict(plan),
        "arms": {arm.name: {**asdict(arm), "command": list(arm.command)} for arm in arms},
        "runs_by_arm": by_arm,
        "notes": list(notes) + run_notes(arms, plan, by_arm),
    }


def hook_notes(arm: Arm, tag: str, run: Mapping[str, Any]) -> list[str]:
    """What autoalloc's hook did in a run of an arm that leaves the options to it, from the
    run's report: when and how it applied them (for a late decision, always said), or that
    it did not after all."""
    report = primary(run["reports"])
    if report is None:
        return []
    decision = report.get("decision") or {}
    if decision.get("action") == "apply":
        return [f"{tag}: autoalloc applied {applied_text(decision)}"] if arm.late else []
    why = decision.get("reason") or "no decision reached the report"
    return [
        f"{tag}: autoalloc did not apply the options in this run after all "
        f"({decision.get('action') or 'no decision'}: {why}); this run measured without them"
    ]


def run_notes(
    arms: Sequence[Arm], plan: Plan, by_arm: Mapping[str, list[dict[str, Any]]]
) -> list[str]:
    """What the reader must know: failures (exit code, stderr), no steps, settings, ranks."""
    notes = []
    if not any(run["reports"] for runs in by_arm.values() for run in runs):
        notes.append(
            "no report came back from any run: no process of the command imported torch, or "
            "the command runs a Python that does not have autoalloc (install autoalloc into "
            "the Python that runs the trainer, and use that environment's `autoalloc ab`)"
        )
    intents = {arm.name: arm.intent for arm in arms}
    hooked = {arm.name: arm for arm in arms if arm.hooked}
    for name, runs in by_arm.items():
        for run in runs:
            fig, tag = run["figures"], f"{name} run {run['repeat']}"
            if name in hooked:
                notes.extend(hook_notes(hooked[name], tag, run))
            if fig["failed"]:
                tail = "\n    ".join(run["stderr_tail"][-6:])
                notes.append(
                    f"{tag} FAILED with exit code {run['returncode']}; "
                    f"last stderr lines:\n    {tail}"
                )
            elif run["timed_out"] and not fig["steps"]:
                notes.append(
                    f"{tag}: no optimizer step was seen in {plan.timeout:.0f} s (--timeout): "
                    "the command never called torch.optim's Optimizer.step, so step times "
                    "cannot be compared; the comparison is about memory only"
                )
            elif run["timed_out"]:
                notes.append(
                    f"{tag}: timed out after {fig['steps']} steps (of {plan.warmup + plan.steps})"
                )
            if not fig["failed"] and fig["steps"] and not fig["measured_steps"]:
                use = "--warmup {w} --steps {s}"
                notes.append(f"{tag}: {short_run(fig['steps'], plan.warmup, use)}")
            seen, intent = fig.get("expandable_segments"), intents.get(name)
            if intent is not None and seen is not None and seen != intent:
                notes.append(
                    f"{tag}: torch reported expandable_segments={seen}, the arm intended {intent}"
                )
            notes.extend(f"{tag}: {flag}" for flag in fig.get("rank_flags", ()))
    return notes
