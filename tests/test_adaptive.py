"""The ``adaptive`` detector on per-step allocator counters, in the recorder's record format.

The sequences are shaped like the four cases the thresholds are set for: a steady static-shape
run, dynamic buckets near the memory cap (mallocs and frees on most steps), a warm-up spike
that settles, and one evaluation pass in an otherwise steady run.
"""

from __future__ import annotations

import random

from autoalloc import adaptive
from autoalloc.adaptive import Thresholds, detect

GiB = 1 << 30


def record(step: int, mallocs: int = 0, frees: int = 0, retries: int = 0,
           reserved: float = 10.0, allocated: float = 6.0) -> dict[str, int]:
    return {"step": step, "num_device_alloc": mallocs, "num_device_free": frees,
            "num_alloc_retries": retries, "num_ooms": 0,
            "reserved": int(reserved * GiB), "allocated": int(allocated * GiB)}


def steady(steps: int = 120) -> list[dict[str, int]]:
    """Static shapes: every block is cached after the first steps; then no device calls."""
    return [record(s, mallocs=6 if s <= 3 else 0) for s in range(1, steps + 1)]


def dynamic(steps: int = 120, seed: int = 0) -> list[dict[str, int]]:
    """Bucketed batches near the cap: a new shape misses the cache, the cache is flushed."""
    rng = random.Random(seed)
    out = []
    for s in range(1, steps + 1):
        churn = rng.random() < 0.8
        mallocs = rng.randint(2, 12) if churn else 0
        out.append(record(s, mallocs, frees=mallocs, retries=int(rng.random() < 0.1),
                          reserved=70 + rng.random() * 8, allocated=30 + rng.random() * 20))
    return out


def test_steady_static_shapes_are_healthy():
    assert detect(steady()) is None


def test_dynamic_buckets_are_the_symptom():
    finding = detect(dynamic())
    assert finding is not None
    assert finding.steps == 50 and finding.malloc_steps >= 25
    assert finding.reserved_over_allocated is not None and finding.reserved_over_allocated > 1
    assert "of the last 50 optimizer steps" in finding.describe()


def test_a_warm_up_spike_is_ignored():
    # mallocs on every step up to step 30 (first buckets, optimizer state), then steady
    seq = [record(s, mallocs=20 if s <= 30 else 0, retries=1 if s <= 25 else 0) for s in range(1, 121)]
    assert detect(seq) is None


def test_a_one_off_eval_pass_is_ignored():
    seq = steady(150)
    for s in range(80, 84):  # the steps around an evaluation pass: new shapes, one retry
        seq[s - 1] = record(s, mallocs=40, frees=35, retries=1 if s == 80 else 0)
    assert detect(seq) is None


def test_too_few_steps_after_warm_up_say_nothing():
    assert detect(dynamic(steps=60)) is None  # 40 steps after the warm-up of 20
    assert detect([]) is None


def test_retries_on_several_steps_are_the_symptom_even_with_few_mallocs():
    seq = steady(100)
    for s in (55, 70, 85, 95):
        seq[s - 1] = record(s, mallocs=1, retries=2)
    finding = detect(seq)
    assert finding is not None and finding.retry_steps == 4


def test_only_the_last_window_counts():
    # dynamic for a while, then ES turned on (or the shapes settled): healthy again
    seq = dynamic(80) + [record(s, reserved=40, allocated=38) for s in range(81, 161)]
    assert detect(seq) is None
    assert detect(seq[:80]) is not None


def test_thresholds_are_parameters():
    seq = dynamic()
    assert detect(seq, Thresholds(malloc_share=0.99, retry_steps=100)) is None
    assert detect(seq, Thresholds(warmup=0, window=10)) is not None


def test_advice_names_the_command_and_the_rule():
    finding = detect(dynamic())
    assert finding is not None
    text = adaptive.advice(finding, ["python", "/data/run/finetune.py", "--lr", "1e-4"])
    assert "autoalloc ab -- python /data/run/finetune.py --lr 1e-4" in text
    assert 'scripts = ["finetune.py"]' in text
    assert "expandable_segments turned on" in adaptive.applied_message(finding)
