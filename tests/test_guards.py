"""Guards after ``import torch``: real torch, real calls; one warning at the caller's line, nothing else changed.

One script exercises every guarded entry point in a process whose start matched a rule
(both torch builds) and, renamed so that no rule matches, in a process where autoalloc
applied nothing (torch 2.13 CPU). Each call's warnings are recorded with their category,
file and line (and still printed), and torch's own behaviour is compared with the
unwrapped function (``__wrapped__``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from autoalloc import guards
from tests.helpers import PY, Sandbox, autoalloc_warnings, clean_env

RULE = '[[rules]]\nname = "asr"\nscripts = ["train_asr.py"]\n'
PLUGGABLE_C = """
#include <stdlib.h>
#include <sys/types.h>
void* aa_malloc(ssize_t size, int device, void* stream) { return malloc(size); }
void aa_free(void* ptr, ssize_t size, int device, void* stream) { free(ptr); }
"""

# Lines tagged "# L:<name>" are looked up by the test; keep each guarded call on its own line.
SCRIPT = r'''
import json, os, sys, warnings
import torch

warnings.simplefilter("always")
seen = []
_show = warnings.showwarning
def record(message, category, filename, lineno, file=None, line=None):
    seen.append({"category": category.__name__, "file": filename, "line": lineno, "message": str(message)})
    _show(message, category, filename, lineno, file, line)
warnings.showwarning = record

out = {"calls": {}}
def mark(name, value):
    out["calls"][name] = {"result": value, "warnings": seen[:]}
    seen.clear()

def outcome(fn, *args, **kwargs):
    try:
        return ["ok", repr(fn(*args, **kwargs))]
    except Exception as exc:
        return ["raise", type(exc).__name__, str(exc)]

setter = torch.cuda.memory._set_allocator_settings
r = setter("expandable_segments:True")  # L:memory_true
mark("memory_true", repr(r))
for _ in range(2):
    r = setter("expandable_segments:False")  # L:memory_false
mark("memory_false", repr(r))
out["getter_after_false"] = torch._C._accelerator_getAllocatorSettings()
try:
    setter("expandable_segments:false")  # L:memory_bad
except Exception as exc:
    mark("memory_bad", [type(exc).__name__, str(exc)])
mark("raw_bad", outcome(torch._C._accelerator_setAllocatorSettings.__wrapped__, "expandable_segments:false"))

accel = torch._C._accelerator_setAllocatorSettings
r = accel("expandable_segments:True")  # L:accel_true
mark("accel_true", repr(r))
r = accel("expandable_segments:False")  # L:accel_false
mark("accel_false", repr(r))
out["accel_names"] = [accel.__name__, hasattr(accel, "__wrapped__")]

so = os.environ.get("PLUGGABLE_SO")
if so and torch.version.cuda:
    allocator = torch.cuda.memory.CUDAPluggableAllocator(so, "aa_malloc", "aa_free")
else:
    allocator = object()
change = torch.cuda.memory.change_current_allocator
try:
    r = ["ok", repr(change(allocator))]  # L:change
except Exception as exc:
    r = ["raise", type(exc).__name__, str(exc)]
mark("change", r)
if r[0] == "raise":
    mark("raw_change", outcome(change.__wrapped__, allocator))
else:
    out["backend"] = torch.cuda.memory.get_allocator_backend()
pool_allocator = allocator.allocator() if hasattr(allocator, "allocator") else allocator
try:
    r = ["ok", repr(torch.cuda.MemPool(allocator=pool_allocator))]  # L:mempool
except Exception as exc:
    r = ["raise", type(exc).__name__, str(exc)]
mark("mempool", r)
def raw_pool():
    pool = torch.cuda.MemPool.__new__(torch.cuda.MemPool)
    return torch.cuda.MemPool.__init__.__wrapped__(pool, allocator=pool_allocator)
mark("raw_mempool", outcome(raw_pool))
out["cuda_build"] = torch.version.cuda is not None
print("GUARDS " + json.dumps(out))
'''


def _lines(text: str) -> dict[str, int]:
    return {line.split("# L:")[1].strip(): n for n, line in enumerate(text.splitlines(), 1) if "# L:" in line}


def _run(sandbox: Sandbox, name: str, python: str) -> tuple[dict, dict[str, int], Path, str]:
    script = sandbox.write(f"proj/{name}", SCRIPT)
    sandbox.write("proj/autoalloc.toml", RULE)
    env = {}
    cc = shutil.which("cc")
    if cc:
        source = sandbox.write("pluggable.c", PLUGGABLE_C)
        so = sandbox.root / "pluggable.so"
        if subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(source)], capture_output=True).returncode == 0:
            env["PLUGGABLE_SO"] = str(so)
    result = sandbox.run([str(script)], env=env, python=python)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.split("GUARDS ", 1)[1])
    return out, _lines(SCRIPT), script, result.stderr


def _ours(call: dict) -> list[dict]:
    return [w for w in call["warnings"] if w["category"] == "AutoallocWarning"]


def test_guards_after_a_matching_start(sandbox: Sandbox, torch_python: str) -> None:
    out, line, script, stderr = _run(sandbox, "train_asr.py", torch_python)
    calls = out["calls"]
    where = lambda name: f"autoalloc: {script}:{line[name]}: "  # noqa: E731

    # torch.cuda.memory._set_allocator_settings: True says nothing, False says it once, at the call
    assert _ours(calls["memory_true"]) == []
    (warning,) = _ours(calls["memory_false"])
    assert (warning["file"], warning["line"]) == (str(script), line["memory_false"])
    assert warning["message"] == where("memory_false") + (
        "this call sets expandable_segments:False, undoing what autoalloc applied (rule asr: expandable_segments:True); "
        "memory segments created from now on are not expandable"
    )
    assert out["getter_after_false"] == "expandable_segments:False"  # never blocked
    # torch's FutureWarning is untouched: one per call (two calls in the loop), at the caller's line
    for name, calls_made in (("memory_true", 1), ("memory_false", 2)):
        futures = [w for w in calls[name]["warnings"] if w["category"] == "FutureWarning"]
        assert len(futures) == calls_made
        for future in futures:
            assert (future["file"], future["line"]) == (str(script), line[name])
            assert future["message"] == (
                "torch.cuda._set_allocator_settings is deprecated. Use torch._C._accelerator_setAllocatorSettings instead."
            )
        assert calls[name]["result"] == "None"
    # a value torch rejects: torch's exception passes through unchanged
    assert calls["memory_bad"]["result"][0] == "ValueError"
    assert calls["memory_bad"]["result"] == calls["raw_bad"]["result"][1:]
    assert _ours(calls["memory_bad"]) == []

    # torch._C._accelerator_setAllocatorSettings likewise, and it still looks like itself
    assert _ours(calls["accel_true"]) == [] and calls["accel_true"]["result"] == "None"
    (warning,) = _ours(calls["accel_false"])
    assert (warning["file"], warning["line"]) == (str(script), line["accel_false"])
    assert warning["message"].startswith(where("accel_false") + "this call sets expandable_segments:False")
    assert [w["category"] for w in calls["accel_false"]["warnings"]] == ["AutoallocWarning"]
    assert out["accel_names"] == ["_accelerator_setAllocatorSettings", True]

    # change_current_allocator: reported; torch's result or exception unchanged
    (warning,) = _ours(calls["change"])
    assert (warning["file"], warning["line"]) == (str(script), line["change"])
    assert warning["message"] == where("change") + (
        "change_current_allocator replaces torch's caching allocator, so the options autoalloc applied "
        "(rule asr: expandable_segments:True) no longer apply"
    )
    if calls["change"]["result"][0] == "raise":  # CPU build (or no C compiler): no allocator to swap in
        assert calls["change"]["result"] == calls["raw_change"]["result"]
    else:  # 2.14.1 CUDA build with a real pluggable allocator: the swap happens
        assert calls["change"]["result"] == ["ok", "None"] and out["backend"] == "pluggable"

    # torch.cuda.MemPool(allocator=...): reported; without a GPU torch refuses, with its own exception
    assert calls["mempool"]["result"][0] == "raise"
    assert calls["mempool"]["result"] == calls["raw_mempool"]["result"]
    assert _ours(calls["raw_mempool"]) == []
    if out["cuda_build"]:
        (warning,) = _ours(calls["mempool"])
        assert (warning["file"], warning["line"]) == (str(script), line["mempool"])
        assert warning["message"] == where("mempool") + (
            "torch.cuda.MemPool(allocator=...) allocates through a custom allocator, so the options autoalloc applied "
            "(rule asr: expandable_segments:True) do not apply to its memory"
        )
    else:  # CPU builds: MemPool is a dummy class that refuses to be created at all (in __new__)
        assert calls["mempool"]["result"][1:] == ["RuntimeError", "Tried to instantiate dummy base class MemPool"]
        assert _ours(calls["mempool"]) == []

    # exactly these AutoallocWarnings reached stderr, nothing at import
    assert len(autoalloc_warnings(stderr)) == (4 if out["cuda_build"] else 3), stderr


def test_guards_silent_when_nothing_was_applied(sandbox: Sandbox) -> None:
    out, _, _, stderr = _run(sandbox, "plain.py", PY)
    assert autoalloc_warnings(stderr) == []
    assert all(_ours(call) == [] for call in out["calls"].values())
    assert out["getter_after_false"] == "expandable_segments:False"


@pytest.mark.hook
def test_setter_conflicts_pure() -> None:
    intent = {"expandable_segments": "True"}
    assert guards.setter_conflicts(intent, "expandable_segments:False") == ["expandable_segments:False"]
    assert guards.setter_conflicts(intent, " expandable_segments : True ") == []
    assert guards.setter_conflicts(intent, "expandable_segments:False,expandable_segments:True") == []
    assert guards.setter_conflicts(intent, "backend:cudaMallocAsync") == ["backend:cudaMallocAsync"]
    assert guards.setter_conflicts(intent, "backend:native") == []
    assert guards.setter_conflicts(intent, "foo") == []  # torch rejects it itself
    assert guards.setter_conflicts({}, "expandable_segments:False") == []  # autoalloc applied nothing
    assert guards.setter_conflicts({"expandable_segments": "False"}, "expandable_segments:False") == []
    assert guards.setter_conflicts(intent, b"expandable_segments:False") == []


def test_guarded_setter_still_pickles(tmp_path: Path) -> None:
    # torch's C setter pickles by reference (torch._C.<name>); the guard in its place must too
    code = (
        "import pickle, torch; s = torch._C._accelerator_setAllocatorSettings; "
        "print(type(s).__name__, pickle.loads(pickle.dumps(s)) is s)"
    )
    env = {**clean_env(tmp_path), "HOME": str(tmp_path)}
    result = subprocess.run(
        [PY, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["function", "True"]  # guarded, and still pickles


def test_guards_never_ask_torch_where_nothing_was_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch before 2.12 on CUDA: the only word torch has is _snapshot(), seconds with CUDA up
    import types

    import torch

    snapshots: list[int] = []
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a: snapshots.append(1) or {})
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    state = types.SimpleNamespace(decision=None, policy=None, torch=None, torch_module=torch,
                                  setters=None)
    passed: list[str] = []
    setter = guards._guard_setter(passed.append, state)
    for value in ("expandable_segments:True", "expandable_segments:False", "max_split_size_mb:64"):
        setter(value)  # vLLM toggles it around its sleep mode
    assert passed == ["expandable_segments:True", "expandable_segments:False", "max_split_size_mb:64"]
    assert snapshots == []
    assert guards.in_effect(state).pairs == (
        ("expandable_segments", "False"), ("max_split_size_mb", "64"),
    )  # the model follows the calls
    guards.in_effect(state, ask_torch=True)  # right before a late write: the getter or nothing
    assert snapshots == []


def test_guards_ask_the_getter_only_before_a_late_write(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import torch

    asked: list[int] = []
    getter = torch._C._accelerator_getAllocatorSettings
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings",
                        lambda: asked.append(1) or getter())
    state = types.SimpleNamespace(decision=None, policy=None, torch=None, torch_module=torch,
                                  setters=None)
    setter = guards._guard_setter(lambda value: None, state)
    setter("expandable_segments:False")
    assert asked == []  # nothing applied here: the call updates the model, torch is not asked
    guards.in_effect(state, ask_torch=True)
    assert asked == [1]
