"""The benchmarks keep working: ``benchmarks/startup.py --quick``, ``autoalloc bench``'s CPU smoke.

These run the real scripts end to end but never assert a timing: the figures belong in
docs/performance.md, measured on purpose, not in a test on a busy machine.
The comparison, table and plot that ``autoalloc bench`` shares with ``autoalloc ab`` are
fed GPU-shaped figures in tests/test_ab.py.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from autoalloc.bench import command, model, schedule, workload
from tests.helpers import PY, REPO, clean_env

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run(args: list[str], tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    (tmp_path / "home").mkdir(exist_ok=True)
    return subprocess.run(
        [PY, *args],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------- benchmarks/instructions.py


def test_instruction_counts_say_so_and_skip_without_valgrind(tmp_path: Path) -> None:
    env = {**clean_env(tmp_path), "PATH": str(tmp_path / "no-valgrind-here")}
    result = subprocess.run(
        [PY, str(REPO / "benchmarks" / "instructions.py"), "--venv", str(tmp_path / "venv")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "valgrind is not installed" in result.stdout
    assert not (tmp_path / "venv").exists()  # nothing built for nothing


def test_instruction_counts_run_outside_every_project(tmp_path: Path) -> None:
    # A project file above the cases' scripts would be their project's: this checkout's
    # pyproject.toml names autoalloc as a key, so the first process would parse it and the
    # cold P2 count would hold a parse no user's first process makes.
    code = ("import pathlib, sys; sys.path.insert(0, sys.argv[1]); import instructions; "
            "print(instructions.work_folder(pathlib.Path(sys.argv[2])))")  # fmt: skip
    venv = REPO / "benchmarks" / "out" / "startup-venv"
    result = subprocess.run([PY, "-c", code, str(REPO / "benchmarks"), str(venv)],
                            env=clean_env(tmp_path), capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    work = Path(result.stdout.strip())
    assert REPO not in work.parents
    above = [d / f for d in work.parents for f in ("pyproject.toml", "autoalloc.toml")]
    assert not [p for p in above if p.exists()]


# ---------------------------------------------------------------------------- benchmarks/startup.py


@pytest.mark.slow
def test_startup_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    result = run(
        [
            str(REPO / "benchmarks" / "startup.py"),
            "--quick",
            "--venv",
            str(tmp_path / "venv"),
            "--json",
            str(out),
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["failures"] == []
    assert data["meta"]["quick"] is True
    # the hook imports _autoalloc_startup, and nothing else, into `python -c pass`
    assert data["importtime"]["ok"] is True
    assert data["importtime"]["extra_modules"] == ["_autoalloc_startup"]
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
    # the decision's modules; no TOML parser: the check run before filled the layer cache
    assert "autoalloc.hook" in data["p2"]["importtime"]["extra_modules"]
    assert "tomllib" not in data["p2"]["importtime"]["extra_modules"]
    assert data["p3"]["rules"] >= 200 and data["p3"]["depth"] == 30
    assert data["p3"]["decision_ok"] is True and data["p3"]["rule"] == "user-last"
    assert data["p3_typical"]["decision_ok"] is True
    assert {"median_ms", "budget_ms", "within_budget", "warm", "cold_first_call"} <= set(data["p3"])
    assert data["p3_10k"]["rules"] >= 10_000 and data["p3_10k"]["decision_ok"] is True
    assert data["p3_10k"]["budget_first_call_ms"] == 1000
    # S: the four arms measured in the same venv, each cost relative to distutils-precedence.pth
    site = data["site"]
    assert set(site["arms"]) == {"none", "bare", "distutils", "autoalloc"}
    assert all(len(site["samples_us"][arm]["wall"]) == runs for arm in site["arms"])
    assert site["budget_ratio"] == 0.5 and "within_budget" in site
    assert "P1  python -c pass" in result.stdout and "P3  decision" in result.stdout
    assert "distutils-precedence.pth" in result.stdout


# ---------------------------------------------------------------------------- autoalloc bench


def test_bench_help() -> None:
    result = subprocess.run(
        [PY, "-m", "autoalloc", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "usage: autoalloc bench" in result.stdout and "--quick" in result.stdout


def test_bench_modules_do_not_import_torch() -> None:
    code = (
        "import sys, autoalloc.bench.command, autoalloc.bench.workload, autoalloc.ab.runner; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
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
        [
            "-m",
            "autoalloc",
            "bench",
            *flags,
            "--out",
            str(tmp_path / "work"),
            "--json",
            str(out),
            "--png",
            str(png),
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    if not gpu:
        assert "no CUDA GPU available here: running the CPU smoke path" in result.stdout
    data = json.loads(out.read_text())
    assert data["bench"]["mode"] == "smoke" and data["bench"]["gpu"] is False
    smoke = workload.PRESETS["smoke"]
    assert data["plan"]["steps"] == smoke["steps"] and data["plan"]["warmup"] == smoke["warmup"]
    assert list(data["runs_by_arm"]) == list(command.ARMS)
    for name, runs in data["runs_by_arm"].items():
        [one] = runs
        assert one["returncode"] == 0, one["stderr_tail"]
        [report] = one["reports"]
        assert report["steps"] == smoke["steps"] + smoke["warmup"] and report["ended_by"] == "stop"
        assert report["allocator_settings"]["expandable_segments"] is command.ARMS[name][2], name
    on = data["runs_by_arm"]["on"][0]["reports"][0]["decision"]
    assert (
        on["rule"] == command.HOOK_RULE
        and on["AUTOALLOC_APPLIED"] == f"{command.HOOK_RULE};expandable_segments:True"
    )
    assert data["bench"]["schedule"]["kind"] == "dynamic"
    assert data["bench"]["checks"] == []  # the GPU goals are not judged on a CPU
    assert "CPU: step times and memory are not compared" in result.stdout
    assert "checked the plumbing" in result.stdout
    assert png.exists() == HAS_MATPLOTLIB
    assert data["png"] == (str(png) if HAS_MATPLOTLIB else None)
    assert "== static-on vs static-off" in result.stdout


@pytest.mark.slow
def test_bench_check_settings_every_arm(tmp_path: Path, torch_python: str) -> None:
    """Each arm's mechanism (env, NeMo's runtime setter, autoalloc's hook) reaches torch.

    On the CUDA build the answer is torch's parsed ``_snapshot()["allocator_settings"]``,
    and it needs no GPU.
    """
    result = subprocess.run(
        [
            torch_python,
            "-m",
            "autoalloc",
            "bench",
            "--check-settings",
            "--out",
            str(tmp_path / "w"),
        ],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "w" / "settings.json").read_text())
    assert list(results) == list(command.ARMS)
    cuda_build = torch_python != PY
    for arm, r in results.items():
        assert r["ok"] is True, (arm, r)
        assert r["allocator_settings"]["expandable_segments"] is command.ARMS[arm][2], (arm, r)
        assert ("_snapshot()" in str(r["allocator_settings"]["source"])) == cuda_build
    assert results["on"]["decision"]["rule"] == command.HOOK_RULE


def test_bench_unknown_arm_is_an_error(tmp_path: Path) -> None:
    assert command.main(["--arms", "on,nope", "--out", str(tmp_path)]) == 2


def test_bench_arm_environments(tmp_path: Path) -> None:
    arms = {
        a.name: a
        for a in command.make_arms(list(command.ARMS), ["py", "-m", command.WORKLOAD], "/p.toml")
    }
    base = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64", "AUTOALLOC_DISABLE": "1", "HOME": "/h"}
    on = arms["on"].environ(base)
    assert on == {
        "HOME": "/h",
        "AUTOALLOC_CONFIG": "/p.toml",
    }  # the hook decides; the user's variables go
    assert arms["off"].environ(base)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert arms["setter"].command[-1] == "--setter" and "PYTORCH_CUDA_ALLOC_CONF" not in arms[
        "setter"
    ].environ(base)
    assert arms["static-on"].environ(base)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert arms["static-off"].command[-1] == "--static"
    # a policy file autoalloc itself accepts, whose rule matches the workload module
    from autoalloc.policy import Source
    from autoalloc.sources import parse_toml
    from tests.helpers import validate

    config = validate(parse_toml(command.POLICY.encode()), Source("env", "x"), True)
    assert [r.name for r in config.rules] == [command.HOOK_RULE]
    assert config.rules[0].modules == (command.WORKLOAD,)


# ---------------------------------------------------------------------------- the schedule


def test_dynamic_schedule_follows_lhotse_semantics() -> None:
    s = schedule.make_schedule(300, 600.0, 30, seed=7)
    again = schedule.make_schedule(300, 600.0, 30, seed=7)
    assert s == again  # one schedule, replayed by every arm
    assert len(s["batches"]) == 300
    bounds, sizes = s["bucket_bounds"], s["batch_sizes"]
    assert bounds == sorted(bounds) and bounds[-1] == 35.0 and len(bounds) == 30
    assert sizes == [max(1, int(600.0 // b)) for b in schedule.bucket_bounds(30, 7)]
    for batch in s["batches"]:
        b = batch["bucket"]
        assert len(batch["durations"]) == sizes[b]
        low = bounds[b - 1] if b else 0.0
        assert all(
            1.0 <= d <= 35.0 and low - 0.01 <= d <= bounds[b] + 0.01 for d in batch["durations"]
        )
    buckets = [batch["bucket"] for batch in s["batches"]]
    assert len(set(buckets)) > 20  # most buckets appear ...
    assert (
        sum(a != b for a, b in zip(buckets, buckets[1:])) > 250
    )  # ... in random order: shapes change nearly every step
    summary = schedule.schedule_summary(s)
    assert summary["distinct_shapes"] > 100 and summary["steps"] == 300
    other = schedule.make_schedule(300, 600.0, 30, seed=8)
    assert other["batches"] != s["batches"]


def test_quadratic_duration_shrinks_long_buckets() -> None:
    plain = schedule.make_schedule(10, 600.0, 30, seed=1)
    quad = schedule.make_schedule(10, 600.0, 30, seed=1, quadratic=15.0)
    assert quad["batch_sizes"][-1] < plain["batch_sizes"][-1]
    assert quad["batch_sizes"][-1] == max(1, int(600 // (35 + 35 * 35 / 15)))


def test_static_and_probe_schedules() -> None:
    static = schedule.make_schedule(50, 600.0, 30, seed=3, static=True)
    assert len({(len(b["durations"]), max(b["durations"])) for b in static["batches"]}) == 1
    dynamic = schedule.make_schedule(50, 600.0, 30, seed=3)
    probe = schedule.probe_schedule(dynamic)
    assert (
        len(probe["batches"]) == 31
    )  # each bucket's worst case, then the first again (optimizer state exists)
    for batch in probe["batches"][:30]:
        b = batch["bucket"]
        assert batch["durations"] == [dynamic["bucket_bounds"][b]] * dynamic["batch_sizes"][b]


def test_batch_shape() -> None:
    frames, tokens = schedule.batch_shape([1.0, 12.345, 35.0])
    assert frames == [100, 1234, 3500] or frames == [100, 1235, 3500]
    assert tokens == [4, 49, 140]


def test_tiny_model_step_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    cfg = {**workload.PRESETS["smoke"], "amp": False}
    torch.manual_seed(0)
    net = model.build_model(cfg)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    frames, tokens = schedule.batch_shape([3.0, 2.2])
    before = [p.detach().clone() for p in net.parameters()]
    loss = model.train_step(
        torch, net, optimizer, frames, tokens, cfg, torch.device("cpu"), generator
    )
    assert loss == loss and loss > 0  # finite CTC loss
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
    x = torch.randn(2, 301, cfg["n_mels"])
    logits, lengths = net(x, torch.tensor([301, 250]))
    assert logits.shape == (2, 76, cfg["vocab"] + 1) and lengths.tolist() == [76, 63]


def test_gpu_check_clears_only_its_own_results_in_out(tmp_path: Path) -> None:
    """OUT is the user's folder: an earlier run's quick/ab/full results go, nothing else.

    The run stops at its first step (no torch in PYTHON), after clearing OUT.
    """
    out = tmp_path / "out"
    out.mkdir()
    for name in ("quick.json", "ab.png", "full.json", "mine.json", "plot.png"):
        (out / name).write_text("{}")
    (tmp_path / "home").mkdir()
    env = {**clean_env(tmp_path), "OUT": str(out), "PYTHON": "false", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh")],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "mine.json", "plot.png"]
