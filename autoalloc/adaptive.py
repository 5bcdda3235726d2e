"""``adaptive``: notice, in a running trainer, that the CUDA allocator re-allocates on most steps.

The detector (``detect``) is a pure function of per-step allocator counters: the records of
``counters.StepSampler`` (``num_device_alloc``, ``num_device_free``, ``num_alloc_retries``
deltas between optimizer steps, ``reserved``/``allocated`` bytes at the step boundary).
``Watch`` samples those counters at each optimizer step of a CUDA process (or reads the
sampler of ``AUTOALLOC_REPORT``'s recorder, which the hook passes in), runs the detector, and
on a finding calls back once: the hook then warns (``advise``) or turns the options on
through the runtime setter and releases the cached segments (``apply``). On a CPU build
nothing is registered.

Thresholds (docs/recognition.md, "Adaptive"), each with its reason:

- ``warmup = 20`` steps are ignored: the first steps allocate the optimizer state, cuDNN/cuBLAS
  workspaces and the first batch of each shape, on every allocator setting.
- ``window = 50`` steps are judged together, so a one-off event (an evaluation pass, a
  checkpoint) is a small share of them.
- ``malloc_share = 0.5``: the symptom is device mallocs on *most* steps after warm-up (what the
  NeMo profile showed); a steady static-shape run reaches zero after warm-up.
- ``retry_episodes = 3``: an allocation retry (a failed cudaMalloc, the cache flushed, tried
  again) is the expensive path. One evaluation pass can cause retries on a few consecutive
  steps; retries in three separate runs of steps within a window are a pattern.
- ``reserved / allocated`` is reported, never a trigger on its own: at a step boundary the cache
  legitimately still holds the activations just freed, so the ratio is high on healthy runs too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoalloc.counters import StepSampler


@dataclass(frozen=True)
class Thresholds:
    """When a run counts as re-allocating on most steps (see the module docstring for why)."""

    warmup: int = 20
    window: int = 50
    malloc_share: float = 0.5
    retry_episodes: int = 3


@dataclass(frozen=True)
class Finding:
    """What the detector saw in the last window of steps."""

    steps: int  # steps judged
    malloc_steps: int  # steps with at least one device malloc
    mallocs_per_step: float
    retry_steps: int  # steps with at least one allocation retry
    reserved_over_allocated: float | None
    retry_episodes: int = 0  # runs of consecutive steps with retries

    def describe(self) -> str:
        ratio = self.reserved_over_allocated
        reserved = f", reserved/allocated {ratio:.1f}x" if ratio is not None else ""
        return (
            f"device mallocs on {self.malloc_steps} of the last {self.steps} optimizer steps "
            f"({self.mallocs_per_step:.1f} per step), allocation retries on {self.retry_steps}"
            f"{reserved}"
        )


def detect(
    records: Sequence[Mapping[str, int]], limits: Thresholds = Thresholds()
) -> Finding | None:
    """The symptom in per-step counter deltas, or None (too few steps, or a healthy run).

    ``records`` are one per optimizer step, in order, each with a ``step`` number (1 = first
    step) and the counter deltas since the previous step.
    """
    after = [r for r in records if int(r.get("step", 0)) > limits.warmup]
    if len(after) < limits.window:
        return None
    last = after[-limits.window :]
    mallocs = [int(r.get("num_device_alloc", 0)) for r in last]
    malloc_steps = sum(1 for m in mallocs if m > 0)
    retried = [int(r.get("num_alloc_retries", 0)) > 0 for r in last]
    episodes = sum(1 for i, now in enumerate(retried) if now and (i == 0 or not retried[i - 1]))
    if malloc_steps < limits.malloc_share * len(last) and episodes < limits.retry_episodes:
        return None
    mean = sum(mallocs) / len(last)
    return Finding(len(last), malloc_steps, mean, sum(retried), _ratio(last), episodes)


def _ratio(records: Sequence[Mapping[str, int]]) -> float | None:
    pairs = sorted(
        int(r["reserved"]) / int(r["allocated"])
        for r in records
        if int(r.get("allocated", 0)) > 0 and "reserved" in r
    )
    return pairs[len(pairs) // 2] if pairs else None


def advice(finding: Finding, command: Sequence[str]) -> str:
    """The one warning of ``advise``: the figures, the command to measure, the rule to add."""
    cmd = " ".join(command) if command else "<your command>"
    script = next((os.path.basename(a) for a in command if a.endswith(".py")), "train.py")
    return (
        f"autoalloc: the CUDA allocator re-allocates on most steps ({finding.describe()}). "
        f"expandable_segments may help: measure with `autoalloc ab -- {cmd}`, or turn it on for "
        f'this program with a rule in autoalloc.toml ([[rules]] name = "my-trainer" scripts = '
        f'["{script}"]), or set adaptive = "apply"'
    )


def applied_message(finding: Finding) -> str:
    return (
        f"autoalloc: the CUDA allocator re-allocated on most steps ({finding.describe()}): "
        "expandable_segments turned on through the runtime setter and the unused cached "
        'segments released (adaptive = "apply")'
    )


class Watch:
    """Per-step sampling of the allocator counters in a CUDA process, feeding ``detect``.

    ``shared``: a sampler that already reads the counters at each step from no later than
    the warm-up (the recorder's); the watch then judges its records and reads nothing itself.
    """

    def __init__(self, torch: Any, on_finding: Callable[[Finding], None],
                 limits: Thresholds = Thresholds(), shared: StepSampler | None = None) -> None:
        self.torch = torch
        self.on_finding = on_finding
        self.limits = limits
        self.shared = shared is not None and shared.start <= limits.warmup
        self.sampler = shared if shared is not None and self.shared else StepSampler(
            limits.warmup, keep=limits.window  # only the last window is judged
        )
        self.steps = 0
        self.handle: Any = None
        self.done = False

    @property
    def records(self) -> list[dict[str, int]]:
        return self.sampler.records

    def on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.done:
            return
        try:
            self._step()
        except Exception:  # never break the user's optimizer step
            self.stop()

    def _step(self) -> None:
        self.steps += 1
        if self.steps < self.limits.warmup or not self.torch.cuda.is_initialized():
            return
        stats = None if self.shared else self.torch.cuda.memory_stats()
        finding = self.observe(stats)
        if finding is not None:
            self.stop()
            self.on_finding(finding)

    def observe(self, stats: Mapping[str, int] | None) -> Finding | None:
        """Take this step's ``memory_stats()`` (None: the shared sampler took it); judge every
        10 steps."""
        if stats is not None:
            self.sampler.add(self.steps, stats)
        if self.steps % 10 == 0 or self.steps == self.limits.warmup + self.limits.window:
            return detect(self.sampler.records, self.limits)
        return None

    def stop(self) -> None:
        self.done = True
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def install(
    torch: Any, on_finding: Callable[[Finding], None], shared: StepSampler | None = None
) -> Watch | None:
    """Watch this process's optimizer steps; None on a build without CUDA (nothing to watch).

    ``shared``: the recorder's sampler, when ``AUTOALLOC_REPORT`` records this process.
    """
    if not getattr(torch.version, "cuda", None):
        return None
    import torch.optim.optimizer as optimizer_module

    watch = Watch(torch, on_finding, shared=shared)
    watch.handle = optimizer_module.register_optimizer_step_post_hook(watch.on_step)
    return watch
