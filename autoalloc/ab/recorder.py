"""``AUTOALLOC_REPORT``: record this process's optimizer steps and allocator counters; write JSON.

Installed by the hook once torch's module has executed, and only when ``AUTOALLOC_REPORT``
is set (unset: nothing is registered). It uses torch's global optimizer step hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``), which every trainer built on
``torch.optim`` goes through, so the user's code is not changed. Per step it takes one
``time.perf_counter()``; no ``cuda.synchronize`` is added, so the report does not change
what it measures. On CUDA, after the warm-up, it reads ``torch.cuda.memory_stats()`` at each
step boundary and keeps the deltas of the allocator counters; the time these reads take is
measured and written into the report (``recorder``).

The hook hands it each decision it carries out (``Recorder.decided``): the report says which
rule decided, when (at ``import torch``, at the first optimizer, at an import trigger) and how
(the environment before torch started, or torch's runtime setter), at which optimizer step.

At exit (also on SIGTERM and SIGINT, chained to the handlers that were there) it writes the
report as one line of JSON (``emit``): appended to ``PATH`` (several processes given one file
each add their line, under a lock), into a directory (one file per process), or to stderr
(``-``). What ``PATH`` names is never replaced: a symlink is written through to its target,
a FIFO or a character device (``/dev/null``, ``/dev/stdout``) is written as a stream, and
anything else is refused with one line on stderr. DataLoader workers and the torchrun
launcher never step an optimizer and write nothing. A program that survives the signal and
steps on gets a final report at exit as well: readers keep a process's last report.

A process ended by ``os._exit`` (Ray's workers) or SIGKILL runs no exit code: given a
directory (its file its own), it also writes an interim report (``ended_by: running``) at a
decision after ``import torch``, at steps 1, 2, 4, ..., 64 and every ``REFRESH_S`` seconds of
steps (``rewrite``). Bounded size: ``KEEP`` step ends, then a thinned ``step_sample`` of the
later steps' times; the last ``KEEP`` CUDA records.

``AUTOALLOC_AB_STOP_AFTER=N`` (set by ``autoalloc ab``) ends the process after warm-up + N
steps: the report is written and the process exits with status 0. Every rank of a torchrun
job counts its own steps, so all ranks stop after the same step.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from typing import Any, Literal

from autoalloc import allocconf, torchinfo
from autoalloc.counters import StepSampler, totals
from autoalloc.envvars import (
    APPLIED_VAR,
    PROGRESS_VAR,
    REPORT_VAR,
    STOP_VAR,
    WARMUP_VAR,
    global_rank,
    rank_vars,
)
from autoalloc.messages import say, shortened

DEFAULT_WARMUP = 20
SCHEMA = "autoalloc-report/1"
STOP_GRACE_S = 60.0  # after a stop, a process that does not end by itself is ended
PROGRESS_EVERY_S = 0.25
REFRESH_S = 5.0  # the interim report's interval: what an abrupt end loses at most
KEEP = 1024  # step ends kept in full, and at most as many sampled step times and CUDA records

Ending = Literal["exit", "stop", "SIGTERM", "SIGINT"]


def _int_env(name: str, default: int | None) -> int | None:
    try:
        return max(0, int(os.environ[name]))
    except (KeyError, ValueError):
        return default


def report_path(target: str, pid: int, ranks: dict[str, int]) -> str | None:
    """Where this process writes: None for stderr; a file inside a directory target."""
    if target == "-":
        return None
    number = global_rank(ranks)
    tag = f"-rank{number}" if number is not None else ""
    if target.endswith(("/", os.sep)) or os.path.isdir(target):
        host = socket.gethostname().split(".")[0] or "host"
        return os.path.join(target, f"autoalloc-report-{host}-{pid}{tag}.json")
    if number:  # ranks other than 0 next to rank 0's file, never over it
        stem, ext = os.path.splitext(target)
        return f"{stem}{tag}{ext or '.json'}"
    return target


_WRITE_FLAGS = (
    os.O_WRONLY
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO without a reader: ENXIO at once, never a hang
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def emit(path: str | None, line: str) -> bool:
    """Write one report line to ``path`` (None: stderr) without replacing what ``path`` is.

    A regular file (or a symlink to one, or a new file) gets the line appended under an
    exclusive ``flock``, so processes sharing one file each keep their report; a FIFO or a
    character device gets it as a stream (a FIFO nobody reads is left alone); anything else
    is refused. Returns whether the line was written; a refusal costs one line on stderr.
    """
    data = (line + "\n").encode("utf-8")
    if path is None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        return True
    parent = os.path.dirname(path)
    if parent and not os.path.lexists(path):
        os.makedirs(parent, exist_ok=True)
    try:
        fd = os.open(path, _WRITE_FLAGS, 0o644)
    except OSError as exc:
        import errno

        why = _unavailable(path) if exc.errno == errno.ENXIO else exc
        say(f"AUTOALLOC_REPORT={shortened(path)}: not written: {why}")
        return False
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            _locked_write(fd, data)
        elif stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            os.set_blocking(fd, True)  # a reader is there: a report longer than its pipe waits
            _write_all(fd, data)
        else:
            say(
                f"AUTOALLOC_REPORT={shortened(path)}: not written: neither a regular file, a "
                "directory, a FIFO nor a character device"
            )
            return False
    finally:
        os.close(fd)
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _locked_write(fd: int, data: bytes) -> None:
    try:
        import fcntl
    except ImportError:  # no flock here: O_APPEND alone keeps whole lines in practice
        _write_all(fd, data)
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        _write_all(fd, data)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def rewrite(path: str, text: str) -> None:
    """A directory's report file, this process's alone, written whole: a new file renamed over
    it, so an end at any moment (``os._exit`` from another thread) leaves the old or the new."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:  # not a *.json: readers pass it by
        f.write(text)
    os.replace(f"{path}.tmp", path)


def allocator_settings(torch: Any) -> dict[str, Any]:
    """What torch says its allocator uses: the getter's string and, on CUDA builds, the snapshot.

    Called at exit only: the first read freezes the allocator configuration.
    """
    out: dict[str, Any] = {"raw": None, "expandable_segments": None, "source": None}
    try:
        raw = torchinfo.allocator_string(torch)
        if raw is not None:
            out.update(raw=raw, source=f"torch._C.{torchinfo.GETTER}()")
            out["expandable_segments"] = allocconf.segments_on(raw)
    except Exception as exc:
        out["getter_error"] = repr(exc)
    if getattr(torch.version, "cuda", None) and _snapshot_is_cheap(torch):
        try:
            settings = torch.cuda.memory._snapshot()["allocator_settings"]
            out["snapshot"] = {
                k: v if isinstance(v, (bool, int, float)) else str(v) for k, v in settings.items()
            }
            out["expandable_segments"] = bool(settings["expandable_segments"])
            out["source"] = 'torch.cuda.memory._snapshot()["allocator_settings"]'
        except Exception as exc:
            out["snapshot_error"] = repr(exc)
    return out


def _snapshot_is_cheap(torch: Any) -> bool:
    # A process that never touched the GPU must not create a CUDA context at exit just to
    # read settings; without a GPU the snapshot answers without one.
    try:
        return bool(torch.cuda.is_initialized()) or torch.cuda.device_count() == 0
    except Exception:
        return False


HOW = {"env": "environment", "setter": "runtime setter"}
HISTORY_KEYS = ("action", "rule", "when", "how", "at_step")


def decision_record(
    decision: Any, when: str, step: int, error: str | None = None
) -> dict[str, Any]:
    """One decision the hook carried out, as the report keeps it: what it decided (rule,
    policy file, value), ``when`` (``import torch``, ``first optimizer``, ``import of M``,
    ``adaptive``), ``how`` it reached torch (``environment``, ``runtime setter``; None: nothing
    was written) and ``at_step``, the optimizer steps counted by then."""
    keys = ("action", "rule", "reason", "read_var", "value")
    out = {key: getattr(decision, key, None) for key in keys}
    out["policy_file"] = getattr(decision, "rule_source", None)
    try:  # a report without this beats no report
        out["applied"] = dict(decision.applied())
    except Exception:
        out["applied"] = None
    out.update(when=when, how=HOW.get(getattr(decision, "via", "") or ""), at_step=step)
    if error:
        out["setter_error"] = error
    return out


def decision_info(recorder: Recorder | None = None) -> dict[str, Any]:
    """What autoalloc decided in this process, as its hook handed it over (``Recorder.decided``):
    the last decision with when and how it was carried out, the earlier ones in ``history``,
    and the environment mark. ``recorder``: this process's by default."""
    recorder = recorder if recorder is not None else RECORDER
    out: dict[str, Any] = {APPLIED_VAR: os.environ.get(APPLIED_VAR)}
    decisions = recorder.decisions if recorder is not None else []
    if decisions:
        out.update(decisions[-1])
    if len(decisions) > 1:
        out["history"] = [{k: d.get(k) for k in HISTORY_KEYS} for d in decisions]
    return out


class Recorder:
    """The per-process record: step end times, CUDA counter deltas after warm-up, the ending."""

    def __init__(self, torch: Any, target: str, warmup: int, stop_after: int | None) -> None:
        self.torch = torch
        self.target = target
        self.warmup = warmup
        self.stop_total = None if stop_after is None else warmup + stop_after
        self.progress = os.environ.get(PROGRESS_VAR)
        self.own = target.endswith(("/", os.sep)) or os.path.isdir(target)  # a file per process
        self.sampler = StepSampler(warmup, KEEP)  # the CUDA counters per step (adaptive's too)
        # the hook's decisions (``decided``); a forked child keeps them: it inherits their effect
        self.decisions: list[dict[str, Any]] = []
        self._reset()
        self.handle: Any = None
        self.handlers: dict[int, Any] = {}  # signal number -> the handler _chain_signal set

    def _reset(self) -> None:
        self.pid = os.getpid()
        self.started = time.time()
        self.t0 = time.perf_counter()
        self.steps = 0
        self.ends: list[float] = []  # perf_counter at each step's end, relative to t0 (KEEP)
        self.sample: list[float] = []  # later: the time of every `every`-th step (thinned)
        self.every, self.last = 1, 0.0
        self.kept = ""  # a directory's file: the final reports written to it (rewrite)
        self.refresh_at = 0.0
        self.sampler.reset()
        self.hook_s = 0.0
        self.sample_s = 0.0
        self.samples = 0
        self.ending: Ending | None = None
        self.signals: list[dict[str, Any]] = []  # each SIGTERM/SIGINT report: signal, at_step
        self.last_progress = 0.0
        # A signal that comes while this process writes its report waits for the write to end:
        # the handler's own write would wait forever for the flock the interrupted one holds.
        self.writing = False
        self.deferred: tuple[Any, int, Any] | None = None

    # ------------------------------------------------------------------ the hook's word

    def decided(self, decision: Any, when: str, error: str | None = None) -> None:
        """The hook carried out ``decision`` ``when`` (``import torch``, ``first optimizer``,
        ``import of M``, ``adaptive``); ``error``: torch's refusal of the setter call."""
        self.decisions.append(decision_record(decision, when, self.steps, error))
        if self.own and when != "import torch":  # made while the program runs: on disk at once
            self.refresh()

    # ------------------------------------------------------------------ per step

    def on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        now = time.perf_counter()
        self.steps, end = self.steps + 1, now - self.t0
        if self.steps <= KEEP:
            self.ends.append(end)
        elif (self.steps - KEEP) % self.every == 0:
            self.sample.append(end - self.last)
            if len(self.sample) == KEEP:  # every other one kept, each standing for more steps
                del self.sample[::2]
                self.every *= 2
        self.last = end
        if self.steps >= self.warmup:
            self._sample()
        if self.own and (now > self.refresh_at or self.steps in (1, 2, 4, 8, 16, 32, 64)):
            self.refresh()
        if self.progress and (
            now - self.last_progress > PROGRESS_EVERY_S or self.steps == self.stop_total
        ):
            self._write_progress(now)
        self.hook_s += time.perf_counter() - now
        if self.stop_total is not None and self.steps >= self.stop_total:
            self._stop()

    def _sample(self) -> None:
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return
        t = time.perf_counter()
        stats = cuda.memory_stats()
        self.sample_s += time.perf_counter() - t
        self.samples += 1
        self.sampler.add(self.steps, stats)

    def _write_progress(self, now: float) -> None:
        self.last_progress = now
        if global_rank():  # rank 0 speaks for the job
            return
        try:
            with open(self.progress, "w", encoding="utf-8") as f:
                f.write(f"{self.steps}\n")
        except OSError:
            self.progress = None

    def _stop(self) -> None:
        self.write("stop")
        # A thread that is not a daemon (a logger, a prefetcher) must not keep the process up.
        timer = threading.Timer(STOP_GRACE_S, os._exit, (0,))
        timer.daemon = True
        timer.start()
        raise SystemExit(0)

    # ------------------------------------------------------------------ the report

    def skip_writing(self) -> bool:
        """DataLoader workers and torchrun's launcher step no optimizer: their report is noise."""
        if self.steps:
            return False
        data = sys.modules.get("torch.utils.data")
        info = getattr(data, "get_worker_info", None)
        if info is not None and info() is not None:
            return True
        return "torch.distributed.elastic.agent.server.api" in sys.modules

    def as_dict(self, final: bool = True) -> dict[str, Any]:
        torch = self.torch
        cuda = bool(torch.cuda.is_initialized())
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "pid": self.pid,
            "host": socket.gethostname(),
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "rank": rank_vars(),
            "torch": torch.__version__,
            "torch_cuda": getattr(torch.version, "cuda", None),
            "cuda": cuda,
            "device_name": torch.cuda.get_device_name() if cuda else "cpu",
            "started": self.started,
            "ended_by": (self.ending or "exit") if final else "running",
            "signals": list(self.signals),
            "warmup": self.warmup,
            "stop_after": None if self.stop_total is None else self.stop_total - self.warmup,
            "steps": self.steps,
            "step_ends_s": [round(t, 6) for t in self.ends],
            "cuda_steps": self.sampler.records,
            "decision": decision_info(self),
            "allocator_settings": allocator_settings(torch) if final else {},
            "recorder": {
                "hook_s": round(self.hook_s, 6),
                "memory_stats_s": round(self.sample_s, 6),
                "memory_stats_calls": self.samples,
            },
        }
        if self.sample:
            out["step_sample"] = dict(every=self.every, times_s=[round(t, 6) for t in self.sample])
        if cuda:
            stats = torch.cuda.memory_stats()
            out["peak_reserved"] = int(stats.get("reserved_bytes.all.peak", 0))
            out["peak_allocated"] = int(stats.get("allocated_bytes.all.peak", 0))
            out["totals"] = totals(stats)
        return out

    def write(self, ending: Ending = "exit") -> None:
        """Write the report (again, with the latest figures, if it was written before).

        At exit after a signal's report, only when the program survived the signal and
        stepped on (a preemption notice it handles): that final report, with every step and
        the signals in ``signals``, follows the interim one, and readers keep the last.
        """
        if os.getpid() != self.pid or not self._due(ending):
            return
        if ending == "exit" and isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
            ending = "SIGINT"  # at exit after an uncaught KeyboardInterrupt: Ctrl-C ended it
        self.ending = ending
        if ending in ("SIGTERM", "SIGINT"):
            self.signals.append({"signal": ending, "at_step": self.steps})
        self._emit(final=True)

    def refresh(self) -> None:
        """The interim report: no allocator settings (reading them freezes them)."""
        self.refresh_at = time.perf_counter() + REFRESH_S
        if os.getpid() == self.pid and not self.writing and self.ending != "stop":
            self._emit(final=False)

    def _emit(self, final: bool) -> None:
        if self.skip_writing():
            return
        self.writing = True
        try:
            text = json.dumps(self.as_dict(final), separators=(",", ":"))
            path = report_path(self.target, self.pid, rank_vars())
            if self.own:
                self.kept += text + "\n" if final else ""
                rewrite(str(path), self.kept if final else f"{self.kept}{text}\n")
            else:
                emit(path, text)
        except Exception as exc:
            say(f"could not write the AUTOALLOC_REPORT report: {exc!r}")
        finally:
            self.writing = False
        deferred, self.deferred = self.deferred, None
        if deferred is not None:
            self.on_signal(*deferred)  # the signal that came while writing, handled now

    def _due(self, ending: Ending) -> bool:
        """Whether a report is to be written: always on a signal or a stop; at exit unless one
        was written already (a stop's, or a signal's with no step after it)."""
        if ending != "exit" or self.ending is None:
            return True
        if self.ending == "stop" or not self.signals:
            return False
        return self.steps > self.signals[-1]["at_step"]

    # ------------------------------------------------------------------ signals

    def on_signal(self, previous: Any, signum: int, frame: Any) -> Any:
        if self.writing:  # in the middle of a write, which handles the signal when done
            self.deferred = (previous, signum, frame)
            return None
        self.write("SIGTERM" if signum == signal.SIGTERM else "SIGINT")
        if callable(previous):
            return previous(signum, frame)  # e.g. Python's KeyboardInterrupt for SIGINT
        if previous == signal.SIG_IGN:
            return None
        if signal.getsignal(signum) is not self.handlers.get(signum):
            return None  # a handler set later calls ours (Lightning's): whether to end is its call
        # The default action: die by the signal, as the process would have without us.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None


def _chain_signal(recorder: Recorder, signum: int) -> None:
    try:
        previous = signal.getsignal(signum)
        if previous is None or previous == signal.SIG_IGN:
            return  # ignored, or a handler not set from Python: left as it is
        if previous is signal.default_int_handler:
            return  # its KeyboardInterrupt ends the process through atexit (see write)
        handler = recorder.handlers[signum] = lambda s, f: recorder.on_signal(previous, s, f)
        signal.signal(signum, handler)
    except (ValueError, OSError, TypeError):  # not the main thread, or an embedded interpreter
        pass


RECORDER: Recorder | None = None


def install(torch: Any | None = None, decision: Any = None) -> Recorder | None:
    """Start recording in this process (idempotent); None when ``AUTOALLOC_REPORT`` is unset.

    ``decision``: what the hook decided at ``import torch`` (later ones come through
    ``Recorder.decided``).
    """
    global RECORDER
    target = os.environ.get(REPORT_VAR)
    if not target:
        return None
    if RECORDER is not None:
        return RECORDER
    # A relative target is already absolute here: the startup hook pinned it at interpreter
    # start (``_startup.pin_report``), before it armed the watcher that calls this at `import
    # torch`, so a trainer that changes directory (Hydra) still writes where it was asked.
    torch = torch if torch is not None else sys.modules["torch"]
    import torch.optim.optimizer as optimizer_module

    recorder = Recorder(
        torch, target, _int_env(WARMUP_VAR, DEFAULT_WARMUP) or 0, _int_env(STOP_VAR, None)
    )
    recorder.handle = optimizer_module.register_optimizer_step_post_hook(recorder.on_step)
    atexit.register(recorder.write)
    for signum in (signal.SIGTERM, signal.SIGINT):
        _chain_signal(recorder, signum)
    os.register_at_fork(after_in_child=recorder._reset)
    if decision is not None:
        recorder.decided(decision, "import torch")
    RECORDER = recorder
    return recorder


def _unavailable(path: str) -> str:
    """Why opening ``path`` failed with ENXIO, by what it is."""
    mode = os.stat(path).st_mode if os.path.exists(path) else 0
    for kind, why in (
        (stat.S_ISSOCK, "it is a socket (a report goes to a file, a FIFO, a terminal or '-')"),
        (stat.S_ISFIFO, "nothing reads it (a FIFO without a reader)"),
        (stat.S_ISCHR, "the device is not available (no terminal for /dev/tty?)"),
    ):
        if kind(mode):
            return why
    return "no such device or address"
