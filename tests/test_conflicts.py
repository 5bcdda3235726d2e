"""Every conflict case: the pure decision per torch version (``hook``), then end to end on real torch.

The unit half builds ``TorchInfo`` for the versions of the reference's table (2.0, 2.1,
2.2, 2.9, 2.10, 2.14, ROCm 2.11/2.12, CPU, Windows) and checks the environment writes
and the exact warning texts. The end-to-end half runs real interpreters (torch 2.13
CPU and, with ``AUTOALLOC_TORCH_CUDA_PYTHON``, 2.14.1 CUDA) and asks torch what it read.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from autoalloc import allocconf
from autoalloc.decide import Decision, decide
from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import APPLIED_VAR, ORIGINAL_VAR
from autoalloc.torchinfo import TorchInfo
from tests.helpers import CUDA_PY, ES, PROBE, Sandbox, autoalloc_warnings, policy_of, probe_result

CUDA, HIP, ALLOC = allocconf.CUDA_VAR, allocconf.HIP_VAR, allocconf.ALLOC_VAR
TRAIN = EntryPoint("script", "/w/train_asr.py", (), "/w/train_asr.py", "/w/train_asr.py")

T20 = TorchInfo("2.0.1+cu118", cuda="11.8")
T21 = TorchInfo("2.1.2+cu121", cuda="12.1")
T22 = TorchInfo("2.2.2+cu121", cuda="12.1")
T29 = TorchInfo("2.9.1+cu128", cuda="12.8")
T210 = TorchInfo("2.10.0+cu128", cuda="12.8")
T214 = TorchInfo("2.14.1+cu130", cuda="13.0")
ROCM211 = TorchInfo("2.11.0+rocm7.0", hip="7.0.51831")
ROCM212 = TorchInfo("2.12.1+rocm7.1", hip="7.1.25424")
ROCM212_OLD = TorchInfo("2.12.1+rocm6.4", hip="6.4.43482")
ROCM29 = TorchInfo("2.9.1+rocm6.4", hip="6.4.43482")
CPU = TorchInfo("2.13.0+cpu")


def policy(**data: object):
    return policy_of(**{"rules": [{"name": "asr", "scripts": ["train_asr.py"]}], **data})


def run(env: dict[str, str], torch: TorchInfo | None = T214, platform: str = "linux", **data: object) -> Decision:
    d = decide(policy(**data), TRAIN, env, torch, platform=platform)
    assert d.action == "apply"
    for name, value in d.writes.items():  # never malformed
        if name not in (APPLIED_VAR, ORIGINAL_VAR):
            allocconf.parse(value)
            assert not allocconf.aborts_import(value)
    return d


def writes(d: Decision) -> dict[str, str]:
    """The decision's writes without the record of the original variables (tested in test_decide_core)."""
    return {k: v for k, v in d.writes.items() if k != ORIGINAL_VAR}


def child(d: Decision, env: dict[str, str], torch: TorchInfo | None = T214, **data: object) -> Decision:
    """The same decision in a child process that inherited the parent's environment."""
    return decide(policy(**data), TRAIN, {**env, **d.writes}, torch, platform="linux")


# ---------------------------------------------------------------- which variable, per version


@pytest.mark.hook
@pytest.mark.parametrize(
    "torch, order",
    [
        (T20, (CUDA,)),
        (T21, (CUDA,)),
        (T29, (CUDA,)),
        (ROCM29, (CUDA, HIP)),
        (T210, (CUDA, HIP, ALLOC)),
        (T214, (CUDA, HIP, ALLOC)),
        (ROCM211, (CUDA, HIP, ALLOC)),
        (CPU, (CUDA, HIP, ALLOC)),
        (None, (CUDA, HIP, ALLOC)),
    ],
)
def test_read_order_per_version(torch: TorchInfo | None, order: tuple[str, ...]) -> None:
    assert allocconf.read_order(torch) == order
    # set but empty counts: the first set one wins
    assert allocconf.effective_var({order[-1]: "x", order[0]: ""}, torch) == order[0]


@pytest.mark.hook
@pytest.mark.parametrize("torch", [T21, T29, T210, T214])
def test_nothing_set_writes_both_names_identically(torch: TorchInfo) -> None:
    # 2.9 prints a deprecation warning for the CUDA name unless PYTORCH_ALLOC_CONF holds the same value
    d = run({}, torch)
    assert writes(d) == {CUDA: ES, ALLOC: ES, APPLIED_VAR: f"asr;{ES}"}
    assert d.read_var == CUDA and d.warnings == ()


# ---------------------------------------------------------------- several variables


@pytest.mark.hook
def test_several_variables_set_but_empty_wins() -> None:
    env = {CUDA: "", ALLOC: ES}
    d = run(env, T214)
    assert d.warnings == (
        "autoalloc: several allocator variables are set to different values "
        "(PYTORCH_CUDA_ALLOC_CONF='', PYTORCH_ALLOC_CONF='expandable_segments:True'); torch 2.14.1+cu130 (CUDA 13.0) "
        "uses only PYTORCH_CUDA_ALLOC_CONF (set but empty, which still wins) and ignores PYTORCH_ALLOC_CONF. "
        "autoalloc merges into PYTORCH_CUDA_ALLOC_CONF.",
    )
    assert writes(d) == {CUDA: ES, APPLIED_VAR: f"asr;{ES}"}  # PYTORCH_ALLOC_CONF differs: left alone
    assert child(d, env).action == "inherited" and child(d, env).warnings == ()


@pytest.mark.hook
def test_several_variables_merge_into_the_one_torch_reads() -> None:
    env = {CUDA: "max_split_size_mb:256", ALLOC: "garbage_collection_threshold:0.5"}
    d = run(env, T214)
    assert d.value == "max_split_size_mb:256,expandable_segments:True"
    assert d.writes[CUDA] == d.value and ALLOC not in d.writes
    assert "uses only PYTORCH_CUDA_ALLOC_CONF and ignores PYTORCH_ALLOC_CONF" in d.warnings[0]
    assert len([w for w in d.warnings if "several allocator variables" in w]) == 1


@pytest.mark.hook
def test_several_variables_hip_on_a_cuda_build() -> None:
    # 2.10+ CUDA builds: generic keys from HIP, CUDA-only keys from PYTORCH_ALLOC_CONF
    env = {HIP: "garbage_collection_threshold:0.5", ALLOC: "release_lock_on_cudamalloc:True"}
    d = run(env, T214)
    assert d.warnings[0] == (
        "autoalloc: several allocator variables are set to different values "
        "(PYTORCH_HIP_ALLOC_CONF='garbage_collection_threshold:0.5', PYTORCH_ALLOC_CONF='release_lock_on_cudamalloc:True'); "
        "torch 2.14.1+cu130 (CUDA 13.0) uses only PYTORCH_HIP_ALLOC_CONF and ignores PYTORCH_ALLOC_CONF "
        "(CUDA-only options such as backend still come from PYTORCH_ALLOC_CONF). "
        "autoalloc merges into PYTORCH_HIP_ALLOC_CONF and writes the result to PYTORCH_CUDA_ALLOC_CONF too."
    )
    assert d.writes[HIP] == d.writes[CUDA] == "garbage_collection_threshold:0.5,expandable_segments:True"
    assert d.read_var == CUDA and ALLOC not in d.writes


@pytest.mark.hook
def test_torch_29_ignores_pytorch_alloc_conf() -> None:
    # 2.9's CUDA allocator reads only PYTORCH_CUDA_ALLOC_CONF (#183387): the other value stays ignored,
    # not copied over (it could hold keys this torch rejects)
    env = {ALLOC: "max_split_size_mb:64"}
    d = run(env, T29)
    assert d.warnings == (
        "autoalloc: torch 2.9.1+cu128 (CUDA 12.8) ignores PYTORCH_ALLOC_CONF='max_split_size_mb:64' (it reads only "
        "PYTORCH_CUDA_ALLOC_CONF); left as it is, and autoalloc writes PYTORCH_CUDA_ALLOC_CONF",
    )
    assert writes(d) == {CUDA: ES, APPLIED_VAR: f"asr;{ES}"}
    both = run({HIP: "a:b", ALLOC: "c:d"}, T29)
    assert both.warnings[0].endswith(
        "torch 2.9.1+cu128 (CUDA 12.8) reads none of them (it reads only PYTORCH_CUDA_ALLOC_CONF). "
        "autoalloc writes PYTORCH_CUDA_ALLOC_CONF."
    )
    assert both.writes[CUDA] == ES and HIP not in both.writes and ALLOC not in both.writes


@pytest.mark.hook
def test_same_value_in_several_variables_is_no_conflict() -> None:
    d = run({CUDA: "max_split_size_mb:256", ALLOC: "max_split_size_mb:256"}, T214, allocator={})
    assert not [w for w in d.warnings if "several" in w]
    assert d.writes[CUDA] == d.writes[ALLOC]  # both were the same: both stay the same


# ---------------------------------------------------------------- expandable_segments:False


@pytest.mark.hook
def test_explicit_false_is_kept_with_one_warning() -> None:
    env = {CUDA: "expandable_segments:False"}
    d = run(env, T214)
    assert d.warnings == (
        "autoalloc: PYTORCH_CUDA_ALLOC_CONF sets expandable_segments:False, rule asr wants expandable_segments:True; "
        'keeping expandable_segments:False (set on_conflict = "override" to replace it)',
    )
    assert d.value == "expandable_segments:False" and writes(d) == {APPLIED_VAR: "asr;expandable_segments:False"}
    inherited = child(d, env)
    assert inherited.action == "inherited" and inherited.warnings == () and inherited.rule == "asr"


@pytest.mark.hook
def test_explicit_false_overridden_on_request() -> None:
    env = {CUDA: "max_split_size_mb:512,expandable_segments:False"}
    d = run(env, T214, on_conflict="override")
    assert d.value == "max_split_size_mb:512,expandable_segments:True"
    assert d.notes == (
        "PYTORCH_CUDA_ALLOC_CONF sets expandable_segments:False; replaced by expandable_segments:True for rule asr "
        '(on_conflict = "override" in project (/w/autoalloc.toml))',
    )
    assert not [w for w in d.warnings if "expandable_segments:False" in w]


@pytest.mark.hook
def test_duplicate_key_conflict_uses_the_last_occurrence() -> None:
    # torch keeps the last value of a repeated key
    quiet = run({CUDA: "expandable_segments:False,expandable_segments:True"}, T214)
    assert not [w for w in quiet.warnings if "keeping" in w]
    loud = run({CUDA: "expandable_segments:True,expandable_segments:False"}, T214)
    assert [w for w in loud.warnings if "sets expandable_segments:False" in w]


# ---------------------------------------------------------------- backend:cudaMallocAsync


@pytest.mark.hook
def test_cuda_malloc_async_skips_expandable_segments() -> None:
    env = {CUDA: "backend:cudaMallocAsync"}
    d = run(env, T214)
    assert d.warnings == (
        "autoalloc: PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync, where expandable_segments has no effect; "
        "autoalloc does not add it",
    )
    assert d.value == "backend:cudaMallocAsync" and d.requested == {} and writes(d) == {APPLIED_VAR: "asr;backend:cudaMallocAsync"}
    assert child(d, env).action == "inherited"


@pytest.mark.hook
def test_async_backend_from_the_policy_and_on_rocm() -> None:
    d = run({}, T214, rules=[{"name": "asr", "scripts": ["train_asr.py"], "allocator": {"backend": "cudaMallocAsync"}}])
    assert d.warnings[0].startswith("autoalloc: rule asr selects backend:cudaMallocAsync")
    assert d.value == "backend:cudaMallocAsync"
    rocm = run({CUDA: "backend:hipMallocAsync"}, ROCM212)
    assert "selects backend:hipMallocAsync" in rocm.warnings[0] and "expandable_segments" not in rocm.value


@pytest.mark.hook
def test_late_setter_string_never_carries_the_backend() -> None:
    pol = {"rules": [{"name": "nb", "imports": ["asrkit"]}]}
    env = {CUDA: "backend:native,max_split_size_mb:256"}
    d = decide(policy(**pol), EntryPoint("code"), env, T214, {"asrkit"}, late=True, platform="linux")
    assert d.setter_value == "max_split_size_mb:256,expandable_segments:True"  # backend is fixed at load
    assert d.value == "backend:native,max_split_size_mb:256,expandable_segments:True"


# ---------------------------------------------------------------- max_split_size_mb


@pytest.mark.hook
def test_max_split_size_worded_per_version() -> None:
    new = run({CUDA: "max_split_size_mb:128"}, T214)
    assert new.warnings == (
        "autoalloc: max_split_size_mb:128 together with expandable_segments:True can make reserved memory grow far "
        "beyond what is allocated (https://github.com/pytorch/pytorch/issues/123548); consider dropping max_split_size_mb",
    )
    old = run({CUDA: "max_split_size_mb:128"}, T22)
    assert old.warnings == (
        "autoalloc: max_split_size_mb:128 together with expandable_segments:True can fail with an INTERNAL ASSERT "
        "(!block->expandable_segment_) on torch 2.2.2+cu121 (CUDA 12.1) "
        "(https://github.com/pytorch/pytorch/issues/119452, fixed in torch 2.3); consider dropping max_split_size_mb",
    )
    # the user already combined them: not autoalloc's doing, nothing to say
    assert run({CUDA: "max_split_size_mb:128,expandable_segments:True"}, T214).warnings == ()
    # kept False: no combination
    assert not [w for w in run({CUDA: "max_split_size_mb:128,expandable_segments:False"}, T214).warnings if "max_split" in w]


@pytest.mark.hook
def test_max_split_size_20_needs_torch_210() -> None:
    rules = [{"name": "asr", "scripts": ["train_asr.py"], "allocator": {"max_split_size_mb": 20}}]
    old = run({}, T29, rules=rules)
    assert "max_split_size_mb:20 must be > 20 before torch 2.10" in old.warnings[0]
    assert "max_split_size_mb" not in old.value
    assert "max_split_size_mb:20" in run({}, T214, rules=rules).value


@pytest.mark.hook
def test_cross_key_sizes_are_checked_after_the_merge() -> None:
    rules = [{"name": "asr", "scripts": ["train_asr.py"], "allocator": {"max_split_size_mb": 32}}]
    d = run({CUDA: "large_segment_size_mb:64"}, T214, rules=rules)
    assert "max_split_size_mb:32 together with PYTORCH_CUDA_ALLOC_CONF='large_segment_size_mb:64'" in d.warnings[0]
    assert d.value == "large_segment_size_mb:64,expandable_segments:True"


# ---------------------------------------------------------------- unparseable


@pytest.mark.hook
@pytest.mark.parametrize(
    "text, aborts",
    [("foo", True), ("expandable_segments:True:False", True), ("roundup_power2_divisions:[]", False),
     ("expandable_segments:True,,max_split_size_mb:64", False), ("x:[a:b", True)],
)
def test_unparseable_value_left_exactly_as_it_is(text: str, aborts: bool) -> None:
    env = {CUDA: text, ALLOC: "max_split_size_mb:64"}
    d = run(env, T214)
    assert writes(d) == {APPLIED_VAR: f"asr;{text}"} and d.value == text
    (warning,) = [w for w in d.warnings if "cannot parse" in w]
    assert warning.startswith(f"autoalloc: cannot parse PYTORCH_CUDA_ALLOC_CONF={text!r} (")
    assert "it is left exactly as it is and rule asr is not applied" in warning
    assert warning.endswith("torch 2.10+ CUDA builds abort `import torch` (SIGABRT) on it") is aborts
    assert child(d, env).action == "inherited"


# ---------------------------------------------------------------- torch versions and platforms


@pytest.mark.hook
def test_torch_20_never_gets_the_key() -> None:
    d = run({}, T20)
    assert d.warnings == (
        "autoalloc: expandable_segments needs torch >= 2.1, but torch 2.0.1+cu118 (CUDA 11.8) is installed: "
        "not set (asked for by autoalloc's default)",
    )
    assert writes(d) == {APPLIED_VAR: "asr;"} and d.requested == {}
    assert run({CUDA: "max_split_size_mb:64"}, T20).value == "max_split_size_mb:64"


@pytest.mark.hook
def test_torch_21_gets_it() -> None:
    assert run({}, T21).value == ES


@pytest.mark.hook
@pytest.mark.parametrize(
    "torch, written, note",
    [
        (ROCM211, False, "expandable segments need torch >= 2.12 with ROCm >= 7.0 (torch 2.11.0+rocm7.0 (ROCm/HIP 7.0.51831)): not written"),
        (ROCM212_OLD, False, "expandable segments need torch >= 2.12 with ROCm >= 7.0 (torch 2.12.1+rocm6.4 (ROCm/HIP 6.4.43482)): not written"),
        (ROCM212, True, None),
        (CPU, True, "torch 2.13.0+cpu (CPU-only): allocator options have no effect without a GPU build (written anyway)"),
    ],
)
def test_rocm_and_cpu(torch: TorchInfo, written: bool, note: str | None) -> None:
    d = run({}, torch)
    assert (d.value == ES) is written
    assert d.notes == ((note,) if note else ())
    assert d.warnings == ()


@pytest.mark.hook
def test_windows_never_gets_the_key() -> None:
    d = run({CUDA: "max_split_size_mb:64"}, T214, platform="win32")
    assert d.notes == ("expandable segments are not supported on Windows: not written",)
    assert d.value == "max_split_size_mb:64" and writes(d) == {APPLIED_VAR: "asr;max_split_size_mb:64"}


# ---------------------------------------------------------------- end to end, real torch

TRAIN_SCRIPT = "proj/train_asr.py"
RULE = '[[rules]]\nname = "asr"\nscripts = ["train_asr.py"]\n'


def _one_warning(result, *fragments: str) -> str:
    warnings = autoalloc_warnings(result.stderr)
    assert len(warnings) == 1, result.stderr
    for fragment in fragments:
        assert fragment in warnings[0], warnings[0]
    return warnings[0]


def test_e2e_several_variables_set_but_empty(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.write("proj/autoalloc.toml", RULE)
    sandbox.script(TRAIN_SCRIPT)
    env = {CUDA: "", ALLOC: "garbage_collection_threshold:0.5", "AUTOALLOC_DEBUG": "1"}
    result = sandbox.run([TRAIN_SCRIPT], env=env, python=torch_python)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == ES  # torch reads the empty CUDA name, now holding the option
    assert probe["env"] == {CUDA: ES, HIP: None, ALLOC: "garbage_collection_threshold:0.5"}
    if probe["cuda_build"]:
        assert probe["snapshot_expandable_segments"] is True
    _one_warning(result, "uses only PYTORCH_CUDA_ALLOC_CONF (set but empty, which still wins) and ignores PYTORCH_ALLOC_CONF")
    if not probe["cuda_build"]:  # CPU build: written anyway, and AUTOALLOC_DEBUG says it has no effect
        assert "autoalloc: note: torch 2.13.0+cpu (CPU-only): allocator options have no effect" in result.stderr


CHILDREN = """
import subprocess, sys, multiprocessing as mp

def work(q):
    import torch, warnings
    q.put("worker ran")

if __name__ == "__main__":
    import torch
    out = subprocess.run([sys.executable, "-c", "import torch, os; print(os.environ['AUTOALLOC_APPLIED'])"],
                         capture_output=True, text=True)
    print("CHILD_STDOUT", out.stdout.strip())
    print("CHILD_STDERR", repr(out.stderr))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=work, args=(q,))
    p.start(); print("WORKER", q.get()); p.join()
"""


@pytest.mark.slow  # a job of several processes: the full run
def test_e2e_explicit_false_said_once_per_job(sandbox: Sandbox, torch_python: str) -> None:
    """The parent warns; a subprocess and a spawned worker inherit AUTOALLOC_APPLIED and stay silent."""
    sandbox.write("proj/autoalloc.toml", RULE)
    sandbox.write(TRAIN_SCRIPT, CHILDREN + textwrap.indent(PROBE, "    "))
    env = {CUDA: "expandable_segments:False"}
    result = sandbox.run([TRAIN_SCRIPT], env=env, python=torch_python)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == "expandable_segments:False" and probe["env"][CUDA] == "expandable_segments:False"
    if probe["cuda_build"]:
        assert probe["snapshot_expandable_segments"] is False
    _one_warning(result, "keeping expandable_segments:False", f"{sandbox.work / TRAIN_SCRIPT}:")
    assert "CHILD_STDOUT asr;expandable_segments:False" in result.stdout
    assert "CHILD_STDERR ''" in result.stdout
    assert "WORKER worker ran" in result.stdout


ASYNC_PROBE = """
import json, os, torch
report = {"getter": torch._C._accelerator_getAllocatorSettings(), "env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
if torch.version.cuda:
    report["backend"] = torch.cuda.memory.get_allocator_backend()
print("ASYNC " + json.dumps(report))
"""


@pytest.mark.slow  # in process above; on the CUDA build with --full
def test_e2e_cuda_malloc_async(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.write("proj/autoalloc.toml", RULE)
    sandbox.write(TRAIN_SCRIPT, ASYNC_PROBE)
    result = sandbox.run([TRAIN_SCRIPT], env={CUDA: "backend:cudaMallocAsync"}, python=torch_python)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.split("ASYNC ", 1)[1])
    assert report["env"] == report["getter"] == "backend:cudaMallocAsync"  # nothing added
    if "backend" in report:
        assert report["backend"] == "cudaMallocAsync"
    _one_warning(result, "PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync, where expandable_segments has no effect")


@pytest.mark.slow  # test_e2e_core::test_existing_options_are_merged runs it
def test_e2e_max_split_size(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.write("proj/autoalloc.toml", RULE)
    sandbox.script(TRAIN_SCRIPT)
    result = sandbox.run([TRAIN_SCRIPT], env={CUDA: "max_split_size_mb:128"}, python=torch_python)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == "max_split_size_mb:128,expandable_segments:True"
    if probe["cuda_build"]:
        assert probe["snapshot_expandable_segments"] is True and probe["snapshot_max_split_size"] == 128 << 20
    _one_warning(result, "max_split_size_mb:128 together with expandable_segments:True", "issues/123548")


def test_e2e_unparseable_value_left_as_is(sandbox: Sandbox, torch_python: str) -> None:
    """A value autoalloc cannot parse but torch accepts: torch reads it byte for byte."""
    sandbox.write("proj/autoalloc.toml", RULE)
    sandbox.script(TRAIN_SCRIPT)
    text = "roundup_power2_divisions:[] , max_split_size_mb:64"
    result = sandbox.run([TRAIN_SCRIPT], env={CUDA: text}, python=torch_python)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == text and probe["env"][CUDA] == text and probe["env"][ALLOC] is None
    assert probe["applied"] == f"asr;{text}"
    if probe["cuda_build"]:
        assert probe["snapshot_expandable_segments"] is False
    _one_warning(result, f"cannot parse PYTORCH_CUDA_ALLOC_CONF={text!r}", "left exactly as it is")


@pytest.mark.cuda_build
@pytest.mark.skipif(not CUDA_PY, reason="AUTOALLOC_TORCH_CUDA_PYTHON is not set (scripts/test.sh --full sets it)")
def test_e2e_malformed_value_warned_before_torch_aborts(sandbox: Sandbox) -> None:
    """torch 2.10+ CUDA builds abort on a key without a value; the warning comes first and says why."""
    sandbox.write("proj/autoalloc.toml", RULE)
    sandbox.script(TRAIN_SCRIPT)
    result = sandbox.run([TRAIN_SCRIPT], env={CUDA: "expandable_segments"}, python=CUDA_PY)
    warning = _one_warning(result, "cannot parse PYTORCH_CUDA_ALLOC_CONF='expandable_segments'")
    assert "AUTOALLOC_PROBE" not in result.stdout
    assert result.returncode == -6 and warning.endswith("abort `import torch` (SIGABRT) on it")
