"""``autoalloc ab``: the arms, the stop after warm-up + N steps, the table, JSON and PNG.

End to end on a tiny CPU trainer (real torch, the test venv's hook): each arm's process
reports the allocator setting torch read, every run stops after exactly warm-up + N
optimizer steps, a failing arm and a command without an optimizer are reported as such,
and torchrun's ranks all stop at the same step. The comparison logic is also fed
GPU-shaped figures. No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autoalloc.ab import arms, plot, table
from autoalloc.ab.runner import Progress
from tests.helpers import PY, REPO, clean_env

TINY = str(REPO / "tests" / "tiny_train.py")
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def ab(
    tmp_path: Path, options: list[str], command: list[str], python: str = PY
) -> tuple[subprocess.CompletedProcess[str], dict]:
    (tmp_path / "home").mkdir(exist_ok=True)
    out = tmp_path / "out"
    result = subprocess.run(
        [
            python,
            "-m",
            "autoalloc",
            "ab",
            "--warmup",
            "2",
            "--out",
            str(out),
            *options,
            "--",
            *command,
        ],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    data = json.loads((out / "ab.json").read_text()) if (out / "ab.json").exists() else {}
    return result, data


def test_ab_runs_both_arms_alternately_and_stops_each_run(tmp_path: Path, full: bool) -> None:
    repeat = 2 if full else 1  # each run imports torch: one of each arm in the quick run
    result, data = ab(tmp_path, ["--steps", "5", "--repeat", str(repeat)], [PY, TINY, "1000"])
    assert result.returncode == 0, result.stdout + result.stderr
    runs = data["runs_by_arm"]
    repeats = list(range(1, repeat + 1))
    assert [r["repeat"] for r in runs["on"]] == repeats == [r["repeat"] for r in runs["off"]]
    intended = {"on": True, "off": False}
    for arm, arm_runs in runs.items():
        for run in arm_runs:
            assert run["returncode"] == 0 and not run["timed_out"]
            [report] = run["reports"]
            assert report["steps"] == 7 and report["ended_by"] == "stop"  # warm-up 2 + 5
            assert run["figures"]["measured_steps"] == 5
            # read back from torch (its getter) in the arm's own process
            assert report["allocator_settings"]["expandable_segments"] is intended[arm], report
    assert "policy's [allocator] defaults" in data["arms"]["on"]["how"]
    assert data["arms"]["off"]["env"]["AUTOALLOC_DISABLE"] == "1"
    assert "verdict: no comparison: the command ran on the CPU" in result.stdout
    # On the CPU no row that reads like a speed-up or a slow-down: only the steps measured.
    rows = [line.split("  ")[0] for line in result.stdout.splitlines()]
    assert not {"steps/s", "step time median (ms)", "peak reserved (GiB)"} & set(rows)
    assert "measured steps" in rows
    assert "CPU: step times and memory are not compared" in result.stdout
    last = f"[{2 * repeat}/{2 * repeat}] off (repeat {repeat}): done, 7 steps"
    assert last in result.stderr  # plain lines: no terminal
    # plain progress lines come every 5 s and at the end: whether one falls in the warm-up
    # depends on the machine's speed, so the labels are checked on Progress itself below
    assert "step 5/5" in result.stderr
    assert "step 7/" not in result.stderr
    assert (tmp_path / "out" / "ab.png").exists() == HAS_MATPLOTLIB


@pytest.mark.slow  # a multi-process end-to-end run: the full run
def test_ab_on_arm_uses_the_deciding_rule(tmp_path: Path) -> None:
    script = tmp_path / "train_asr_tiny.py"
    script.write_text(Path(TINY).read_text())
    policy = tmp_path / "autoalloc.toml"
    policy.write_text(
        '[[rules]]\nname = "tiny-asr"\nscripts = ["train_asr_tiny.py"]\naction = "apply"\n'
    )
    result, data = ab(tmp_path, ["--steps", "1", "--repeat", "1"], [PY, str(script), "100"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rule tiny-asr" in data["arms"]["on"]["how"]
    [on] = data["runs_by_arm"]["on"]
    decision = on["reports"][0]["decision"]
    assert decision["action"] == "apply" and decision["rule"] == "tiny-asr"
    assert on["reports"][0]["allocator_settings"]["expandable_segments"] is True
    [off] = data["runs_by_arm"]["off"]
    assert off["reports"][0]["decision"]["action"] == "disabled"
    assert off["reports"][0]["allocator_settings"]["expandable_segments"] is False


# A fine-tuning script no rule names: an audio stack (soundfile, in the test venv) and a
# text-target library (jiwer: an empty stand-in beside the script), then an optimizer, built
# by a module of its own (the script's source alone does not show the training: decided late).
OWN_FINETUNE = """\
import soundfile, jiwer
import torch
import trainer
torch.set_num_threads(1)
model = torch.nn.Linear(4, 2)
opt = trainer.optimizer(model)
for _ in range(1000):
    opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
"""


def test_ab_on_arm_gets_the_option_at_the_first_optimizer_as_the_job_does(
    tmp_path: Path,
) -> None:
    (tmp_path / "jiwer").mkdir()
    (tmp_path / "jiwer" / "__init__.py").write_text("")
    (tmp_path / "trainer.py").write_text(
        "import torch\n\n\ndef optimizer(model):\n"
        "    return torch.optim.AdamW(model.parameters(), lr=1e-3)\n")
    script = tmp_path / "own_finetune.py"
    script.write_text(OWN_FINETUNE)
    result, data = ab(tmp_path, ["--steps", "2", "--repeat", "1"], [PY, str(script)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no rule matches" not in result.stderr
    on_line = next(x for x in result.stderr.splitlines() if x.startswith("on: "))
    assert "rule speech-training" in on_line, on_line
    assert "at its first optimizer, through the runtime setter" in on_line, on_line
    # nothing forced: the hook runs as in the job (no AUTOALLOC_DISABLE, no allocator variable)
    on_arm = data["arms"]["on"]
    assert on_arm["env"] == {"AUTOALLOC_DISABLE": None} and on_arm["late"] is True
    [on], [off] = data["runs_by_arm"]["on"], data["runs_by_arm"]["off"]
    decision = on["reports"][0]["decision"]
    assert decision["action"] == "apply" and decision["rule"] == "speech-training"
    assert decision["when"] == "first optimizer" and decision["how"] == "runtime setter"
    assert decision["at_step"] == 0
    assert on["reports"][0]["allocator_settings"]["expandable_segments"] is True
    assert off["reports"][0]["allocator_settings"]["expandable_segments"] is False
    confirmed = "on run 1: autoalloc applied rule speech-training at its first optimizer"
    assert confirmed in result.stdout


@pytest.mark.slow  # a multi-process end-to-end run: the full run
def test_ab_failing_arm_is_shown_with_the_other(tmp_path: Path) -> None:
    result, data = ab(
        tmp_path,
        ["--steps", "2", "--repeat", "1"],
        [PY, TINY, "100", "--fail-when", "expandable_segments:True"],
    )
    assert result.returncode == 1
    [on], [off] = data["runs_by_arm"]["on"], data["runs_by_arm"]["off"]
    assert on["returncode"] == 3 and on["figures"]["failed"] is True
    assert off["returncode"] == 0 and off["reports"][0]["steps"] == 4
    assert "on run 1 FAILED with exit code 3" in result.stdout
    assert "tiny_train: failing on purpose" in result.stdout
    assert "off: 1/1 runs ok" in result.stdout and "every run of the on arm failed" in result.stdout


@pytest.mark.slow  # two runs that last their whole --timeout
def test_ab_command_without_optimizer_stops_at_the_timeout(tmp_path: Path) -> None:
    result, data = ab(
        tmp_path,
        ["--steps", "2", "--repeat", "1", "--timeout", "25"],
        [PY, TINY, "1", "--no-optimizer"],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for arm in ("on", "off"):
        [run] = data["runs_by_arm"][arm]
        assert run["timed_out"] is True
        assert [r["steps"] for r in run["reports"]] == [0]  # written on the SIGTERM ab sent
        assert run["reports"][0]["ended_by"] == "SIGTERM"
    assert "no optimizer step was seen" in result.stdout and "about memory only" in result.stdout


@pytest.mark.slow  # two torchrun jobs: six interpreters
def test_ab_torchrun_every_rank_stops_at_the_same_step(tmp_path: Path) -> None:
    command = [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        TINY,
        "1000",
    ]
    result, data = ab(tmp_path, ["--steps", "3", "--repeat", "1"], command)
    assert result.returncode == 0, result.stdout + result.stderr
    for arm in ("on", "off"):
        [run] = data["runs_by_arm"][arm]
        assert sorted(r["rank"]["RANK"] for r in run["reports"]) == [0, 1]
        assert [r["steps"] for r in run["reports"]] == [5, 5]
        assert run["figures"]["ranks"] == 2 and run["figures"]["steps"] == 5


@pytest.mark.cuda_build
def test_ab_settings_through_the_cuda_snapshot(tmp_path: Path) -> None:
    from tests.helpers import CUDA_PY

    if not CUDA_PY:
        pytest.skip("AUTOALLOC_TORCH_CUDA_PYTHON is not set")
    result, data = ab(
        tmp_path, ["--steps", "1", "--repeat", "1"], [CUDA_PY, TINY, "100"], python=CUDA_PY
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for arm, intended in (("on", True), ("off", False)):
        settings = data["runs_by_arm"][arm][0]["reports"][0]["allocator_settings"]
        assert settings["source"] == 'torch.cuda.memory._snapshot()["allocator_settings"]'
        assert settings["expandable_segments"] is intended


# ---------------------------------------------------------------------------- pure parts


def explained(action: str, rule: str | None = None) -> dict[str, Any]:
    return {
        "decision": {
            "action": action,
            "rule": rule,
            "rule_source": "project /p/autoalloc.toml",
            "reason": "no rule matches" if action == "none" else "",
            "read_var": None,
            "requested": {"expandable_segments": "True", "garbage_collection_threshold": "0.8"},
        },
        "allocator": {"expandable_segments": {"value": "True", "from": "default"}},
    }


def test_arms_for_a_matching_rule_and_for_none() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "AUTOALLOC_DISABLE": "1"}
    on, off = arms.ab_arms(["python", "t.py"], explained("apply", "r1"), env)
    assert on.environ(env) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"
    }  # the hook applies r1
    assert "rule r1" in on.how and on.intent is True
    assert (
        off.environ(env)["PYTORCH_CUDA_ALLOC_CONF"]
        == "max_split_size_mb:128,expandable_segments:False"
    )
    on, off = arms.ab_arms(["python", "t.py"], explained("none"), {})
    assert on.env == {
        "AUTOALLOC_DISABLE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    assert "[allocator] defaults" in on.how and off.intent is False
    assert [(a.name, r) for a, r in arms.interleave([on, off], 2)] == [
        ("on", 1),
        ("off", 1),
        ("on", 2),
        ("off", 2),
    ]


def gpu_figures(step_ms: float, mallocs: float, es: bool) -> dict[str, Any]:
    return {
        "steps": 120,
        "measured_steps": 100,
        "steps_per_s": 1000 / step_ms,
        "step_ms_median": step_ms,
        "step_ms_p95": step_ms * 1.2,
        "cuda": True,
        "expandable_segments": es,
        "mallocs_per_step": mallocs,
        "retries": 0,
        "ooms": 0,
        "peak_reserved_gib": 70.0,
        "peak_allocated_gib": 60.0,
        "failed": False,
    }


@pytest.mark.parametrize(
    ("on_ms", "off_ms", "expected"),
    [
        ([70, 72], [100, 98], "on is faster: step time x0.717"),
        ([99, 101], [100, 100.5], "no measurable difference in step time"),
        ([130, 131], [100, 101], "on is slower"),
        ([70], [100], "from one run per arm: no spread to judge it by"),
    ],
)
def test_verdict_never_overstates(on_ms: list[float], off_ms: list[float], expected: str) -> None:
    figs = {
        "on": [gpu_figures(m, 0.0, True) for m in on_ms],
        "off": [gpu_figures(m, 6.0, False) for m in off_ms],
    }
    line = table.verdict(figs)
    assert expected in line and "device mallocs/step off 6.00 -> on 0.00" in line


def test_table_with_gpu_shaped_figures(tmp_path: Path) -> None:
    def run(repeat: int, ms: float, es: bool) -> dict[str, Any]:
        ends = [i * ms / 1000 for i in range(1, 13)]
        report = {
            "steps": 12,
            "warmup": 2,
            "step_ends_s": ends,
            "cuda": True,
            "rank": {"RANK": 0},
            "cuda_steps": [
                {"step": s, "reserved": s * 2**30, "num_device_alloc": 0} for s in range(3, 13)
            ],
        }
        return {
            "repeat": repeat,
            "reports": [report],
            "figures": gpu_figures(ms, 0.0 if es else 4.0, es),
        }

    data = {
        "plan": {"warmup": 2},
        "runs_by_arm": {
            "on": [run(1, 70, True), run(2, 71, True)],
            "off": [run(1, 100, False), run(2, 99, False)],
        },
        "notes": ["a note"],
    }
    text = table.render_ab(data)
    assert "on/off" in text and "step time median (ms)" in text and "note: a note" in text
    median_line = next(line for line in text.splitlines() if line.startswith("step time median"))
    assert "0.709" in median_line and "0.700-0.717" in median_line
    assert "verdict: on is faster" in text
    written = plot.plot(data, str(tmp_path / "p.png"), "t")
    assert (written is not None) == HAS_MATPLOTLIB and (
        tmp_path / "p.png"
    ).exists() == HAS_MATPLOTLIB


def test_rank_flags() -> None:
    def report(rank: int, steps: int, es: bool) -> dict[str, Any]:
        return {
            "rank": {"RANK": rank},
            "steps": steps,
            "warmup": 1,
            "step_ends_s": [0.1 * i for i in range(steps)],
            "allocator_settings": {"expandable_segments": es},
        }

    assert table.rank_flags([report(0, 5, True), report(1, 5, True)]) == []
    flags = table.rank_flags([report(1, 4, False), report(0, 5, True)])
    assert flags == ["rank 1: 4 steps (rank 0: 5)", "rank 1: expandable_segments=False"]


def test_progress_names_the_warm_up_steps_apart_from_the_measured_ones() -> None:
    import io

    progress = Progress(io.StringIO(), total_runs=2, total_steps=7, warmup=2)
    assert progress.where(1) == "warm-up step 1/2"
    assert progress.where(2) == "warm-up step 2/2"
    assert progress.where(3) == "step 1/5"
    assert progress.where(7) == "step 5/5"


def test_bench_output_goes_to_a_private_cache_directory_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``autoalloc bench`` writes where ``ab`` does (never into the working directory)."""
    from autoalloc.bench import command

    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    args = command.parser().parse_args(["--check-settings"])
    assert args.out is None
    out = Path(command.output_dir(args))
    assert out.parent == tmp_path / "home" / ".cache" / "autoalloc" / "bench"
    assert out.stat().st_mode & 0o777 == 0o700
    assert command.output_dir(args) == str(out)  # decided once: every file of a bench in one
    assert not (tmp_path / "autoalloc-bench").exists()
    given = command.parser().parse_args(["--out", str(tmp_path / "mine")])
    assert command.output_dir(given) == str(tmp_path / "mine")


def test_late_arm_leaves_the_hook_to_decide_and_notes_what_each_run_did() -> None:
    from autoalloc.ab.runner import hook_notes

    later = explained("apply", "speech-training")
    later["rules"] = [{"name": "speech-training", "training": True}]
    on, off = arms.ab_arms(["python", "t.py"], explained("none"), {}, later)
    assert on.env == {"AUTOALLOC_DISABLE": None} and on.late and on.hooked and on.intent is True
    assert "rule speech-training" in on.how and "at its first optimizer" in on.how
    assert "no rule matches" not in on.how and off.intent is False
    applied = {
        "action": "apply",
        "rule": "speech-training",
        "when": "first optimizer",
        "how": "runtime setter",
        "at_step": 0,
    }
    assert hook_notes(on, "on run 1", {"reports": [{"decision": applied}]}) == [
        "on run 1: autoalloc applied rule speech-training at its first optimizer, through the "
        "runtime setter, before any optimizer step"
    ]
    missed = {"action": "none", "reason": "no rule matches"}
    [note] = hook_notes(on, "on run 1", {"reports": [{"decision": missed}]})
    assert "did not apply the options in this run after all (none: no rule matches)" in note


def test_a_run_inside_the_warm_up_says_so_and_which_flags_measure_it() -> None:
    """A 3-step program under the default warm-up of 20: the note says why nothing was
    measured and which --warmup/--steps would; the verdict does not claim no step was seen."""
    from autoalloc.ab.runner import Plan, Run, result

    report = {"steps": 3, "warmup": 20, "step_ends_s": [0.1, 0.2, 0.3], "cuda": True,
              "ended_by": "exit", "rank": {}}
    runs = [Run(name, 1, ["python", "t.py"], returncode=0, reports=[report]) for name in ("on", "off")]
    two = [arms.Arm("on", ("python", "t.py")), arms.Arm("off", ("python", "t.py"))]
    data = result(two, Plan(steps=50, warmup=20, repeat=1, timeout=60, out="o"), runs, [])
    assert (
        "on run 1: its 3 optimizer steps all fell in the warm-up of 20: no step was measured; "
        "use --warmup 0 --steps 3" in data["notes"]
    )
    text = table.render_ab(data)
    assert "verdict: no step was measured (see the notes)" in text
    assert "no optimizer step was seen" not in text
