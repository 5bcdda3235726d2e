"""Per-step samples of the CUDA allocator counters: the one sampler of ``memory_stats()``.

``AUTOALLOC_REPORT``'s recorder and ``adaptive`` both judge a run by the deltas of the
allocator counters between optimizer steps; this module reads them and builds that record.
The hook wires them: when the recorder samples from a step no later than ``adaptive``'s
warm-up, ``adaptive`` reads the recorder's sampler instead of calling ``memory_stats()`` a
second time at each step.

One record per step after the first sample: ``step`` (1 = the first optimizer step), the
deltas of ``COUNTERS`` since the previous sample, and ``reserved``/``allocated`` bytes at the
step boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")


def totals(stats: Mapping[str, Any]) -> dict[str, int]:
    """The counters of one ``memory_stats()`` (0 for a key this torch does not report)."""
    return {key: int(stats.get(key, 0)) for key in COUNTERS}


class StepSampler:
    """The counter deltas of each optimizer step from step ``start`` on (the last ``keep``)."""

    def __init__(self, start: int = 1, keep: int | None = None) -> None:
        self.start = start
        self.keep = keep
        self.reset()

    def reset(self) -> None:
        self.records: list[dict[str, int]] = []
        self.previous: dict[str, int] | None = None

    def add(self, step: int, stats: Mapping[str, Any]) -> None:
        """Take step ``step``'s ``memory_stats()``: one record more from the second on."""
        now = totals(stats)
        if self.previous is not None:
            record = {key: now[key] - self.previous[key] for key in COUNTERS}
            record["step"] = step
            record["reserved"] = int(stats.get("reserved_bytes.all.current", 0))
            record["allocated"] = int(stats.get("allocated_bytes.all.current", 0))
            self.records.append(record)
            if self.keep is not None:
                del self.records[: -self.keep]
        self.previous = now
