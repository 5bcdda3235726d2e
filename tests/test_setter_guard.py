"""A later runtime setter call that drops the options in effect: one precise warning, or merge.

Real torch in subprocesses. The NeMo pattern: a trainer under a NeMo-like path, the user's
options in ``PYTORCH_CUDA_ALLOC_CONF``, and a dataloader module that calls
``torch.cuda.memory._set_allocator_settings("expandable_segments:True")``, as NeMo's Lhotse
dataloader does. Torch then says what it uses: the getter (2.13) and, on the 2.14.1 CUDA
build, ``_snapshot()["allocator_settings"]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoalloc import guards, policy
from autoalloc.messages import shortened
from tests.helpers import CUDA_PY, NEMO, PY, Sandbox, autoalloc_warnings, validate

USER = "garbage_collection_threshold:0.8,max_split_size_mb:512"
ENV = {"PYTORCH_CUDA_ALLOC_CONF": USER}
MERGE = 'on_setter = "merge"\n'
# The library module; "# L:" tags name the lines the tests look for.
DATALOADER = """\
import torch


def build():
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")  # L:build


def build_kwargs():
    torch.cuda.memory._set_allocator_settings(env="expandable_segments:True")  # L:kwargs


def direct(value):
    torch._C._accelerator_setAllocatorSettings(value)  # L:direct
"""
# The trainer: runs the steps named on its command line, then says what torch uses.
TRAINER = r"""
import json, os, sys, warnings
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import torch
import dataloader

warnings.simplefilter("always")
out = {"errors": {}}

def raw_outcome(value):
    try:
        torch._C._accelerator_setAllocatorSettings.__wrapped__(value)
        return "ok"
    except Exception as exc:
        return [type(exc).__name__, str(exc)]

for step in sys.argv[1:]:
    if step == "build":
        dataloader.build()
    elif step == "kwargs":
        dataloader.build_kwargs()
    elif step == "vllm":
        for _ in range(2):
            dataloader.direct("expandable_segments:False")  # L:vllm_off
            dataloader.direct("expandable_segments:True")  # L:vllm_on
    elif step.startswith("direct="):
        try:
            dataloader.direct(step[7:])
        except Exception as exc:
            out["errors"][step] = [[type(exc).__name__, str(exc)], raw_outcome(step[7:])]
out["getter"] = torch._C._accelerator_getAllocatorSettings()
if torch.version.cuda:
    s = torch.cuda.memory._snapshot()["allocator_settings"]
    out["snapshot"] = {k: s[k] for k in ("max_split_size", "garbage_collection_threshold",
                                         "expandable_segments")}
print("TRAINER " + json.dumps(out))
"""


def _line(text: str, tag: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if f"# L:{tag}" in line)


def _setup(sandbox: Sandbox, script: str = NEMO) -> tuple[Path, Path]:
    trainer = sandbox.write(script, TRAINER)
    module = sandbox.write(Path(script).parent / "lib" / "dataloader.py", DATALOADER)
    return trainer, module


def _run(sandbox: Sandbox, trainer: Path, steps: list[str], python: str = PY, **env: str):
    result = sandbox.run([str(trainer), *steps], env={**ENV, **env}, python=python)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.split("TRAINER ", 1)[1]), autoalloc_warnings(result.stderr)


def _setter_warnings(lines: list[str]) -> list[str]:
    return [line for line in lines if "this call" in line]


def _reset(module: Path, tag: str, keys: str = USER.replace(",", ", ")) -> str:
    return (
        f"autoalloc: {module}:{_line(DATALOADER, tag)}: this call resets {keys} (from "
        f"PYTORCH_CUDA_ALLOC_CONF) to torch's defaults; set on_setter = \"merge\" to keep them"
    )


def test_nemo_pattern_warns_once_naming_each_key(sandbox: Sandbox, torch_python: str) -> None:
    trainer, module = _setup(sandbox)
    out, warned = _run(sandbox, trainer, ["build", "build"], python=torch_python)
    (setter,) = _setter_warnings(warned)
    assert setter.endswith(_reset(module, "build"))
    assert setter.startswith(f"{module}:{_line(DATALOADER, 'build')}: AutoallocWarning: ")
    assert out["getter"] == "expandable_segments:True"  # what torch read: the options are gone
    if torch_python == CUDA_PY:
        assert out["snapshot"] == {
            "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": True,
        }


def test_nemo_pattern_with_merge_keeps_every_option(sandbox: Sandbox, torch_python: str) -> None:
    trainer, module = _setup(sandbox)
    sandbox.write("autoalloc.toml", MERGE)
    env = {**ENV, "AUTOALLOC_DEBUG": "1"}
    result = sandbox.run([str(trainer), "build"], env=env, python=torch_python)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.split("TRAINER ", 1)[1])
    assert _setter_warnings(autoalloc_warnings(result.stderr)) == []
    merged = f"{USER},expandable_segments:True"
    assert out["getter"] == merged
    note = (
        f"autoalloc: {module}:{_line(DATALOADER, 'build')}: on_setter = merge: "
        f"torch gets {shortened(merged)} "
        f"for 'expandable_segments:True' (keeps {USER.replace(',', ', ')})"
    )
    assert note in result.stderr.splitlines()
    if torch_python == CUDA_PY:
        assert out["snapshot"] == {
            "max_split_size": 512 << 20, "garbage_collection_threshold": 0.8,
            "expandable_segments": True,
        }


def test_vllm_pattern(sandbox: Sandbox) -> None:
    trainer, module = _setup(sandbox)
    out, warned = _run(sandbox, trainer, ["vllm"])
    (setter,) = _setter_warnings(warned)
    assert setter.endswith(
        f"autoalloc: {module}:{_line(DATALOADER, 'direct')}: "
        "this call sets expandable_segments:False, "
        "undoing what autoalloc applied (rule nemo-asr-train: expandable_segments:True); memory "
        "segments created from now on are not expandable; it also resets "
        f"{USER.replace(',', ', ')} (from PYTORCH_CUDA_ALLOC_CONF) to torch's defaults; "
        'set on_setter = "merge" to keep them'
    )
    assert out["getter"] == "expandable_segments:True"


def test_direct_call_names_only_what_it_drops(sandbox: Sandbox) -> None:
    trainer, module = _setup(sandbox)
    out, warned = _run(sandbox, trainer, ["direct=max_split_size_mb:256"])
    (setter,) = _setter_warnings(warned)
    assert setter.endswith(
        f"autoalloc: {module}:{_line(DATALOADER, 'direct')}: this call resets "
        "garbage_collection_threshold:0.8 (from PYTORCH_CUDA_ALLOC_CONF) to torch's default; "
        'set on_setter = "merge" to keep it'
    )
    assert out["getter"] == "max_split_size_mb:256"
    # a call that changes nothing in effect says nothing
    out, warned = _run(sandbox, trainer, [f"direct={USER},expandable_segments:False"])
    assert [w for w in _setter_warnings(warned) if "resets" in w] == []


# the full run: other spellings of the same call (test_direct_call_names_only_what_it_drops
# makes it in the quick run; test_guards checks the deprecated path's FutureWarning)
@pytest.mark.slow
def test_kwargs_and_deprecated_path(sandbox: Sandbox) -> None:
    trainer, module = _setup(sandbox)
    result = sandbox.run([str(trainer), "kwargs"], env=ENV)
    assert result.returncode == 0, result.stderr
    (setter,) = _setter_warnings(autoalloc_warnings(result.stderr))
    assert setter.endswith(_reset(module, "kwargs"))
    # torch's own FutureWarning still points at the caller's line
    future = [line for line in result.stderr.splitlines() if "FutureWarning" in line]
    assert future == [
        f"{module}:{_line(DATALOADER, 'kwargs')}: FutureWarning: "
        "torch.cuda._set_allocator_settings "
        "is deprecated. Use torch._C._accelerator_setAllocatorSettings instead."
    ]


@pytest.mark.parametrize("mode", ["warn", pytest.param("merge", marks=pytest.mark.slow)])
def test_rejected_string_passes_through(sandbox: Sandbox, mode: str) -> None:
    trainer, _ = _setup(sandbox)
    if mode == "merge":
        sandbox.write("autoalloc.toml", MERGE)
    bad = "expandable_segments:true"
    out, warned = _run(sandbox, trainer, [f"direct={bad}"])
    (ours, raw) = out["errors"][f"direct={bad}"]
    assert ours == raw and ours[0] == "ValueError"
    assert out["getter"] == bad  # torch stores the string it was given, even when it rejects it
    assert _setter_warnings(warned) == []


@pytest.mark.parametrize("mode", ["warn", pytest.param("merge", marks=pytest.mark.slow)])
def test_silent_where_autoalloc_applied_nothing(sandbox: Sandbox, mode: str) -> None:
    trainer, _ = _setup(sandbox, "proj/plain.py")
    if mode == "merge":
        sandbox.write("autoalloc.toml", MERGE)
    out, warned = _run(sandbox, trainer, ["build", "vllm"])
    assert warned == []
    assert out["getter"] == "expandable_segments:True"


DATALOADER_JOB = r"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import torch
import dataloader
from torch.utils.data import DataLoader

def init(worker_id):
    dataloader.build()

if __name__ == "__main__":
    if "main-first" in sys.argv:
        dataloader.build()
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, worker_init_fn=init,
                        multiprocessing_context=sys.argv[1])
    print(sum(len(batch) for batch in loader))
"""


# Both orders, with fork and with spawn (fresh interpreters warn once per job: the torchrun
# test below).
@pytest.mark.slow  # DataLoader workers: the full run, as the other multi-process runs
@pytest.mark.parametrize(
    ("main_first", "context"),
    [
        pytest.param(True, "fork", id="main-first-fork"),
        pytest.param(False, "fork", id="workers-only-fork"),
        pytest.param(True, "spawn", id="main-first-spawn", marks=pytest.mark.slow),
        pytest.param(False, "spawn", id="workers-only-spawn", marks=pytest.mark.slow),
    ],
)
def test_dataloader_workers_warn_once_per_job(
    sandbox: Sandbox, context: str, main_first: bool
) -> None:
    trainer = sandbox.write(NEMO, DATALOADER_JOB)
    module = sandbox.write(Path(NEMO).parent / "lib" / "dataloader.py", DATALOADER)
    args = [str(trainer), context, *(["main-first"] if main_first else [])]
    result = sandbox.run(args, env=ENV)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["8"]
    (setter,) = _setter_warnings(autoalloc_warnings(result.stderr))
    assert setter.endswith(_reset(module, "build"))


TORCHRUN_JOB = r"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import torch
import torch.distributed as dist
import dataloader

dist.init_process_group("gloo")
dataloader.build()
dist.barrier()
# one write per line: the ranks share the pipe, and print() writes its parts one by one
sys.stdout.write(f"RANK {dist.get_rank()} {torch._C._accelerator_getAllocatorSettings()}\n")
dist.destroy_process_group()
"""


@pytest.mark.slow  # a torchrun job: the full run, as the other multi-process runs
def test_torchrun_ranks_warn_once_per_job(sandbox: Sandbox) -> None:
    trainer = sandbox.write(NEMO, TORCHRUN_JOB)
    module = sandbox.write(Path(NEMO).parent / "lib" / "dataloader.py", DATALOADER)
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(trainer)]
    result = sandbox.run(args, env={**ENV, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("RANK")) == [
        "RANK 0 expandable_segments:True", "RANK 1 expandable_segments:True",
    ]
    (setter,) = _setter_warnings(autoalloc_warnings(result.stderr))
    assert _reset(module, "build") in setter


@pytest.mark.hook
def test_on_setter_policy_key() -> None:
    source = policy.Source("project", "/w/autoalloc.toml")
    assert validate({"on_setter": "merge"}, source).on_setter == "merge"
    with pytest.raises(policy.PolicyError, match="on_setter must be 'warn' or 'merge'"):
        validate({"on_setter": "keep"}, source)
    composed = policy.compose([validate({"on_setter": "merge"}, source)])
    assert composed.on_setter == policy.Valued("merge", source)
    assert policy.compose([]).on_setter == policy.Valued("warn")


@pytest.mark.hook
def test_reset_message_groups_by_source() -> None:
    dropped = [("max_split_size_mb", "512"), ("garbage_collection_threshold", "0.8")]
    origin = {
        "max_split_size_mb": "PYTORCH_CUDA_ALLOC_CONF",
        "garbage_collection_threshold": "rule r in /p",
    }
    assert guards.reset_message(dropped, origin) == (
        "resets max_split_size_mb:512 (from PYTORCH_CUDA_ALLOC_CONF) and "
        "garbage_collection_threshold:0.8 "
        "(from rule r in /p) to torch's defaults; set on_setter = \"merge\" to keep them"
    )


def test_explain_shows_on_setter(sandbox: Sandbox) -> None:
    sandbox.write("autoalloc.toml", MERGE)
    sandbox.write(NEMO, "")
    result = sandbox.run(["-m", "autoalloc", "explain", "--json", "--", "python", NEMO])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    where = f"project ({sandbox.work / 'autoalloc.toml'})"
    assert report["on_setter"] == {"value": "merge", "from": where}
    text = sandbox.run(["-m", "autoalloc", "explain", "--", "python", NEMO]).stdout
    assert f"on_setter:    merge  [{where}]" in text.splitlines()


STATUS_JOB = r"""
import json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import torch
import dataloader
import autoalloc

dataloader.build()
status = autoalloc.status()
print("STATUS " + json.dumps(status.as_dict()["torch_reports"]["setter_calls"]))
print(str(status))
"""


def test_status_shows_what_a_call_changed(sandbox: Sandbox, torch_python: str) -> None:
    trainer = sandbox.write(NEMO, STATUS_JOB)
    module = sandbox.write(Path(NEMO).parent / "lib" / "dataloader.py", DATALOADER)
    result = sandbox.run([str(trainer)], env=ENV, python=torch_python)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.split("STATUS ", 1)[1].splitlines()[0])
    where = f"{module}:{_line(DATALOADER, 'build')}"
    (call,) = report["calls"]
    assert call == {
        "where": where, "value": "expandable_segments:True", "passed": "expandable_segments:True",
        "dropped": [["garbage_collection_threshold", "0.8"], ["max_split_size_mb", "512"]],
        "kept": False, "error": None,
    }
    options = report["options"]
    assert list(options) == [
        "garbage_collection_threshold", "max_split_size_mb", "expandable_segments"
    ]
    gc, split, segments = options.values()
    source = "snapshot" if torch_python == CUDA_PY else "autoalloc's model of the calls"
    assert split == {
        "asked": "512", "from": "PYTORCH_CUDA_ALLOC_CONF", "now": None, "reported_by": source,
        "changed_by": where, "ok": False,
    }
    assert (gc["from"], gc["changed_by"], gc["ok"]) == ("PYTORCH_CUDA_ALLOC_CONF", where, False)
    assert (segments["now"], segments["changed_by"], segments["ok"]) == ("True", None, True)
    assert (
        f"  max_split_size_mb: asked 512 (from PYTORCH_CUDA_ALLOC_CONF), torch now uses torch's "
        f"default ({source}, changed by the call at {where})  LOST"
    ) in result.stdout.splitlines()


@pytest.mark.hook
def test_origins_name_the_variable_the_rule_and_the_file() -> None:
    from autoalloc.decide import decide
    from autoalloc.entrypoint import EntryPoint
    from autoalloc.torchinfo import TorchInfo

    source = policy.Source("project", "/w/autoalloc.toml")
    rule = {
        "name": "asr", "scripts": ["train_asr.py"], "allocator": {"roundup_power2_divisions": 4}
    }
    composed = policy.compose([validate({"rules": [rule]}, source)])
    entry = EntryPoint("script", "/w/train_asr.py", (), "/w/train_asr.py", "/w/train_asr.py")
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
    decision = decide(composed, entry, env, TorchInfo("2.14.1+cu130", cuda="13.0"))
    expected = {
        "max_split_size_mb": "PYTORCH_CUDA_ALLOC_CONF",
        "expandable_segments": "autoalloc's defaults",
        "roundup_power2_divisions": "rule asr in /w/autoalloc.toml",
    }
    assert guards.origins(decision, composed, env) == expected
    # a child of that job: the parent's record of the user's variables says which keys were theirs
    child_env = {**env, **decision.writes}
    child = decide(composed, entry, child_env, TorchInfo("2.14.1+cu130", cuda="13.0"))
    assert child.action == "inherited"
    assert guards.origins(child, composed, child_env) == expected
