"""The ``adaptive`` detector on per-step allocator counters, in the recorder's record format.

The sequences are shaped like the four cases the thresholds are set for: a steady static-shape
run, dynamic buckets near the memory cap (mallocs and frees on most steps), a warm-up spike
that settles, and one evaluation pass in an otherwise steady run.
"""

from __future__ import annotations

import json
import random
import textwrap

import pytest

from autoalloc import adaptive, counters
from autoalloc.adaptive import Thresholds, detect
from tests.helpers import PROBE, probe_result

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
    seq = [record(s, mallocs=20 if s <= 30 else 0, retries=int(s <= 25)) for s in range(1, 121)]
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
    assert finding is not None and finding.retry_steps == finding.retry_episodes == 4


def test_only_the_last_window_counts():
    # dynamic for a while, then ES turned on (or the shapes settled): healthy again
    seq = dynamic(80) + [record(s, reserved=40, allocated=38) for s in range(81, 161)]
    assert detect(seq) is None
    assert detect(seq[:80]) is not None


def test_thresholds_are_parameters():
    seq = dynamic()
    assert detect(seq, Thresholds(malloc_share=0.99, retry_episodes=100)) is None
    assert detect(seq, Thresholds(warmup=0, window=10)) is not None


def test_advice_names_the_command_and_the_rule():
    finding = detect(dynamic())
    assert finding is not None
    text = adaptive.advice(finding, ["python", "/data/run/finetune.py", "--lr", "1e-4"])
    assert "autoalloc ab -- python /data/run/finetune.py --lr 1e-4" in text
    assert 'scripts = ["finetune.py"]' in text
    assert "expandable_segments turned on" in adaptive.applied_message(finding)


def cumulative(records: list[dict[str, int]]) -> list[dict[str, int]]:
    """What torch.cuda.memory_stats() would have said at each step, given the per-step deltas."""
    totals = dict.fromkeys(counters.COUNTERS, 0)
    out = []
    for r in records:
        for key in counters.COUNTERS:
            totals[key] += r[key]
        out.append({**totals, "reserved_bytes.all.current": r["reserved"],
                    "allocated_bytes.all.current": r["allocated"]})
    return out


def watch_over(records: list[dict[str, int]]) -> tuple[int, adaptive.Finding] | None:
    """Feed a Watch the memory_stats of each step from the warm-up on, as the step hook does."""
    watch = adaptive.Watch(torch=None, on_finding=lambda f: None)
    for step, stats in enumerate(cumulative(records), start=1):
        if step < watch.limits.warmup:
            continue
        watch.steps = step
        finding = watch.observe(stats)
        if finding is not None:
            return step, finding
    return None


def test_the_watch_finds_dynamic_buckets_soon_after_the_window_fills():
    step, finding = watch_over(dynamic(200))
    assert step == 70 and finding.steps == 50  # warm-up 20 + window 50
    assert finding.malloc_steps == sum(1 for r in dynamic(200)[20:70] if r["num_device_alloc"])


def test_the_watch_stays_quiet_on_healthy_runs():
    assert watch_over(steady(300)) is None
    spiky = steady(300)
    for s in range(150, 154):
        spiky[s - 1] = record(s, mallocs=40, retries=1)
    assert watch_over(spiky) is None


def test_the_watch_keeps_only_one_window():
    watch = adaptive.Watch(torch=None, on_finding=lambda f: None)
    for step, stats in enumerate(cumulative(steady(500)), start=1):
        watch.steps = step
        watch.observe(stats)
    assert len(watch.records) == watch.limits.window


# ------------------------------------------------------------------ wiring, real torch (CPU build)

TRAIN_STEPS = textwrap.dedent("""
    import torch
    from autoalloc import hook
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
    print("WATCH", hook.STATE.adaptive)
    from autoalloc.ab import recorder
    print("SHARED", getattr(hook.STATE.adaptive, "sampler", 0) is getattr(recorder.RECORDER, "sampler", 1))
""") + PROBE

FOUND = """
    from autoalloc import hook
    from autoalloc.adaptive import Finding
    finding = Finding(50, 41, 6.5, 2, 2.4, 1)
    hook.STATE.late.on_finding(finding)
    hook.STATE.late.on_finding(finding)  # a second finding (another optimizer's) says nothing more
"""


def test_wired_on_cuda_builds_silent_everywhere_without_a_finding(sandbox, torch_python):
    sandbox.write("autoalloc.toml", 'adaptive = "advise"\n')
    sandbox.script("train.py", TRAIN_STEPS)
    result = sandbox.run(["train.py"], python=torch_python)
    assert result.returncode == 0, result.stderr
    cuda_build = probe_result(result.stdout)["cuda_build"]
    # a CUDA build watches the steps (nothing to judge while CUDA is not initialised); a CPU
    # build registers nothing
    assert ("WATCH <autoalloc.adaptive.Watch" in result.stdout) is cuda_build, result.stdout
    assert ("WATCH None" in result.stdout) is not cuda_build
    assert result.stderr == ""


@pytest.mark.slow  # the sharing is checked in process below; this is the run end to end
def test_the_hook_hands_the_recorders_sampler_to_the_watch(sandbox, torch_python):
    # AUTOALLOC_REPORT and adaptive together: memory_stats() is read once per step, not twice
    sandbox.write("autoalloc.toml", 'adaptive = "advise"\n')
    sandbox.script("train.py", TRAIN_STEPS)
    reports = sandbox.root / "reports"
    result = sandbox.run(["train.py"], python=torch_python, env={"AUTOALLOC_REPORT": f"{reports}/"})
    assert result.returncode == 0, result.stderr
    cuda_build = probe_result(result.stdout)["cuda_build"]
    assert ("SHARED True" in result.stdout) is cuda_build, result.stdout


def test_advise_warns_once_with_the_figures_and_the_command(sandbox):
    from tests.helpers import assert_untouched, autoalloc_warnings

    sandbox.write("autoalloc.toml", 'adaptive = "advise"\n')
    sandbox.script("train.py", "import torch\n" + textwrap.dedent(FOUND))
    result = sandbox.run(["train.py", "--epochs", "3"])
    assert_untouched(result)
    (warning,) = autoalloc_warnings(result.stderr)
    assert "device mallocs on 41 of the last 50 optimizer steps" in warning
    assert "train.py --epochs 3`" in warning and "autoalloc ab -- " in warning


def test_apply_turns_the_option_on_and_says_so_once(sandbox):
    from tests.helpers import ES, assert_applied, autoalloc_warnings

    sandbox.write("autoalloc.toml", 'adaptive = "apply"\n')
    sandbox.script("train.py", "import torch\n" + textwrap.dedent(FOUND))
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    result = sandbox.run(["train.py"], env=env)
    expected = f"garbage_collection_threshold:0.6,{ES}"
    probe = assert_applied(result, expected=expected)  # the full merged string went to the setter
    assert probe["applied"] == f"adaptive;{expected}"
    (warning,) = autoalloc_warnings(result.stderr)
    assert "turned on through the runtime setter" in warning


def test_apply_never_overrides_a_deny_rule(sandbox):
    from tests.helpers import assert_untouched

    sandbox.write(
        "autoalloc.toml",
        'adaptive = "apply"\n[[rules]]\nname = "no"\naction = "skip"\nscripts = ["train.py"]\n',
    )
    sandbox.script("train.py", "import torch\n" + textwrap.dedent(FOUND))
    result = sandbox.run(["train.py"])
    assert_untouched(result)
    assert result.stderr == ""


def test_explain_shows_the_mode_and_where_it_came_from(sandbox):
    import json

    policy = sandbox.write("autoalloc.toml", 'adaptive = "advise"\n')
    sandbox.write("train.py", "")
    result = sandbox.run(["-m", "autoalloc", "explain", "--json", "--", "python", "train.py"])
    expected = {"value": "advise", "from": f"project ({policy})"}
    assert json.loads(result.stdout)["adaptive"] == expected
    text = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "train.py"]).stdout
    assert f"adaptive:     advise  [project ({policy})]" in text


def test_the_watch_reads_the_recorders_counters_when_it_records():
    # with AUTOALLOC_REPORT set, the recorder already reads memory_stats() at each step: the
    # hook hands its sampler to the watch, which judges its records and reads nothing itself
    import torch

    from autoalloc.ab import recorder

    rec = recorder.Recorder(torch, "-", warmup=20, stop_after=None)
    rec.sampler.records.extend(r for r in dynamic(120) if r["step"] > 20)
    watch = adaptive.Watch(torch, on_finding=lambda f: None, shared=rec.sampler)
    assert watch.sampler is rec.sampler and watch.shared
    watch.steps = 120
    finding = watch.observe(None)
    assert finding is not None and finding.steps == 50
    # a longer warm-up than the watch's: the recorder's records start too late, sample itself
    late = recorder.Recorder(torch, "-", warmup=40, stop_after=None)
    alone = adaptive.Watch(torch, on_finding=lambda f: None, shared=late.sampler)
    assert alone.sampler is not late.sampler and not alone.shared


@pytest.mark.slow  # the run of test_the_hook_hands_the_recorders_sampler_to_the_watch, with apply
def test_adaptive_next_to_the_recorder_on_a_real_run(sandbox):
    from tests.helpers import autoalloc_warnings

    sandbox.write("autoalloc.toml", 'adaptive = "apply"\n')
    sandbox.script("train.py", TRAIN_STEPS)
    reports = sandbox.root / "reports"
    result = sandbox.run(["train.py"], env={"AUTOALLOC_REPORT": f"{reports}/"})
    assert result.returncode == 0, result.stderr
    (report,) = reports.glob("*.json")
    assert json.loads(report.read_text())["steps"] == 100
    assert autoalloc_warnings(result.stderr) == []


def test_apply_claims_nothing_where_the_program_refused_at_run_time(sandbox):
    from tests.helpers import autoalloc_warnings, probe_result

    sandbox.write("autoalloc.toml", 'adaptive = "apply"\n')
    refuse = "torch.cuda.memory._set_allocator_settings('expandable_segments:False')\n"
    sandbox.script("train.py", "import torch\n" + refuse + textwrap.dedent(FOUND))
    result = sandbox.run(["train.py"], env={"AUTOALLOC_DEBUG": "1"})
    assert result.returncode == 0, result.stderr
    assert probe_result(result.stdout)["getter"] == "expandable_segments:False"
    assert autoalloc_warnings(result.stderr) == [], result.stderr
    assert "the program set expandable_segments:False" in result.stderr  # the debug trace
