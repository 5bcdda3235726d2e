"""The synthetic ASR workload's batch schedule: duration-bucketed batches, as Lhotse draws them.

Utterance durations are LibriSpeech-like (log-normal, 1-35 s); buckets are duration
quantiles; a bucket emits a batch when it holds ``max_duration / bucket maximum``
utterances (Lhotse's DynamicBucketingSampler with fixed per-bucket batch sizes), so the
batch shape changes on nearly every step. Pure functions, no torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

FRAMES_PER_SECOND = 100  # 10 ms feature hop
TOKENS_PER_SECOND = 4.0
MIN_DURATION, MAX_DURATION = 1.0, 35.0


def draw_duration(rng: random.Random) -> float:
    """A LibriSpeech-like utterance duration in seconds: log-normal, clipped to 1-35 s."""
    return min(MAX_DURATION, max(MIN_DURATION, rng.lognormvariate(math.log(12.0), 0.5)))


def effective(duration: float, quadratic: float | None) -> float:
    """Lhotse's ``quadratic_duration``: long utterances count for more (attention is quadratic)."""
    return duration + duration * duration / quadratic if quadratic else duration


def bucket_bounds(num_buckets: int, seed: int) -> list[float]:
    """Each bucket's upper bound: quantiles of a sample (Lhotse's estimate_duration_bins)."""
    rng = random.Random(seed + 1)
    sample = sorted(draw_duration(rng) for _ in range(20000))
    bounds = [
        sample[min(len(sample) - 1, (len(sample) * (i + 1)) // num_buckets)]
        for i in range(num_buckets)
    ]
    bounds[-1] = MAX_DURATION
    return bounds


def make_schedule(
    steps: int,
    max_duration: float,
    num_buckets: int,
    seed: int,
    quadratic: float | None = None,
    static: bool = False,
) -> dict:
    """The batch schedule every arm replays: one list of utterance durations per step.

    Dynamic: utterances arrive in random order (fixed seed) and fill their duration
    bucket's batches (``floor(max_duration / bucket max)`` utterances, as the module's
    docstring says), so the bucket order is random too. Static: one bucket's full batch,
    every utterance at the bucket's maximum, on every step.
    """
    bounds = bucket_bounds(num_buckets, seed)
    sizes = [max(1, int(max_duration // effective(b, quadratic))) for b in bounds]
    batches: list[dict] = []
    if static:
        b = num_buckets // 2
        batches = [{"bucket": b, "durations": [bounds[b]] * sizes[b]} for _ in range(steps)]
    else:
        rng = random.Random(seed)
        queues: list[list[float]] = [[] for _ in bounds]
        while len(batches) < steps:
            d = draw_duration(rng)
            b = next(i for i, bound in enumerate(bounds) if d <= bound)
            queues[b].append(round(d, 2))
            if len(queues[b]) >= sizes[b]:
                batches.append({"bucket": b, "durations": queues[b]})
                queues[b] = []
    return {
        "kind": "static" if static else "dynamic",
        "seed": seed,
        "max_duration": max_duration,
        "quadratic_duration": quadratic,
        "bucket_bounds": [round(b, 2) for b in bounds],
        "batch_sizes": sizes,
        "batches": batches,
    }


def batch_shape(durations: Sequence[float]) -> tuple[list[int], list[int]]:
    """Feature frames and label tokens of each utterance of a batch."""
    frames = [max(8, round(d * FRAMES_PER_SECOND)) for d in durations]
    tokens = [max(1, round(d * TOKENS_PER_SECOND)) for d in durations]
    return frames, tokens


def schedule_summary(schedule: dict) -> dict:
    shapes = set()
    audio = 0.0
    for batch in schedule["batches"]:
        frames, _ = batch_shape(batch["durations"])
        shapes.add((len(frames), max(frames)))
        audio += sum(batch["durations"])
    sizes = [len(b["durations"]) for b in schedule["batches"]]
    longest = [frames for _, frames in shapes]
    return {
        "kind": schedule["kind"],
        "steps": len(schedule["batches"]),
        "distinct_shapes": len(shapes),
        "batch_size_range": [min(sizes), max(sizes)] if sizes else [],
        "max_frames_range": [min(longest), max(longest)] if longest else [],
        "audio_hours": round(audio / 3600, 3),
        "buckets": len(schedule["bucket_bounds"]),
        "batch_sizes": schedule["batch_sizes"],
    }


def probe_schedule(schedule: dict) -> dict:
    """The calibration probe's batches: each bucket's worst case (full batch at its maximum)."""
    batches = [
        {"bucket": i, "durations": [bound] * size}
        for i, (bound, size) in enumerate(zip(schedule["bucket_bounds"], schedule["batch_sizes"]))
    ]
    return {**schedule, "kind": "probe", "batches": [*batches, batches[0]]}
