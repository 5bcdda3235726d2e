"""Where ``AUTOALLOC_REPORT`` writes, and ``autoalloc report`` reading whatever it is given.

The writer never replaces what the path is (a device node, a symlink, a FIFO), appends one
JSON line per process to a shared file, and resolves a relative path once, at start. The
reader gives every file a one-line verdict, never a traceback, never a wait.
"""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from autoalloc import cli
from autoalloc.ab import recorder, reports
from tests.helpers import PY, REPO, clean_env

TINY = str(REPO / "tests" / "tiny_train.py")


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "home").mkdir(exist_ok=True)
    return {**clean_env(tmp_path), "AUTOALLOC_REPORT_WARMUP": "1", **extra}


def report_line(**fields: object) -> str:
    base = {"schema": recorder.SCHEMA, "pid": 1, "steps": 3, "step_ends_s": [0.1, 0.2, 0.3]}
    return json.dumps({**base, **fields})


# ---------------------------------------------------------------- the writer: what a path is


@pytest.mark.slow  # two runs in a private mount namespace: the full run
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_dev_null_and_dev_stdout_are_never_replaced(tmp_path: Path) -> None:
    # In a private mount namespace whose /dev is a tmpfs copy: the real /dev is never at risk.
    script = f"""
set -e
d=$(mktemp -d)
mount -t tmpfs none "$d"
cp -a /dev/null /dev/zero /dev/random /dev/urandom "$d"/
mkdir "$d"/shm
ln -s /proc/self/fd "$d"/fd
ln -s /proc/self/fd/1 "$d"/stdout
ln -s /proc/self/fd/2 "$d"/stderr
mount --bind "$d" /dev
AUTOALLOC_REPORT=/dev/null {PY} {TINY} 2 > /dev/null
AUTOALLOC_REPORT=/dev/stdout {PY} {TINY} 2 > {tmp_path}/stdout.txt
stat -c '%F' /dev/null
stat -c '%F' /dev/stdout
"""
    try:
        result = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "bash", "-c", script],
            env=env_for(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
        )
    except OSError as exc:
        pytest.skip(f"unshare cannot run here: {exc}")
    if result.returncode != 0 and "mount" in result.stderr:
        pytest.skip(f"no private mount namespace here: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["character special file", "symbolic link"]
    printed = (tmp_path / "stdout.txt").read_text().splitlines()
    assert "FINISHED" in printed  # the program's own output, then the report as one line
    assert json.loads(printed[-1])["steps"] == 2
    assert "autoalloc:" not in result.stderr


def test_symlink_is_written_through_to_its_target(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "report.jsonl"
    link = tmp_path / "report.json"
    link.symlink_to(target)  # the target does not exist yet
    assert recorder.emit(str(link), report_line(pid=1))
    assert recorder.emit(str(link), report_line(pid=2))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert [json.loads(line)["pid"] for line in target.read_text().splitlines()] == [1, 2]


def test_fifo_without_reader_is_left_alone_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert recorder.emit(str(fifo), report_line()) is False  # no reader: no wait, no file
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "not written" in err[0] and "without a reader" in err[0]


def test_fifo_with_a_reader_gets_the_whole_report_as_a_stream(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    opened = threading.Event()

    def read() -> None:
        # Open without blocking (a reader is there from now on), then wait in poll: it does
        # not report the end of the stream before a writer has come and gone.
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        opened.set()
        chunks = []
        while True:
            select.select([fd], [], [])
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
        os.close(fd)
        got.append(b"".join(chunks))

    reader = threading.Thread(target=read)
    reader.start()
    opened.wait(30)
    big = report_line(step_ends_s=[float(i) for i in range(40000)])  # larger than a pipe buffer
    assert recorder.emit(str(fifo), big)
    reader.join(30)
    assert json.loads(got[0])["step_ends_s"][-1] == 39999.0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_socket_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        assert recorder.emit(str(path), report_line()) is False
    finally:
        server.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    err = capsys.readouterr().err.splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("autoalloc: AUTOALLOC_REPORT=")
        and "not written" in err[0]
        and "it is a socket" in err[0]
        and "FIFO without a reader" not in err[0]
    )


def test_an_absent_device_and_a_fifo_are_told_apart() -> None:
    # ENXIO: a FIFO nobody reads, a socket, /dev/tty without a controlling terminal
    assert "not available" in recorder._unavailable("/dev/null")  # a character device
    assert recorder._unavailable("/nonexistent/x") == "no such device or address"


def test_a_list_is_named_as_a_json_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    assert cli.main(["report", str(path)]) == 1
    assert "a JSON list, not a report object" in capsys.readouterr().err


@pytest.mark.slow  # a job of several processes: the full run
def test_processes_sharing_one_file_each_keep_their_report_and_relative_is_pinned_at_start(
    tmp_path: Path,
) -> None:
    # The first program changes directory after `import torch` (as Hydra does): its report
    # still lands where it was started. The second one appends, it does not replace.
    chdir_train = (
        "import os, sys, torch; os.makedirs('outputs/run', exist_ok=True); "
        "os.chdir('outputs/run'); m = torch.nn.Linear(2, 1); "
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3): m(torch.ones(2)).sum().backward(); o.step()"
    )
    env = env_for(tmp_path, AUTOALLOC_REPORT="reports/all.jsonl")
    for args in (["-c", chdir_train], [TINY, "2"]):
        result = subprocess.run(
            [PY, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
    lines = (tmp_path / "reports" / "all.jsonl").read_text().splitlines()
    assert [json.loads(line)["steps"] for line in lines] == [3, 2]
    assert not (tmp_path / "outputs" / "run" / "reports").exists()
    shown = subprocess.run(
        [PY, "-m", "autoalloc", "report", "reports/all.jsonl"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if line.startswith("all.jsonl")]
    assert len(rows) == 2


def test_report_dash_is_one_compact_line_that_report_dash_reads_back(tmp_path: Path) -> None:
    result = subprocess.run(
        [PY, TINY, "3"],
        cwd=tmp_path,
        env=env_for(tmp_path, AUTOALLOC_REPORT="-"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith('{"schema"')]
    assert len(ours) == 1 and json.loads(ours[0])["steps"] == 3
    stream = "torch says something\n" + result.stderr + "Traceback? no, just a line\n"
    shown = subprocess.run(
        [PY, "-m", "autoalloc", "report", "-"],
        input=stream,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert any(line.startswith("-") and " 3 " in line for line in shown.stdout.splitlines()[2:])


# ---------------------------------------------------------------- the reader: any file


HOSTILE = {
    "list.json": "[1, 2, 3]",
    "number.json": "42",
    "string.json": '"hello"',
    "types.json": json.dumps({"schema": recorder.SCHEMA, "steps": "many", "step_ends_s": []}),
    "ranks.json": json.dumps({"schema": recorder.SCHEMA, "steps": 1, "rank": {"RANK": "zero"}}),
    "cuda.json": json.dumps({"schema": recorder.SCHEMA, "steps": 1, "cuda_steps": [1, 2]}),
    "ends.json": json.dumps({"schema": recorder.SCHEMA, "steps": 1, "step_ends_s": ["a"]}),
    "every.json": report_line(step_sample={"every": 0, "times_s": [0.1]}),
    "sample.json": report_line(step_sample={"every": 2, "times_s": 5}),
    "sampled.json": report_line(step_sample={"every": 2, "times_s": ["a"]}),
    "deep.json": "[" * 100000 + "]" * 100000,
    "deep-dict.json": '{"steps": ' + "[" * 100000 + "]" * 100000 + "}",
    "truncated.json": report_line()[:-20],
    "other.json": json.dumps({"schema": "something/else"}),
    "empty.json": "",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_hostile_file_gets_a_one_line_verdict(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    path.write_text(HOSTILE[name])
    assert cli.main(["report", str(path)]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[0].startswith(f"autoalloc report: skipped {path}: ")
    assert "Traceback" not in captured.err and captured.out == ""


def test_truncated_and_binary_files_are_named_with_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(report_line()[:-20])
    (tmp_path / "b.json").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    verdicts = {Path(v.path).name: v for v in reports.read_paths([str(tmp_path)])}
    assert verdicts["t.json"].why.startswith("line 1: truncated")
    assert verdicts["b.json"].why == "binary, not a report"


def test_a_bad_line_skips_itself_only_and_is_counted(tmp_path: Path) -> None:
    """A truncated line (a writer killed) and a foreign object among the lines: the reports
    after them are read too, and the verdict says how many parts were skipped."""
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([
        report_line(pid=1), report_line(pid=2)[:-20], report_line(pid=3),
        json.dumps({"schema": "something/else"}), report_line(pid=4),
    ]) + "\n")
    verdict = reports.read_file(str(path))
    assert [r["pid"] for r in verdict.reports] == [1, 3, 4]
    assert verdict.outcome == "skipped"
    assert verdict.why.startswith("line 2: truncated")
    assert verdict.why.endswith("; 2 parts skipped in all")
    assert verdict.line().endswith("(3 reports read)")


def test_an_indented_report_then_appended_lines_are_all_read(tmp_path: Path) -> None:
    """An older autoalloc's indented report, then lines a newer one appended to the file."""
    path = tmp_path / "r.json"
    old = json.dumps(json.loads(report_line(pid=1)), indent=2)
    path.write_text(old + "\n" + report_line(pid=2) + "\n" + report_line(pid=3) + "\n")
    verdict = reports.read_file(str(path))
    assert (verdict.outcome, verdict.why) == ("ok", "")
    assert [r["pid"] for r in verdict.reports] == [1, 2, 3]


def test_a_fifo_never_blocks_the_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "good.json").write_text(report_line())
    os.mkfifo(tmp_path / "pipe.json")  # nobody ever writes it
    assert cli.main(["report", str(tmp_path)]) == 1  # one file skipped, the good one shown
    captured = capsys.readouterr()
    assert "pipe.json: a FIFO" in captured.err and "good.json" in captured.out
    assert cli.main(["report", str(tmp_path / "pipe.json")]) == 1
    assert "a FIFO" in capsys.readouterr().err


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(report_line(pid=1) + "\n" + report_line(pid=2) + "\n")
    assert cli.main(["report", str(good)]) == 0
    assert cli.main(["report", str(tmp_path / "missing.json")]) == 1
    with pytest.raises(SystemExit) as usage:
        cli.main(["report"])
    assert usage.value.code == 2
    capsys.readouterr()


def test_a_process_that_wrote_twice_counts_once() -> None:
    first = report_line(pid=7, host="h", started=1.0, steps=2)
    last = report_line(pid=7, host="h", started=1.0, steps=5)
    verdict = reports.read_stream(io.StringIO(first + "\n" + last + "\n"))
    assert [r["steps"] for r in verdict.reports] == [5]


def test_report_table_on_cpu_says_cuda_columns_need_cuda_and_what_es_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "r.json").write_text(report_line(cuda=False, device_name="cpu"))
    assert cli.main(["report", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "ES: expandable_segments" in out
    assert "did not use CUDA, so they show -" in out


# ---------------------------------------------------------------- the writer and a signal


def test_signal_during_the_exit_write_waits_for_it_and_never_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while the exit-time write holds the file's flock: the handler's own write would
    open a second descriptor and wait for that lock forever. It waits for the write instead:
    both reports are there, the signal's last, and the handler before it still runs."""
    import fcntl

    import torch

    target = tmp_path / "r.json"
    rec = recorder.Recorder(torch, str(target), warmup=1, stop_after=None)
    rec.steps = 1
    chained: list[int] = []
    real_flock, real_write_all = fcntl.flock, recorder._write_all

    def never_waits(fd: int, op: int) -> None:  # a wait for a held lock fails the test at once
        real_flock(fd, op | fcntl.LOCK_NB if op == fcntl.LOCK_EX else op)

    def signalled(fd: int, data: bytes) -> None:  # SIGTERM comes in the middle of the write
        monkeypatch.setattr(recorder, "_write_all", real_write_all)
        rec.on_signal(lambda signum, frame: chained.append(signum), signal.SIGTERM, None)
        real_write_all(fd, data)

    monkeypatch.setattr(fcntl, "flock", never_waits)
    monkeypatch.setattr(recorder, "_write_all", signalled)
    rec.write()
    lines = target.read_text().splitlines()
    assert [json.loads(line)["ended_by"] for line in lines] == ["exit", "SIGTERM"]
    assert chained == [signal.SIGTERM]
