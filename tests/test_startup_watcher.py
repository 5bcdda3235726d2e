"""The startup watcher's loader wrapper passes the checks tools make, and threads cannot race it.

``importlib.util.find_spec("torch").loader`` is autoalloc's wrapper until torch executes: it
must pass ``isinstance`` against ``importlib.abc.Loader`` and the real loader's class and
still pickle. The watcher's guard against its own nested lookup is per thread: another
thread's ``find_spec("torch")`` at the moment of ``import torch`` must not leave the process
undecided. Real interpreters with the hook, real torch; threads meet at a barrier, no sleeps.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import _autoalloc_loader
from autoalloc import _startup
from tests.helpers import PY, clean_env

LOADER_CHECKS = """
import importlib.abc, importlib.machinery, importlib.util, pickle, sys
spec = importlib.util.find_spec("torch")
wrapped = type(spec.loader).__name__ == "Loader"
abc_ok = isinstance(spec.loader, importlib.abc.Loader)
file_ok = isinstance(spec.loader, importlib.machinery.SourceFileLoader)
again = pickle.loads(pickle.dumps(spec))
print(wrapped, abc_ok, file_ok, again.name, again.loader.get_filename("torch") == spec.origin)
import torch
from autoalloc import hook
print("DECIDED", hook.STATE.decision is not None)
"""


def run_code(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in the test venv (the hook installed), in a clean environment."""
    (tmp_path / "home").mkdir(exist_ok=True)
    result = subprocess.run(
        [PY, "-c", code],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_find_spec_loader_passes_isinstance_and_pickles(tmp_path: Path) -> None:
    result = run_code(tmp_path, LOADER_CHECKS)
    first = result.stdout.splitlines()[0].split()
    assert first == ["True", "True", "True", "torch", "True"]
    assert "DECIDED True" in result.stdout  # and the import still went through the wrapper


def test_wrapper_isinstance_in_process() -> None:
    real = importlib.machinery.SourceFileLoader("x", __file__)
    wrapped = _autoalloc_loader.Loader(real)
    assert isinstance(wrapped, importlib.abc.Loader)
    assert isinstance(wrapped, importlib.machinery.SourceFileLoader)
    assert isinstance(wrapped, _autoalloc_loader.Loader)  # the watcher still knows its own wrapper
    assert not isinstance(real, _autoalloc_loader.Loader)
    # pickled or copied, it is the real loader: the wrapper is this process's machinery
    again = pickle.loads(pickle.dumps(wrapped))
    assert type(again) is importlib.machinery.SourceFileLoader and again.path == __file__


class Gate:
    """A finder placed right after the watcher: every thread's lookup of ``torch`` waits here
    until all of them are inside the watcher at once, then lets the real finders answer."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties)

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch":
            self.barrier.wait(timeout=10)
        return None


def _look(specs: list[object]) -> None:
    try:
        specs.append(_startup.find_spec("torch"))
    except threading.BrokenBarrierError:
        specs.append("broken")


def test_concurrent_lookups_are_each_watched() -> None:
    threads_per_round, rounds = 4, 200
    watcher = _startup  # the module is the finder
    assert _startup.names == {"torch"}
    for _ in range(rounds):
        gate = Gate(threads_per_round)
        specs: list[object] = []
        sys.meta_path[:0] = [watcher, gate]
        try:
            threads = [
                threading.Thread(target=_look, args=(specs,))
                for _ in range(threads_per_round)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            sys.meta_path.remove(watcher)
            sys.meta_path.remove(gate)
        # Every thread got torch's spec with the loader wrapped: none was turned away because
        # another thread was inside the watcher at that moment.
        assert [type(getattr(s, "loader", s)).__name__ for s in specs] == ["Loader"] * len(specs)
        assert _autoalloc_loader._busy == set()


RACE = """
import importlib.util, sys, threading
stop = threading.Event()
def probe():
    while not stop.is_set():
        importlib.util.find_spec("torch")
t = threading.Thread(target=probe)
t.start()
import torch
stop.set()
t.join()
from autoalloc import hook
print("DECIDED", hook.STATE.decision is not None)
"""


# Thread B starts the first import of the autoalloc package (and holds its module lock)
# while thread A looks torch up for the first time, under importlib's global lock: the
# watcher must not import from the package there. The gate widens the window between two
# finders, where importlib releases the global lock anyway.
DEADLOCK = """
import sys, threading, _imp, time
assert "autoalloc" not in sys.modules and "_autoalloc_loader" not in sys.modules
assert any(getattr(f, "autoalloc_watcher", False) for f in sys.meta_path)
b_in = threading.Event()
class Gate:
    def find_spec(self, name, path=None, target=None):
        if name == "autoalloc" and threading.current_thread().name == "B":
            _imp.release_lock(); b_in.set(); time.sleep(0.5); _imp.acquire_lock()
        return None
sys.meta_path.insert(0, Gate())
def b():
    import autoalloc.envvars
def a():
    b_in.wait()
    import importlib.util
    assert importlib.util.find_spec("torch") is not None
tb = threading.Thread(target=b, name="B", daemon=True)
ta = threading.Thread(target=a, name="A", daemon=True)
tb.start(); ta.start(); tb.join(10); ta.join(10)
print("DEADLOCK" if tb.is_alive() or ta.is_alive() else "OK", flush=True)
"""


def test_first_lookup_of_torch_beside_a_first_import_of_autoalloc_does_not_deadlock(
    tmp_path: Path,
) -> None:
    assert run_code(tmp_path, DEADLOCK).stdout.split() == ["OK"]


def test_copies_of_the_meta_path_keep_the_watcher() -> None:
    """Programs copy sys.meta_path (``copy.deepcopy``): the module-finder copies as itself."""
    import copy

    assert copy.copy(_startup) is _startup
    assert copy.deepcopy([_startup]) == [_startup]


@pytest.mark.slow  # a few real interpreters importing torch: the full run
def test_import_torch_racing_find_spec_in_another_thread_still_decides(tmp_path: Path) -> None:
    for _ in range(3):
        assert "DECIDED True" in run_code(tmp_path, RACE).stdout


def test_a_class_loader_copies_and_pickles_as_itself() -> None:
    """Built-in and frozen modules have a class as their loader (a watched import trigger may
    name one): a copied or pickled spec holds that class."""
    import copy

    wrapped = _autoalloc_loader.Loader(importlib.machinery.BuiltinImporter)
    assert copy.copy(wrapped) is importlib.machinery.BuiltinImporter
    assert copy.deepcopy(wrapped) is importlib.machinery.BuiltinImporter
    assert pickle.loads(pickle.dumps(wrapped)) is importlib.machinery.BuiltinImporter
    spec = importlib.util.find_spec("_thread")
    spec.loader = wrapped
    assert pickle.loads(pickle.dumps(spec)).loader is importlib.machinery.BuiltinImporter


def test_the_watcher_leaves_with_a_new_meta_path_list() -> None:
    """Another thread may be iterating sys.meta_path for its own import: removing an entry
    from that list would make it skip the next finder, so the hook rebinds a new list."""
    from autoalloc import late

    saved = sys.meta_path
    marker = type(sys)("watcher-for-test")
    marker.autoalloc_watcher = True
    sys.meta_path = [marker, *saved]
    try:
        before = sys.meta_path
        late.retire(marker)
        assert marker not in sys.meta_path and before[0] is marker  # the old list untouched
        assert sys.meta_path == saved
    finally:
        sys.meta_path = saved
