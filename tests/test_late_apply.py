"""A late apply is a merge that respects the program (real torch, read back from torch itself).

A late apply writes through torch's runtime setter once torch is loaded: a ``training = true``
rule at the first optimizer, an ``imports`` trigger that fires after torch, ``adaptive =
"apply"`` and ``on_setter = "merge"``. Each must put the rule's options *under* what torch
uses now: the options the program set at run time (or the environment) win, and a runtime
``expandable_segments:False`` is the program's refusal. Torch's getter (2.13 CPU) and, on the
2.14.1 CUDA build, ``_snapshot()["allocator_settings"]`` say what it ended with.
"""

from __future__ import annotations

import pytest

from autoalloc import allocconf
from autoalloc.allocconf import InEffect
from autoalloc.decide import decide
from autoalloc.entrypoint import EntryPoint
from autoalloc.policy import Source, compose
from autoalloc.torchinfo import TorchInfo
from tests.helpers import ES, PY, Sandbox, autoalloc_warnings, probe_result, validate

PROGRAM_SETS = "garbage_collection_threshold:0.7,max_split_size_mb:256"
TRAINING_RULE = '[[rules]]\nname = "mine"\ntraining = true\nimports = ["json"]\n'
TRIGGER_RULE = '[[rules]]\nname = "kit"\nimports = ["mykit"]\n'
# The program: its own allocator settings at run time, then the moment autoalloc decides late
# (its optimizer built in a module of its own: the script's source alone does not show it).
PROGRAM = """
    import json, os, sys
    import torch
    import trainer
    if "setenv" in sys.argv:  # for the program's subprocesses, after torch read its own
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "roundup_power2_divisions:4"
    for value in {settings!r}:
        torch.cuda.memory._set_allocator_settings(value)
    if "optimizer" in sys.argv:
        opt = trainer.optimizer()
    if "trigger" in sys.argv:
        import mykit
"""
TRAINER = "import torch\n\n\ndef optimizer():\n    return torch.optim.AdamW(torch.nn.Linear(4, 2).parameters())\n"


def _run(sandbox: Sandbox, policy: str, step: str, setting: str = PROGRAM_SETS,
         python: str = PY, **env: str):
    sandbox.user_policy(policy)
    sandbox.write("mykit.py", "")
    sandbox.write("trainer.py", TRAINER)
    sandbox.script("train.py", PROGRAM.format(settings=setting.split(";")))
    result = sandbox.run(["train.py", *step.split()], env=env, python=python)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return probe_result(result.stdout), result


def _snapshot_check(probe: dict, segments: bool, split_mib: int | None) -> None:
    if probe["cuda_build"]:  # what the CUDA allocator itself parsed
        assert probe["snapshot_expandable_segments"] is segments
        assert probe["snapshot_max_split_size"] == (-1 if split_mib is None else split_mib << 20)


# ------------------------------------------------------------------ the merge, in process

T214 = TorchInfo("2.14.1+cu130", cuda="13.0")
CALL = "the call at /w/train.py:3"


def _late(now: InEffect, env: dict[str, str] | None = None, **data: object):
    rule = {"name": "kit", "imports": ["asrkit"], **data.pop("rule", {})}
    layer = validate({"rules": [rule], **data}, Source("project", "/w/autoalloc.toml"))
    return decide(compose([layer]), EntryPoint("code"), env or {}, T214, {"asrkit"}, late=True,
                  platform="linux", now=now)


def test_the_rule_goes_under_what_torch_uses_now() -> None:
    now = InEffect((("garbage_collection_threshold", "0.7"),),
                   {"garbage_collection_threshold": CALL}, frozenset({"garbage_collection_threshold"}))
    d = _late(now, {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"},
              rule={"allocator": {"garbage_collection_threshold": 0.8}})
    assert d.setter_value == d.value == f"garbage_collection_threshold:0.7,{ES}"
    assert d.warnings == (
        f"autoalloc: {CALL} sets garbage_collection_threshold:0.7, rule kit wants "
        "garbage_collection_threshold:0.8; keeping garbage_collection_threshold:0.7 "
        "(the program's own setting at run time, which on_conflict does not replace)",
    )
    over = _late(now, rule={"allocator": {"garbage_collection_threshold": 0.8}},
                 on_conflict="override")  # about the environment's values, not the program's
    assert over.setter_value == f"garbage_collection_threshold:0.7,{ES}"
    assert over.warnings == d.warnings
    env = InEffect((("garbage_collection_threshold", "0.6"),),
                   {"garbage_collection_threshold": "PYTORCH_CUDA_ALLOC_CONF"})
    over_env = _late(env, {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"},
                     rule={"allocator": {"garbage_collection_threshold": 0.8}},
                     on_conflict="override")
    assert over_env.setter_value == f"garbage_collection_threshold:0.8,{ES}"


def test_a_runtime_false_is_refused_an_environment_false_is_kept_with_a_warning() -> None:
    off = (("expandable_segments", "False"),)
    refused = _late(InEffect(off, {"expandable_segments": CALL}, frozenset({"expandable_segments"})),
                    on_conflict="override")
    assert refused.setter_value is None and refused.warnings == ()
    assert refused.notes[-1] == (
        f"{CALL} set expandable_segments:False at run time: the program's choice, respected"
    )
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    from_env = _late(InEffect(off, {"expandable_segments": "PYTORCH_CUDA_ALLOC_CONF"}), env)
    assert from_env.setter_value is None and "keeping expandable_segments:False" in from_env.warnings[0]


def test_nothing_to_add_means_no_setter_call() -> None:
    now = InEffect((("expandable_segments", "True"),), {"expandable_segments": CALL},
                   frozenset({"expandable_segments"}))
    assert _late(now).setter_value is None


@pytest.mark.parametrize("text, on", [
    ("expandable_segments:True", True),
    ("expandable_segments:True,expandable_segments:False", False),  # torch: the last wins
    ("expandable_segments:False,expandable_segments:True", True),
    (" expandable_segments : True ", True),
    ("expandable_segments:true", False),  # torch rejects it: not on
    ("max_split_size_mb:64,expandable_segments:True,foo", True),  # read as far as torch gets
    ("", False),
    (None, False),
])
def test_segments_on_reads_like_torch(text: str | None, on: bool) -> None:
    assert allocconf.segments_on(text) is on


def test_snapshot_values_as_allocator_text() -> None:
    settings = {"expandable_segments": True, "max_split_size": 256 << 20,
                "garbage_collection_threshold": 0.7}
    assert allocconf.from_snapshot("expandable_segments", settings) == "True"
    assert allocconf.from_snapshot("max_split_size_mb", settings) == "256"
    assert allocconf.from_snapshot("max_split_size_mb", {"max_split_size": -1}) is None
    assert allocconf.from_snapshot("garbage_collection_threshold", settings) == "0.7"
    assert allocconf.from_snapshot("roundup_power2_divisions", settings) is False  # not reported


# ------------------------------------------------------------------ program 1: runtime options


@pytest.mark.parametrize(
    "policy, step",
    [(TRAINING_RULE, "optimizer"),
     pytest.param(TRIGGER_RULE, "trigger", marks=pytest.mark.slow)],  # the same write, later
    ids=["training", "late-import"],
)
def test_runtime_options_stay_under_a_late_apply(
    sandbox: Sandbox, torch_python: str, policy: str, step: str
) -> None:
    probe, result = _run(sandbox, policy, step, python=torch_python, AUTOALLOC_DEBUG="1")
    assert probe["getter"] == f"{PROGRAM_SETS},{ES}", result.stderr
    _snapshot_check(probe, True, 256)
    assert "via the runtime setter" in result.stderr
    # what the program set through the setter was for itself: its children get the rule's only
    assert probe["env"]["PYTORCH_CUDA_ALLOC_CONF"] == ES
    assert probe["applied"].endswith(f";{ES}")


def test_a_late_apply_merges_into_what_the_program_put_in_the_environment(
    sandbox: Sandbox,
) -> None:
    # after import torch the program sets its children's variable, and its own options through
    # the setter: torch gets both under the rule's; the children get theirs plus the rule's
    probe, result = _run(sandbox, TRAINING_RULE, "optimizer setenv")
    assert probe["getter"] == f"{PROGRAM_SETS},{ES}", result.stderr
    children = f"roundup_power2_divisions:4,{ES}"
    assert probe["env"]["PYTORCH_CUDA_ALLOC_CONF"] == children
    assert probe["applied"] == f"mine;{children}"  # a child finds it and knows it as the job's


def test_runtime_options_beat_the_environment(sandbox: Sandbox, torch_python: str) -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    probe, _ = _run(sandbox, TRAINING_RULE, "optimizer", python=torch_python, **env)
    assert probe["getter"] == f"{PROGRAM_SETS},{ES}"
    _snapshot_check(probe, True, 256)


@pytest.mark.slow  # a variant of test_runtime_options_stay_under_a_late_apply
def test_a_rule_option_the_program_set_otherwise_keeps_the_programs(sandbox: Sandbox) -> None:
    policy = TRAINING_RULE + "allocator = { garbage_collection_threshold = 0.8 }\n"
    probe, result = _run(sandbox, policy, "optimizer")
    assert probe["getter"] == f"{PROGRAM_SETS},{ES}"
    train = sandbox.work / "train.py"
    keep = (
        f"autoalloc: the call at {train}:8 sets garbage_collection_threshold:0.7, rule mine "
        "wants garbage_collection_threshold:0.8; keeping garbage_collection_threshold:0.7 "
        "(the program's own setting at run time, which on_conflict does not replace)"
    )
    assert next(w for w in autoalloc_warnings(result.stderr) if "garbage" in w).endswith(keep)


@pytest.mark.slow  # a policy setting on top of the four programs above: the full run
def test_override_never_replaces_what_the_program_set_at_run_time(sandbox: Sandbox) -> None:
    policy = ('on_conflict = "override"\n' + TRAINING_RULE
              + "allocator = { garbage_collection_threshold = 0.8 }\n")
    probe, result = _run(sandbox, policy, "optimizer", "garbage_collection_threshold:0.6")
    assert probe["getter"] == f"garbage_collection_threshold:0.6,{ES}", result.stderr
    said = [w for w in autoalloc_warnings(result.stderr) if "garbage" in w]
    assert len(said) == 1 and 'on_conflict = "override"' not in said[0], said


# ------------------------------------------------------------------ program 4: runtime refusal


@pytest.mark.parametrize(
    "policy, step",
    [(TRAINING_RULE, "optimizer"),
     pytest.param(TRIGGER_RULE, "trigger", marks=pytest.mark.slow)],  # the same write, later
    ids=["training", "late-import"],
)
def test_runtime_expandable_segments_false_is_a_refusal(
    sandbox: Sandbox, torch_python: str, policy: str, step: str
) -> None:
    refusal = "expandable_segments:False"
    probe, result = _run(sandbox, policy, step, setting=refusal, python=torch_python)
    assert probe["getter"] == refusal
    _snapshot_check(probe, False, None)
    assert "autoalloc" not in result.stderr  # nothing to say: the program decided
    _, debug = _run(sandbox, policy, step, setting=refusal, AUTOALLOC_DEBUG="1")
    said = [line for line in debug.stderr.splitlines() if "respected" in line]
    assert len(said) == 1 and "set expandable_segments:False at run time" in said[0]


@pytest.mark.slow  # the refusal itself is test_runtime_expandable_segments_false_is_a_refusal
def test_the_refusal_outlives_later_calls(sandbox: Sandbox) -> None:
    # expandable_segments is not reset by a later call that does not name it: still refused
    probe, _ = _run(sandbox, TRAINING_RULE, "optimizer",
                    setting="expandable_segments:False;max_split_size_mb:256")
    assert probe["getter"] == "max_split_size_mb:256"
    # torch's last word counts: True after False is no refusal, and nothing is missing
    probe, _ = _run(sandbox, TRAINING_RULE, "optimizer",
                    setting="expandable_segments:True,expandable_segments:False;"
                    "expandable_segments:True")
    assert probe["getter"] == ES


FINDING = """
    import torch
    from autoalloc import hook
    from autoalloc.adaptive import Finding
    torch._C._accelerator_setAllocatorSettings({setting!r})
    hook.STATE.late.on_finding(Finding(50, 41, 6.5, 2, 2.4, 1))
"""


def _finding_after(sandbox: Sandbox, mode: str, setting: str) -> tuple[str, str]:
    """What torch uses, and stderr, once adaptive reports a finding after the program's call."""
    sandbox.user_policy(f'adaptive = "{mode}"\n')
    sandbox.script("train.py", FINDING.format(setting=setting))
    result = sandbox.run(["train.py"])
    assert result.returncode == 0, result.stderr
    return probe_result(result.stdout)["getter"], result.stderr


def test_adaptive_apply_goes_under_the_programs_options(sandbox: Sandbox) -> None:
    # the fourth late writer: adaptive = "apply" on a finding, after the program's own call
    getter, _ = _finding_after(sandbox, "apply", "garbage_collection_threshold:0.7")
    assert getter == f"garbage_collection_threshold:0.7,{ES}"


def test_adaptive_says_nothing_to_a_program_that_refused(sandbox: Sandbox) -> None:
    getter, stderr = _finding_after(sandbox, "advise", "expandable_segments:False")
    assert getter == "expandable_segments:False"
    assert "autoalloc" not in stderr


# ------------------------------------------------------------------ what stopped merging

MERGE = 'on_setter = "merge"\n'
CALLS = """
    import sys
    import torch
    for value in sys.argv[1:]:
        try:
            torch._C._accelerator_setAllocatorSettings(value)
        except ValueError:
            pass
"""
USER = "garbage_collection_threshold:0.8,max_split_size_mb:512"
NEMO_RULE = '[[rules]]\nname = "asr"\nscripts = ["train.py"]\n'


def test_a_rejected_call_does_not_stop_merging(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.user_policy(MERGE + NEMO_RULE)
    sandbox.script("train.py", CALLS)
    env = {"PYTORCH_CUDA_ALLOC_CONF": USER}
    args = ["train.py", "expandable_segments:true", "max_split_size_mb:256"]
    result = sandbox.run(args, env=env, python=torch_python)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    # the second call is merged over what was in effect, as the first would have been
    assert probe["getter"] == f"garbage_collection_threshold:0.8,max_split_size_mb:256,{ES}"
    _snapshot_check(probe, True, 256)


PLUGIN = """
    import torch

    def init():
        torch._C._accelerator_setAllocatorSettings({setting!r})
"""


def _device_plugin(sandbox: Sandbox, setting: str) -> str:
    """A torch device-backend plugin: torch/__init__ runs it (``torch.backends`` entry point)."""
    where = sandbox.root / "plugins"
    sandbox.write(where / "myplug.py", PLUGIN.format(setting=setting))
    info = where / "myplug-1.0.dist-info"
    sandbox.write(info / "METADATA", "Metadata-Version: 2.1\nName: myplug\nVersion: 1.0\n")
    sandbox.write(info / "entry_points.txt", "[torch.backends]\nmyplug = myplug:init\n")
    return str(where)


def test_a_call_inside_torch_init_is_merged_under(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.user_policy(TRAINING_RULE)
    path = _device_plugin(sandbox, PROGRAM_SETS)
    sandbox.write("trainer.py", TRAINER)
    sandbox.script("train.py", PROGRAM.format(settings=[]))
    result = sandbox.run(["train.py", "optimizer"], env={"PYTHONPATH": path},
                         python=torch_python)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == f"{PROGRAM_SETS},{ES}", result.stderr
    _snapshot_check(probe, True, 256)


def test_merging_goes_on_after_a_call_inside_torch_init(
    sandbox: Sandbox, torch_python: str
) -> None:
    sandbox.user_policy(MERGE + NEMO_RULE)
    path = _device_plugin(sandbox, "max_split_size_mb:256")
    sandbox.script("train.py", CALLS)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8", "PYTHONPATH": path}
    result = sandbox.run(["train.py", "roundup_power2_divisions:4"], env=env, python=torch_python)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    # torch/__init__'s call dropped the environment's 0.8 (as torch does); the later call keeps
    # what that one set
    assert probe["getter"] == f"{ES},max_split_size_mb:256,roundup_power2_divisions:4"
    _snapshot_check(probe, True, 256)
