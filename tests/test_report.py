"""``AUTOALLOC_REPORT``: real interpreters of the test venv (hook installed), a tiny CPU trainer.

The report counts optimizer steps through torch's global step hook, is written at exit and
on SIGTERM/SIGINT (the process still ends as the signal says), one file per training
process in a directory (DataLoader workers and torchrun's launcher write none), and costs
nothing when the variable is unset. No timing is asserted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from autoalloc.ab import recorder, reports, table
from tests.helpers import PY, REPO, clean_env

TINY = str(REPO / "tests" / "tiny_train.py")


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "home").mkdir(exist_ok=True)
    return {**clean_env(tmp_path), "AUTOALLOC_REPORT_WARMUP": "2", **extra}


def run(args: list[str], tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, *args],
        cwd=tmp_path,
        env=env_for(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=300,
    )


def reports_in(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def test_report_counts_steps_and_is_written_at_exit_one_file_per_training_process(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "reports"
    result = run([TINY, "7", "--workers", "2"], tmp_path, AUTOALLOC_REPORT=str(directory) + "/")
    assert result.returncode == 0, result.stderr
    assert "FINISHED" in result.stdout
    # the DataLoader workers step no optimizer: no file of theirs
    (out,) = sorted(directory.glob("*.json"))
    report = json.loads(out.read_text())
    assert report["schema"] == recorder.SCHEMA
    assert report["steps"] == 7 and len(report["step_ends_s"]) == 7
    assert report["ended_by"] == "exit" and report["warmup"] == 2
    assert report["cuda"] is False and report["cuda_steps"] == [] and report["device_name"] == "cpu"
    assert report["torch"].startswith("2.") and report["decision"]["action"] == "none"
    assert report["allocator_settings"]["source"] == "torch._C._accelerator_getAllocatorSettings()"
    assert table.figures(report)["measured_steps"] == 5  # steps 3..7, after the warm-up of 2
    shown = subprocess.run(
        [PY, "-m", "autoalloc", "report", str(out)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert out.name in shown.stdout and "device: cpu" in shown.stdout


# SIGINT in the quick run (and the report written on SIGTERM, below); SIGTERM's default action
# with --full
@pytest.mark.parametrize(
    "sig",
    [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGINT],
    ids=["SIGTERM", "SIGINT"],
)
def test_report_written_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "r.json"
    process = subprocess.Popen(
        [PY, TINY, "100", "--wait-after", "4"],
        cwd=tmp_path,
        env=env_for(tmp_path, AUTOALLOC_REPORT=str(out)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "READY"
        time.sleep(0.2)
        process.send_signal(sig)
        process.wait(60)
    finally:
        process.kill()
    # the process ends as it would have without the recorder: SIGTERM's default action kills
    # it; SIGINT still raises Python's KeyboardInterrupt where the program was
    if sig == signal.SIGTERM:
        assert process.returncode == -signal.SIGTERM
    else:
        assert process.stderr is not None
        assert process.returncode != 0 and process.stderr.read().rstrip().endswith(
            "KeyboardInterrupt"
        )
    report = json.loads(out.read_text())
    assert report["steps"] == 4 and report["ended_by"] == sig.name


def test_no_report_without_torch_and_nothing_registered_when_unset(tmp_path: Path) -> None:
    directory = tmp_path / "reports"
    assert (
        run(["-c", "import json"], tmp_path, AUTOALLOC_REPORT=str(directory) + "/").returncode == 0
    )
    assert not directory.exists() or not list(directory.iterdir())
    code = (
        "import sys, torch, torch.optim.optimizer as o; "
        "print(len(o._global_optimizer_post_hooks), 'autoalloc.ab.recorder' in sys.modules)"
    )
    result = run(["-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "False"]


@pytest.mark.slow  # test_ab checks the stop end to end in the quick run
def test_stop_after_ends_the_process_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = run(
        [TINY, "50", "--workers", "2"],
        tmp_path,
        AUTOALLOC_REPORT=str(out),
        AUTOALLOC_AB_STOP_AFTER="3",
    )
    assert result.returncode == 0, result.stderr
    assert "FINISHED" not in result.stdout and "Traceback" not in result.stderr
    report = json.loads(out.read_text())
    assert report["steps"] == 5 and report["ended_by"] == "stop" and report["stop_after"] == 3


@pytest.mark.slow  # a multi-process end-to-end run: the full run
def test_directory_gets_one_file_per_torchrun_rank(tmp_path: Path) -> None:
    directory = tmp_path / "reports"
    directory.mkdir()  # an existing directory (no trailing slash needed)
    result = run(
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", TINY, "5"],
        tmp_path,
        AUTOALLOC_REPORT=str(directory),
        AUTOALLOC_AB_STOP_AFTER="2",
        OMP_NUM_THREADS="1",
    )
    assert result.returncode == 0, result.stderr
    reports = reports_in(directory)
    assert sorted(r["rank"]["RANK"] for r in reports) == [0, 1]  # the launcher writes none
    assert [r["steps"] for r in reports] == [4, 4]  # every rank stops at the same step
    assert len({r["pid"] for r in reports}) == 2


def test_report_path_and_settings_helpers(tmp_path: Path) -> None:
    assert recorder.report_path("-", 1, {}) is None
    assert recorder.report_path(str(tmp_path / "a.json"), 1, {"RANK": 0}) == str(
        tmp_path / "a.json"
    )
    assert recorder.report_path(str(tmp_path / "a.json"), 1, {"RANK": 2}) == str(
        tmp_path / "a-rank2.json"
    )
    inside = recorder.report_path(str(tmp_path), 42, {"RANK": 1})
    assert (
        inside is not None
        and inside.startswith(str(tmp_path))
        and inside.endswith("-42-rank1.json")
    )


def test_report_command_renders_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autoalloc import cli

    gib = 1024**3
    base = {"warmup": 1, "cuda": True, "device_name": "NVIDIA H200", "torch": "2.11.0"}
    for rank, mallocs in ((0, 0), (1, 3)):
        report = {
            **base,
            "rank": {"RANK": rank},
            "steps": 4,
            "step_ends_s": [0.1, 0.2, 0.3, 0.4],
            "cuda_steps": [
                {
                    "step": s,
                    "num_device_alloc": mallocs,
                    "num_device_free": 0,
                    "num_alloc_retries": 0,
                    "num_ooms": 0,
                    "reserved": 2 * gib,
                    "allocated": gib,
                }
                for s in (2, 3, 4)
            ],
            "peak_reserved": 3 * gib,
            "peak_allocated": 2 * gib,
            "allocator_settings": {"expandable_segments": True},
            "decision": {"action": "apply", "rule": "nemo-asr-train"},
        }
        (tmp_path / f"r{rank}.json").write_text(json.dumps(report))
    assert cli.main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("r")][1:]
    assert len(rows) == 2 and all("apply nemo-asr-train" in row and "3.00" in row for row in rows)
    assert "3.00" in rows[1].split()[6]  # rank 1: 3 device mallocs per step
    assert "device: NVIDIA H200" in out
    assert cli.main(["report", str(tmp_path / "missing.json")]) == 1


def test_ignored_signals_stay_ignored(tmp_path: Path) -> None:
    # a program started with SIGINT ignored (`nohup`, `cmd &` in a script) or that ignores
    # SIGTERM itself keeps them ignored: no handler that its exec'd children would not inherit
    code = (
        "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); import torch; "
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "
        "signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)"
    )
    result = subprocess.run(
        [PY, "-c", code],
        cwd=tmp_path,
        env=env_for(tmp_path, AUTOALLOC_REPORT=str(tmp_path / "r.json")),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_default_sigint_handler_left_and_a_composed_sigterm_handler_decides(
    tmp_path: Path,
) -> None:
    # asyncio.run, like others, handles Ctrl-C itself only where SIGINT still has Python's
    # default handler (it checks `is signal.default_int_handler`).
    # Lightning's SignalConnector composes its SIGTERM handler with the one it finds (ours, where
    # SIGTERM had the default action) and stops training gracefully: the process must not die
    out = tmp_path / "r.json"
    code = (
        "import os, signal, time, torch; "
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler); "
        "prev = signal.getsignal(signal.SIGTERM); "
        "signal.signal(signal.SIGTERM, lambda s, f: prev(s, f)); "
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.5); print('ALIVE')"
    )
    result = run(["-c", code], tmp_path, AUTOALLOC_REPORT=str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "ALIVE"]
    assert json.loads(out.read_text())["ended_by"] == "SIGTERM"  # still written on the signal


SIGNAL_KEEPS_TRAINING = """\
import os, signal
caught = []
signal.signal(signal.SIGTERM, lambda s, f: caught.append(s))  # before torch: chained to
import torch
torch.set_num_threads(1)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 51):
    opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
    if step == 10:
        os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice the program survives
print("CAUGHT", len(caught))
"""


def test_a_program_that_survives_sigterm_gets_its_whole_run_reported(tmp_path: Path) -> None:
    # the rule matches the script at `import torch`: the report says the environment did it
    (tmp_path / "autoalloc.toml").write_text(
        '[[rules]]\nname = "sig-asr"\nscripts = ["train_sig.py"]\naction = "apply"\n'
    )
    (tmp_path / "train_sig.py").write_text(SIGNAL_KEEPS_TRAINING)
    out = tmp_path / "r.json"
    result = run(["train_sig.py"], tmp_path, AUTOALLOC_REPORT=str(out))
    assert result.returncode == 0, result.stderr
    assert "CAUGHT 1" in result.stdout
    interim, final = (json.loads(line) for line in out.read_text().splitlines())
    assert interim["ended_by"] == "SIGTERM" and interim["steps"] == 10  # kept, as an interim
    assert final["ended_by"] == "exit" and final["steps"] == 50
    assert final["signals"] == [{"signal": "SIGTERM", "at_step": 10}]
    [shown] = reports.read_file(str(out)).reports  # the reader keeps the last: the whole run
    assert shown["steps"] == 50
    decision = shown["decision"]
    assert decision["action"] == "apply" and decision["rule"] == "sig-asr"
    assert decision["when"] == "import torch" and decision["how"] == "environment"
    assert decision["at_step"] == 0
    text = table.render_reports([shown])
    assert "apply sig-asr (environment, before torch started)" in text


def report_row(**fields: object) -> dict:
    return {
        "schema": recorder.SCHEMA,
        "pid": 7,
        "steps": 3,
        "step_ends_s": [0.1, 0.2, 0.3],
        **fields,
    }


def test_report_table_shows_local_ranks_and_marks_cut_names() -> None:
    long_name = "autoalloc-report-a-very-long-host-name-in-a-cluster-12345-rank1.json"
    rows = table.render_reports(
        [
            report_row(rank={"LOCAL_RANK": 1, "WORLD_SIZE": 2}, file="/r/short.json"),  # Lightning
            report_row(rank={"RANK": 1, "LOCAL_RANK": 1}, file="/r/" + long_name),
        ]
    ).splitlines()[2:4]
    assert rows[0].split()[:2] == ["short.json", "local"] and rows[0].split()[2] == "1"
    cut = rows[1][:34].rstrip()
    assert cut.startswith("…") and long_name.endswith(cut[1:]) and len(cut) <= 33
    assert rows[1][34:42].strip() == "1"


def test_the_recorder_learns_each_decision_from_the_hook() -> None:
    from types import SimpleNamespace

    def decision(action: str, via: str, rule: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(
            action=action,
            rule=rule,
            rule_source="builtin",
            reason="",
            read_var="PYTORCH_CUDA_ALLOC_CONF",
            value="expandable_segments:True",
            via=via,
            applied=dict,
        )

    rec = recorder.Recorder(SimpleNamespace(), "-", warmup=0, stop_after=None)
    rec.decided(decision("none", ""), "import torch")
    rec.steps = 4
    rec.decided(decision("apply", "setter", "nemo-asr-import"), "import of nemo.collections.asr")
    info = recorder.decision_info(rec)
    assert info["action"] == "apply" and info["rule"] == "nemo-asr-import"
    assert info["when"] == "import of nemo.collections.asr" and info["how"] == "runtime setter"
    assert info["at_step"] == 4
    assert [d["action"] for d in info["history"]] == ["none", "apply"]
    line = table.applied_text(info)
    assert line == (
        "rule nemo-asr-import at its import of nemo.collections.asr, through the "
        "runtime setter, after 4 optimizer steps"
    )


# Its optimizer built by a module of its own (the script alone shows no training, so the rule
# decides at the first optimizer, after import torch).
ENDED_BY_ITS_ENGINE = """\
import glob, os, sys, torch, trainer
torch.set_num_threads(1)
model = torch.nn.Linear(4, 2)
opt = trainer.optimizer(model)  # the rule decides here: on disk at once
where = sys.argv[1]
[path] = glob.glob(os.path.join(where, "*.json")) if os.path.isdir(where) else [where]
print("AT_DECISION " + open(path).read().splitlines()[-1], flush=True)
for step in range(5):
    opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
os._exit(0)  # as Ray ends its workers: no atexit, no exit-time report
"""


def test_a_process_ended_by_os_exit_leaves_its_decision_and_steps(tmp_path: Path) -> None:
    (tmp_path / "autoalloc.toml").write_text(
        '[[rules]]\nname = "exit-asr"\nscripts = ["train_exit.py"]\ntraining = true\n'
        'action = "apply"\n'
    )
    (tmp_path / "train_exit.py").write_text(ENDED_BY_ITS_ENGINE)
    (tmp_path / "trainer.py").write_text(
        "import torch\n\n\ndef optimizer(model):\n"
        "    return torch.optim.SGD(model.parameters(), lr=0.01)\n")
    where = tmp_path / "reports"  # a directory: each process's file is its own to rewrite
    result = run(["train_exit.py", str(where)], tmp_path, AUTOALLOC_REPORT=str(where) + "/")
    assert result.returncode == 0, result.stderr
    at_decision = json.loads(result.stdout.split("AT_DECISION ", 1)[1].splitlines()[0])
    assert at_decision["steps"] == 0 and at_decision["ended_by"] == "running"
    assert at_decision["decision"]["when"] == "first optimizer"
    [written] = where.glob("*")  # rewritten whole each time (no *.tmp left beside it)
    [line] = written.read_text().splitlines()
    report = json.loads(line)
    # written at steps 1, 2, 4 and every few seconds: step 5 may be lost, no more
    assert report["steps"] >= 4 and report["ended_by"] == "running"
    assert report["decision"]["action"] == "apply" and report["decision"]["rule"] == "exit-asr"
    assert report["decision"]["how"] == "runtime setter"
    text = table.render_reports([report])
    assert "apply exit-asr (runtime setter at first optimizer, step 0)" in text
    assert "no final report (the process ended without a normal exit" in text


def test_a_long_run_report_stays_small_and_readable(tmp_path: Path) -> None:
    """Past ``KEEP`` steps, a thinned sample: the size is bounded, the figures still come."""
    import torch

    rec = recorder.Recorder(torch, str(tmp_path / "reports") + "/", warmup=0, stop_after=None)
    sizes = {}
    for steps in (100_000, 300_000):
        while rec.steps < steps:
            rec.on_step(None, (), {})
        sizes[steps] = len(json.dumps(rec.as_dict(final=False)))
    report = rec.as_dict(final=False)
    assert len(report["step_ends_s"]) == recorder.KEEP
    assert 0 < len(report["step_sample"]["times_s"]) < recorder.KEEP
    assert report["step_sample"]["every"] >= 256  # a power of two: 300,000 / 1,024 or more
    assert sizes[300_000] < 40_000 and sizes[300_000] < sizes[100_000] * 1.5
    rec.refresh()  # as every few seconds: the file rewritten whole, one report in it
    [written] = (tmp_path / "reports").glob("*")
    assert json.loads(written.read_text())["steps"] == 300_000
    assert written.stat().st_size < 40_000
    fig = table.figures(report)
    assert fig["steps"] == 300_000 and fig["steps_per_s"] and fig["step_ms_median"] is not None
    assert reports.problem(report) is None


def test_report_says_why_a_short_run_has_no_step_time() -> None:
    short = report_row(steps=3, warmup=20, step_ends_s=[0.1, 0.2, 0.3], file="r.json")
    text = table.render_reports([short])
    assert (
        "r.json: its 3 optimizer steps all fell in the warm-up of 20: no step was measured; "
        "use AUTOALLOC_REPORT_WARMUP=0" in text
    )
    one = table.render_reports([report_row(steps=1, warmup=0, step_ends_s=[0.1])])
    assert "a step time needs two" in one
    assert "no step was measured" not in table.render_reports([report_row(warmup=1)])
