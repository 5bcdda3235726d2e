"""The benchmarks keep working: ``benchmarks/startup.py --quick`` and ``autoalloc bench``'s CPU smoke path.

These run the real scripts end to end but never assert a timing: the figures belong in
README's Performance section, measured on purpose, not in a test on a busy machine.
The report functions of ``autoalloc.bench`` are also fed GPU-shaped results, so the
part of the GPU path that does not need a GPU (summary, checks, table, plot) is tested
here too.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoalloc import bench
from tests.conftest import PY, REPO, clean_env

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run(args: list[str], tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    (tmp_path / "home").mkdir(exist_ok=True)
    return subprocess.run([PY, *args], cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------- benchmarks/startup.py


@pytest.mark.slow
def test_startup_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    result = run(
        [str(REPO / "benchmarks" / "startup.py"), "--quick", "--venv", str(tmp_path / "venv"), "--json", str(out)],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["failures"] == []
    assert data["meta"]["quick"] is True
    # the hook imports autoalloc and autoalloc._startup, and nothing else, into `python -c pass`
    assert data["importtime"]["ok"] is True
    assert data["importtime"]["extra_modules"] == ["autoalloc", "autoalloc._startup"]
    assert data["importtime"]["missing_modules"] == []
    assert data["armed"] == {"hook": True, "no_hook": False, "ok": True}
    runs = data["meta"]["runs"]
    for case in ("p1", "p1_nobytecode", "p2"):
        r = data[case]
        for arm in ("hook", "no_hook"):
            assert r[arm]["n"] == (runs if case != "p2" else data["meta"]["runs_p2"])
            assert {"median_ms", "p10_ms", "p90_ms", "iqr_ms"} <= set(r[arm])
            assert set(r["cpu"][arm]) == set(r[arm])
        assert len(r["samples_ms"]["hook"]) == len(r["samples_ms"]["no_hook"]) == r["hook"]["n"]
        assert {"ratio", "delta_ms", "paired_delta_ms"} <= set(r)
    assert data["p1"]["budget_ratio"] == data["p2"]["budget_ratio"] == 1.02
    assert "within_budget" in data["p1"] and "within_budget" in data["p2"]
    assert data["p1_nobytecode"]["pycache_absent_after"] is True
    # the hook's own work, timed in process: the .pth line, and the decision at import torch
    assert set(data["p1"]["hook_line"]) == {"wall", "cpu"}
    at_import = data["p2"]["hook_at_import_torch"]
    assert {"decide_cpu", "net_decide_cpu", "guards_cpu", "modules_hook_imports"} <= set(at_import)
    assert "autoalloc.hook" in at_import["modules_hook_imports"]
    assert "autoalloc.hook" not in at_import["of_which_torch_imports_anyway"]
    # P2's hook arm really applied the project rule; the arm without the hook did not
    assert data["p2"]["applied_ok"] is True
    assert data["p2"]["applied"]["hook"].startswith("bench-project-rule;expandable_segments:True")
    assert "tomllib" in data["p2"]["importtime"]["extra_modules"]
    assert data["p3"]["rules"] >= 200 and data["p3"]["depth"] == 30
    assert data["p3"]["decision_ok"] is True and data["p3"]["rule"] == "user-last"
    assert data["p3_typical"]["decision_ok"] is True
    assert {"median_ms", "budget_ms", "within_budget", "warm", "cold_first_call"} <= set(data["p3"])
    assert "P1  python -c pass" in result.stdout and "P3  decision" in result.stdout


# ---------------------------------------------------------------------------- autoalloc bench


def test_bench_help() -> None:
    result = subprocess.run([PY, "-m", "autoalloc", "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage: autoalloc bench" in result.stdout and "--quick" in result.stdout


def test_bench_module_does_not_import_torch() -> None:
    code = "import sys, autoalloc.bench; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_bench_smoke_every_arm(tmp_path: Path) -> None:
    """The CPU smoke path: every arm in its own process, the option read back from torch in each.

    Without a GPU this is plain ``autoalloc bench``, which must say so and exit 0; with one,
    ``--smoke`` asks for the same path.
    """
    torch = pytest.importorskip("torch")
    gpu = torch.cuda.is_available()
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    flags = ["--smoke"] if gpu else []
    result = run(
        ["-m", "autoalloc", "bench", *flags, "--out", str(tmp_path / "work"), "--json", str(out), "--png", str(png)],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if not gpu:
        assert "no CUDA GPU available here: running the CPU smoke path" in result.stdout
    report = json.loads(out.read_text())
    assert report["meta"]["mode"] == "smoke" and report["meta"]["gpu"] is False
    assert report["config"]["steps"] == bench.PRESETS["smoke"]["steps"]
    assert list(report["arms"]) == list(bench.ARMS)
    for name, arm in report["arms"].items():
        assert arm["errors"] == [], arm["errors"]
        assert arm["expandable_segments"] == [bench.ARMS[name][3]], name
        assert arm["verified"] is True
        assert arm["steps_measured"] == report["config"]["steps"] - report["config"]["warmup"]
        assert arm["step_ms"]["median"] > 0 and arm["frames_per_s"]["overall"] > 0
    hook_run = next(r["result"] for r in report["runs"] if r["arm"] == "hook")
    assert hook_run["hook"]["AUTOALLOC_APPLIED"] == f"{bench.HOOK_RULE};expandable_segments:True"
    assert hook_run["hook"]["rule"] == bench.HOOK_RULE
    setter_run = next(r["result"] for r in report["runs"] if r["arm"] == "setter")
    assert "_set_allocator_settings" in setter_run["setter"] or "setAllocatorSettings" in setter_run["setter"]
    assert report["schedule"]["static"]["distinct_shapes"] == 1
    assert report["checks"] == []  # the GPU budgets are not judged on a CPU
    assert png.exists() == HAS_MATPLOTLIB
    assert report["meta"]["png"] == (str(png) if HAS_MATPLOTLIB else None)
    assert "hook" in result.stdout and "static-env" in result.stdout


@pytest.mark.slow
def test_bench_check_settings_every_arm(tmp_path: Path, torch_python: str) -> None:
    """Each arm's mechanism (env, NeMo's runtime setter, autoalloc's hook) reaches torch.

    On the CUDA build the answer is torch's parsed ``_snapshot()["allocator_settings"]``,
    exactly what the GPU run asserts, and it needs no GPU.
    """
    result = subprocess.run(
        [torch_python, "-m", "autoalloc", "bench", "--check-settings", "--out", str(tmp_path / "w")],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "w" / "settings.json").read_text())
    assert list(results) == list(bench.ARMS)
    cuda_build = any("_snapshot" in str(r["allocator_settings"]["source"]) for r in results.values())
    for arm, r in results.items():
        assert r["allocator_settings"]["expandable_segments"] is bench.ARMS[arm][3], (arm, r)
        assert r["verified"] is True
        assert ("_snapshot()" in r["allocator_settings"]["source"]) == cuda_build
    assert results["hook"]["hook"]["rule"] == bench.HOOK_RULE
    assert cuda_build == (torch_python != PY)


def test_bench_unknown_arm_is_an_error(tmp_path: Path) -> None:
    assert bench.main(["--arms", "default,nope", "--out", str(tmp_path)]) == 2


# ---------------------------------------------------------------------------- the schedule


def test_dynamic_schedule_follows_lhotse_semantics() -> None:
    s = bench.make_schedule(300, 600.0, 30, seed=7)
    again = bench.make_schedule(300, 600.0, 30, seed=7)
    assert s == again  # one schedule, replayed by every arm
    assert len(s["batches"]) == 300
    bounds, sizes = s["bucket_bounds"], s["batch_sizes"]
    assert bounds == sorted(bounds) and bounds[-1] == 35.0 and len(bounds) == 30
    assert sizes == [max(1, int(600.0 // b)) for b in bench.bucket_bounds(30, 7)]
    for batch in s["batches"]:
        b = batch["bucket"]
        assert len(batch["durations"]) == sizes[b]
        low = bounds[b - 1] if b else 0.0
        assert all(1.0 <= d <= 35.0 and low - 0.01 <= d <= bounds[b] + 0.01 for d in batch["durations"])
    buckets = [batch["bucket"] for batch in s["batches"]]
    assert len(set(buckets)) > 20  # most buckets appear ...
    assert sum(a != b for a, b in zip(buckets, buckets[1:])) > 250  # ... in random order: shapes change nearly every step
    summary = bench.schedule_summary(s)
    assert summary["distinct_shapes"] > 100 and summary["steps"] == 300
    other = bench.make_schedule(300, 600.0, 30, seed=8)
    assert other["batches"] != s["batches"]


def test_quadratic_duration_shrinks_long_buckets() -> None:
    plain = bench.make_schedule(10, 600.0, 30, seed=1)
    quad = bench.make_schedule(10, 600.0, 30, seed=1, quadratic=15.0)
    assert quad["batch_sizes"][-1] < plain["batch_sizes"][-1]
    assert quad["batch_sizes"][-1] == max(1, int(600 // (35 + 35 * 35 / 15)))


def test_static_and_probe_schedules() -> None:
    static = bench.make_schedule(50, 600.0, 30, seed=3, static=True)
    assert len({(len(b["durations"]), max(b["durations"])) for b in static["batches"]}) == 1
    dynamic = bench.make_schedule(50, 600.0, 30, seed=3)
    probe = bench.probe_schedule(dynamic)
    assert len(probe["batches"]) == 31  # each bucket's worst case, then the first again (optimizer state exists)
    for batch in probe["batches"][:30]:
        b = batch["bucket"]
        assert batch["durations"] == [dynamic["bucket_bounds"][b]] * dynamic["batch_sizes"][b]


def test_batch_shape() -> None:
    frames, tokens = bench.batch_shape([1.0, 12.345, 35.0])
    assert frames == [100, 1234, 3500] or frames == [100, 1235, 3500]
    assert tokens == [4, 49, 140]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", False),
        ("expandable_segments:True", True),
        ("max_split_size_mb:256, expandable_segments:True", True),
        ("expandable_segments:True,expandable_segments:False", False),
        ("expandable_segments:False", False),
    ],
)
def test_parse_es(raw: str, expected: bool) -> None:
    assert bench.parse_es(raw) is expected


def test_tiny_model_step_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    cfg = {**bench.PRESETS["smoke"], "amp": False}
    torch.manual_seed(0)
    model = bench.build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    frames, tokens = bench.batch_shape([3.0, 2.2])
    before = [p.detach().clone() for p in model.parameters()]
    loss = bench.train_step(torch, model, optimizer, frames, tokens, cfg, torch.device("cpu"), generator)
    assert loss == loss and loss > 0  # finite CTC loss
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    x = torch.randn(2, 301, cfg["n_mels"])
    logits, lengths = model(x, torch.tensor([301, 250]))
    assert logits.shape == (2, 76, cfg["vocab"] + 1) and lengths.tolist() == [76, 63]


# ---------------------------------------------------------------------------- the report, fed GPU-shaped results


def fake_run(arm: str, step_ms: float, allocs: int, es: bool, steps: int = 12) -> dict:
    gib = bench.GIB
    return {
        "arm": arm,
        "torch": "2.11.0+cu130",
        "device_name": "NVIDIA H200",
        "parameters": 76_000_000,
        "allocator_settings": {"expandable_segments": es, "source": "snapshot", "raw": ""},
        "verified": True,
        "steps": [
            {
                "step": i,
                "bucket": i % 3,
                "batch": 4,
                "max_frames": 1000 + i,
                "frames": 4000,
                "time_s": step_ms / 1000 * (3 if i < 2 else 1),
                "oom": arm == "default" and i == 5,
                "loss": 1.0,
                "num_device_alloc": allocs if i >= 2 else 40,
                "num_device_free": allocs if i >= 2 else 0,
                "num_alloc_retries": 1 if arm == "default" else 0,
                "num_ooms": 1 if arm == "default" and i == 5 else 0,
                "num_sync_all_streams": allocs,
                "reserved_peak": int((16 + (i % 3)) * gib),
                "reserved": int(15 * gib),
                "allocated_peak": int(14 * gib),
            }
            for i in range(steps)
        ],
    }


def test_report_with_gpu_shaped_results(tmp_path: Path) -> None:
    arms = {
        "default": (100.0, 6, False),
        "env": (70.0, 0, True),
        "setter": (75.0, 0, True),
        "hook": (70.0, 0, True),
        "static-default": (50.0, 0, False),
        "static-env": (50.5, 0, True),
    }
    runs = [{"arm": a, "repeat": 1, "wall_s": 20.0, "result": fake_run(a, *v)} for a, v in arms.items()]
    runs.append({"arm": "hook", "repeat": 2, "wall_s": 1.0, "result": {"error": "BenchError: the hook did not fire"}})
    cap = 16 * bench.GIB
    summaries = {a: bench.summarize(a, [r["result"] for r in runs if r["arm"] == a], 2, cap) for a in arms}
    d = summaries["default"]
    assert d["oom_steps"] == 1 and d["steps_measured"] == 9
    assert d["per_step"]["num_device_alloc"]["mean"] == 6 and d["warmup_totals"]["num_device_alloc"] == 80
    assert d["per_step"]["num_alloc_retries"]["total"] == 10
    assert d["allocated_peak_of_cap"] == pytest.approx(14 / 16)
    assert d["reserved_peak_gib"] == pytest.approx(18)
    assert summaries["hook"]["failed_runs"] == 1 and summaries["hook"]["errors"]
    comparisons = bench.compare_arms(summaries)
    assert comparisons["hook_vs_default"] == pytest.approx(0.7)
    assert comparisons["static-env_vs_static-default"] == pytest.approx(1.01)
    checks = bench.checks(summaries, comparisons, gpu=True)
    assert [c["ok"] for c in checks] == [True, True, True]
    report = {
        "meta": {"mode": "full", "device_name": "NVIDIA H200", "torch": "2.11.0+cu130", "parameters_m": 76.0},
        "config": {"steps": 12, "warmup": 2, "repeats": 1, "max_duration": 600.0},
        "calibration": {
            "cap_bytes": cap,
            "fraction": 0.1,
            "total_memory": 160 * bench.GIB,
            "probe_peak_allocated": 14 * bench.GIB,
            "fill": 0.88,
        },
        "schedule": {"dynamic": {"buckets": 30, "batch_size_range": [17, 600], "distinct_shapes": 11, "steps": 12}},
        "arms": summaries,
        "comparisons": comparisons,
        "checks": checks,
        "notes": ["a note"],
    }
    text = bench.render(report)
    assert "memory cap: 16.00 GiB" in text and "check: hook: median step time <= 0.8 x default: 0.700 -> ok" in text
    default_line = next(line for line in text.splitlines() if line.startswith("default "))
    assert " off " in default_line and "6.00" in default_line
    if HAS_MATPLOTLIB:
        assert bench.plot(report, runs, str(tmp_path / "p.png")) == str(tmp_path / "p.png")
        assert (tmp_path / "p.png").stat().st_size > 10_000
    else:
        assert bench.plot(report, runs, str(tmp_path / "p.png")) is None


def test_checks_report_misses() -> None:
    summaries = {
        "default": {"step_ms": {"median": 100.0}},
        "hook": {"step_ms": {"median": 95.0}, "per_step": {"num_device_alloc": {"mean": 2.0}}},
        "static-default": {"step_ms": {"median": 50.0}},
        "static-env": {"step_ms": {"median": 53.0}},
    }
    comparisons = bench.compare_arms(summaries)
    assert comparisons["env_vs_default"] is None
    assert [c["ok"] for c in bench.checks(summaries, comparisons, gpu=True)] == [False, False, False]
    assert bench.checks(summaries, comparisons, gpu=False) == []


def test_hook_check_explains_a_missing_hook() -> None:
    report = {"AUTOALLOC_APPLIED": None, "env": {}, "decision": None, "rule": None, "watcher_armed_at_start": False}
    with pytest.raises(bench.BenchError, match="startup hook is not installed"):
        bench.check_hook(report)
    report = {**report, "watcher_armed_at_start": True, "decision": "none"}
    with pytest.raises(bench.BenchError, match="did not apply rule"):
        bench.check_hook(report)
    ok = {
        "AUTOALLOC_APPLIED": f"{bench.HOOK_RULE};expandable_segments:True",
        "decision": "apply",
        "rule": bench.HOOK_RULE,
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "watcher_armed_at_start": True,
    }
    bench.check_hook(ok)


def test_runner_environments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    monkeypatch.setenv("AUTOALLOC_APPLIED", "x;y")
    runner = bench.Runner(str(tmp_path), sys.executable, 10)
    assert runner.stripped == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"}
    default = runner.env("default")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in default and "AUTOALLOC_APPLIED" not in default
    assert default["AUTOALLOC_DISABLE"] == "1"
    assert runner.env("env")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    hook = runner.env("hook")
    assert "AUTOALLOC_DISABLE" not in hook and Path(hook["AUTOALLOC_CONFIG"]).read_text().count(bench.HOOK_SCRIPT) == 1
    assert (tmp_path / "scripts" / bench.HOOK_SCRIPT).exists() and (tmp_path / "scripts" / bench.ARM_SCRIPT).exists()
    # a policy file autoalloc itself accepts
    from autoalloc.policy import Source, validate
    from autoalloc.sources import parse_toml

    config = validate(parse_toml(Path(hook["AUTOALLOC_CONFIG"]).read_bytes()), Source("env", "x"), True)
    assert [r.name for r in config.rules] == [bench.HOOK_RULE]
