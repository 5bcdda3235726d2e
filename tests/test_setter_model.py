"""The reset model (``allocconf.dropped_by_setter``) against torch's own parser.

Pure cases first; then real torch in a subprocess (autoalloc disabled, so only torch
speaks): on the 2.14.1 CUDA build ``_snapshot()["allocator_settings"]`` shows the parsed
value of every key it knows after each call of a sequence, and must match what the model
predicts; on both builds a sticky ``large_segment_size_mb`` shows through the check it
makes on ``max_split_size_mb``, and the getter (2.13) returns the last string passed.
"""

from __future__ import annotations

import json

import pytest

from autoalloc import allocconf
from tests.helpers import CUDA_PY, Sandbox

P = allocconf.parse
RESET = {"max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold"}


def test_reset_keys_per_release() -> None:
    for release in ((1, 13), (2, 0), (2, 9), (2, 10), (2, 13), (2, 14), (3, 0), None):
        assert allocconf.setter_resets(release) == RESET
    assert allocconf.setter_resets((1, 12)) == frozenset()
    kept = {"expandable_segments", "large_segment_size_mb", "backend"}
    assert not allocconf.setter_resets(None) & kept


def test_dropped_by_setter_pure() -> None:
    env = P("garbage_collection_threshold:0.8,max_split_size_mb:512,expandable_segments:True")
    dropped, after = allocconf.dropped_by_setter, allocconf.after_setter
    call = P("expandable_segments:True")
    assert dropped(env, call, (2, 13)) == [
        ("garbage_collection_threshold", "0.8"), ("max_split_size_mb", "512"),
    ]
    # a key the call names is set by it, not dropped; a repeated key counts with its last value
    call = P("max_split_size_mb:256")
    assert dropped(env, call, (2, 13)) == [("garbage_collection_threshold", "0.8")]
    env2 = P("max_split_size_mb:100,max_split_size_mb:200")
    assert dropped(env2, [], (2, 14)) == [("max_split_size_mb", "200")]
    # nothing reset in effect: nothing dropped
    assert dropped(P("expandable_segments:True,large_segment_size_mb:64"), [], (2, 14)) == []
    assert after(env, P("expandable_segments:False"), (2, 14)) == [("expandable_segments", "False")]
    lock = P("release_lock_on_cudamalloc:True")
    assert after(lock, P("max_split_size_mb:64"), (2, 14)) == [
        ("release_lock_on_cudamalloc", "True"), ("max_split_size_mb", "64"),
    ]


def test_merged_for_setter_pure() -> None:
    env = P("backend:native,garbage_collection_threshold:0.8,expandable_segments:True")
    def merged(call: str) -> str:
        return allocconf.serialize(allocconf.merged_for_setter(env, P(call)))

    assert merged("expandable_segments:False") == (
        "garbage_collection_threshold:0.8,expandable_segments:False"
    )
    assert merged("max_split_size_mb:64") == (
        "garbage_collection_threshold:0.8,expandable_segments:True,max_split_size_mb:64"
    )


# Each snapshot field: the key that sets it and how a value reads back (None: torch's default).
SNAPSHOT_FIELDS = {
    "max_split_size": ("max_split_size_mb", lambda v: int(v) << 20),
    "garbage_collection_threshold": ("garbage_collection_threshold", float),
    "expandable_segments": ("expandable_segments", lambda v: v == "True"),
    "release_lock_on_cudamalloc": ("release_lock_on_cudamalloc", lambda v: v == "True"),
    "pinned_use_cuda_host_register": ("pinned_use_cuda_host_register", lambda v: v == "True"),
    "pinned_num_register_threads": ("pinned_num_register_threads", int),
    "graph_capture_record_stream_reuse": (
        "graph_capture_record_stream_reuse", lambda v: v == "True"
    ),
    "max_round_threshold": ("pinned_max_round_threshold_mb", lambda v: int(v) << 20),
    "max_cached_size": ("pinned_max_cached_size_mb", lambda v: int(v) << 20),
    "roundup_power2_divisions": ("roundup_power2_divisions", int),
}
EVERYTHING = (
    "max_split_size_mb:512,garbage_collection_threshold:0.8,roundup_power2_divisions:4,"
    "expandable_segments:True,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,"
    "pinned_num_register_threads:8,graph_capture_record_stream_reuse:True,"
    "pinned_max_round_threshold_mb:64,pinned_max_cached_size_mb:128,large_segment_size_mb:64"
)
CALLS = [
    "expandable_segments:True",
    "garbage_collection_threshold:0.5",
    "max_split_size_mb:256,expandable_segments:False",
    "pinned_num_register_threads:2",
    "roundup_power2_divisions:8,release_lock_on_cudamalloc:False",
    "graph_capture_record_stream_reuse:False",
]
SEQUENCE = r"""
import json, sys, torch
calls = json.loads(sys.argv[1])
set_ = torch._C._accelerator_setAllocatorSettings
def snap():
    s = dict(torch.cuda.memory._snapshot()["allocator_settings"])
    s["roundup_power2_divisions"] = sorted(set(s["roundup_power2_divisions"].values()))
    return s
out = {"start": snap(), "after": []}
for call in calls:
    set_(call)
    out["after"].append(snap())
print("SNAP " + json.dumps(out))
"""
STICKY = r"""
import sys, torch
set_ = torch._C._accelerator_setAllocatorSettings
set_("expandable_segments:True,garbage_collection_threshold:0.5")
try:
    set_("max_split_size_mb:50")
    print("STICKY accepted")
except ValueError as exc:
    print("STICKY " + str(exc))
set_("large_segment_size_mb:20,max_split_size_mb:50")
print("GETTER " + torch._C._accelerator_getAllocatorSettings())
"""


def _expected(pairs: list[tuple[str, str]], defaults: dict) -> dict:
    values = dict(pairs)
    out = {}
    for field, (key, read) in SNAPSHOT_FIELDS.items():
        if key not in values:
            out[field] = defaults[field]
        elif field == "roundup_power2_divisions":
            out[field] = [read(values[key])]
        else:
            out[field] = read(values[key])
    return out


@pytest.mark.cuda_build
@pytest.mark.skipif(not CUDA_PY, reason="AUTOALLOC_TORCH_CUDA_PYTHON is not set")
def test_model_matches_the_cuda_parser(sandbox: Sandbox) -> None:
    cuda_python = CUDA_PY
    off = {"AUTOALLOC_DISABLE": "1"}
    base = sandbox.run(["-c", SEQUENCE, "[]"], env=off, python=cuda_python)
    assert base.returncode == 0, base.stderr
    defaults = json.loads(base.stdout.split("SNAP ", 1)[1])["start"]
    env = {**off, "PYTORCH_CUDA_ALLOC_CONF": EVERYTHING}
    result = sandbox.run(["-c", SEQUENCE, json.dumps(CALLS)], env=env, python=cuda_python)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.split("SNAP ", 1)[1])
    pick = lambda snap: {k: snap[k] for k in SNAPSHOT_FIELDS}  # noqa: E731
    in_effect = P(EVERYTHING)
    assert pick(out["start"]) == _expected(in_effect, defaults)
    for call, snap in zip(CALLS, out["after"]):
        in_effect = allocconf.after_setter(in_effect, P(call), (2, 14))
        assert pick(snap) == _expected(in_effect, defaults), call
    # the first call dropped exactly what the model says
    dropped = allocconf.dropped_by_setter(P(EVERYTHING), P(CALLS[0]), (2, 14))
    assert {k for k, _ in dropped} == RESET


def test_large_segment_size_persists(sandbox: Sandbox, torch_python: str) -> None:
    env = {"AUTOALLOC_DISABLE": "1", "PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:100"}
    result = sandbox.run(["-c", STICKY], env=env, python=torch_python)
    assert result.returncode == 0, result.stderr
    tagged = [line for line in result.stdout.splitlines() if line.startswith(("STICKY", "GETTER"))]
    lines = dict(line.split(" ", 1) for line in tagged)
    # a later call that does not name large_segment_size_mb still checks against 100
    assert lines["STICKY"] == "CachingAllocator option max_split_size_mb too small, must be >= 100"
    assert "large_segment_size_mb" not in allocconf.setter_resets((2, 13))
    # the getter returns the last string passed, as it was passed
    assert lines["GETTER"] == "large_segment_size_mb:20,max_split_size_mb:50"
