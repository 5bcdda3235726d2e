"""Carry out the decision at ``import torch``: the one writer of the allocator variables.

Of the environment, only the allocator variables and autoalloc's own records of what it
applied or deferred are written here; two other small writes live where they belong:
``messages`` marks the warnings a job has said (``AUTOALLOC_WARNED``), and the startup
module pins a relative ``AUTOALLOC_REPORT`` to the directory the process started in.

The startup watcher wraps the loader of ``torch`` (and, later, of the policy's import
triggers), which calls ``before_exec`` right before the module's own code runs and
``after_exec`` once it has. For torch, ``before_exec`` runs the pipeline (``plan``) and
writes the environment before libc10 loads; ``after_exec`` installs the guards and hands
what is still watched to ``late.Late``, which decides again at a trigger, at the first
optimizer or at ``adaptive``'s finding, and carries out through ``commit`` here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from types import ModuleType
from typing import TYPE_CHECKING

from autoalloc import entrypoint, layercache, messages, torchinfo
from autoalloc.decide import Decision
from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import DEFERRED_VAR, REPORT_VAR
from autoalloc.late import Late, forget, segments_on
from autoalloc.match import watches_training
from autoalloc.plan import Plan, plan
from autoalloc.policy import Policy
from autoalloc.records import record
from autoalloc.torchinfo import TorchInfo
from autoalloc.wrappers import Unwrapped

if TYPE_CHECKING:
    from autoalloc.counters import StepSampler


@record
class State:
    """What this process decided; ``autoalloc.status()`` reads it."""

    plan: Plan | None = None
    decision: Decision | None = None  # the plan's decision, once carried out
    torch_module: ModuleType | None = None  # the torch whose import autoalloc saw execute
    own: frozenset[str] = frozenset()  # modules autoalloc itself imported to decide
    late: Late | None = None  # what is watched after the decision, and decides late
    setter_error: str | None = None
    adaptive: object = None  # the adaptive.Watch, while one watches the optimizer steps
    recording: object = None  # the AUTOALLOC_REPORT recorder, told of each decision (commit)
    setters: object = None  # guards.Setters: the setter calls seen, once torch is imported

    @property
    def trains(self) -> bool:
        """Whether this process has built a torch optimizer (as far as a decision needed it)."""
        return self.plan.trains if self.plan else False

    @property
    def policy(self) -> Policy | None:
        return self.plan.policy if self.plan else None

    @property
    def entry(self) -> EntryPoint | None:
        return self.plan.decided_for if self.plan else None

    @property
    def torch(self) -> TorchInfo | None:
        return self.plan.torch if self.plan else None


STATE = State()


def before_exec(
    module: ModuleType, imported: set[str], elsewhere: AbstractSet[str] = frozenset()
) -> None:
    """Right before a watched module executes: for torch, decide and write the environment.

    ``imported``: ``sys.modules`` as the program left it, before autoalloc imported anything
    of its own for the decision (platformdirs, tomllib, ...): those are not the program's.
    ``elsewhere``: the names other threads of the program have looked up since (their
    imports, still the program's), filled in while the decision runs.
    """
    if STATE.late is not None and module.__name__ in STATE.late.evidence_names:
        STATE.late.note_importer(module.__name__)
    if module.__name__ != "torch" or STATE.decision is not None:
        return
    if any(type(m) is not ModuleType for m in list(sys.modules.values())):
        from autoalloc import evidence  # a lazy package's stubs never executed: not imports

        imported = imported - evidence.stubs(sys.modules)
    layercache.enable()  # every process that imports torch decides: reuse what the last one read
    info = torchinfo.from_spec(module.__spec__)
    entry, cwd = entrypoint.current(), entrypoint.current_cwd()
    STATE.plan = plan(entry, os.environ, cwd, info, imported, argv=getattr(sys, "argv", None))
    STATE.own = frozenset(sys.modules.keys() - imported - elsewhere)
    STATE.late = Late(STATE, commit)
    commit(STATE.plan.decision)
    if STATE.decision.action == "none" and STATE.policy is not None:
        STATE.late.watch_triggers(elsewhere)


def after_exec(module: ModuleType, imported: set[str]) -> None:
    """A watched module has executed: torch gets its guards; a trigger may decide now."""
    if module.__name__ != "torch":
        if STATE.late is not None:
            STATE.late.executed(module.__name__)
        return
    if STATE.torch_module is None and STATE.plan is not None:
        STATE.torch_module = module
        from autoalloc import guards

        guards.install(STATE)
        recording = None
        if os.environ.get(REPORT_VAR):  # the measurement half, only when asked for
            from autoalloc.ab import recorder

            STATE.recording = recording = recorder.install(module, STATE.decision)
        _arm_training(module)
        _arm_adaptive(module, recording.sampler if recording is not None else None)
    forget("torch")


def _arm_training(torch: ModuleType) -> None:
    """Watch for the first optimizer when a ``training = true`` rule could still decide."""
    decision, policy, late = STATE.decision, STATE.policy, STATE.late
    if decision is None or decision.action != "none" or policy is None or late is None:
        return
    if watches_training(policy.rules):
        from autoalloc import training

        training.install(torch.optim.Optimizer, late.on_optimizer)
        late.watch_evidence()


def _arm_adaptive(torch: ModuleType, sampler: StepSampler | None) -> None:
    """Watch the optimizer steps for the re-allocation symptom (``adaptive``; CUDA builds only).

    ``sampler``: the recorder's (``AUTOALLOC_REPORT``), so the counters are read once a step.
    """
    decision, policy, late = STATE.decision, STATE.policy, STATE.late
    if policy is None or policy.adaptive.value == "off" or late is None:
        return
    if decision is None or segments_on(decision):
        return
    from autoalloc import adaptive

    STATE.adaptive = adaptive.install(torch, late.on_finding, sampler)


def _torch_frames() -> tuple[str, ...]:
    """Late (torch loaded: the first optimizer, a step hook), torch's frames are not the
    user's either: a warning lands on the program's ``SGD(...)`` line, not in torch/optim."""
    if STATE.torch_module is None:
        return ()
    from autoalloc import guards

    return guards.skipped_frames()


def commit(decision: Decision, when: str = "import torch") -> None:
    """Carry out a decision: environment writes, the runtime setter, warnings, the debug trace.

    ``when``: at what point of the run (the report's recorder, if any, is told).
    """
    STATE.decision = decision
    for name, value in decision.writes.items():
        os.environ[name] = value
    for name in decision.unsets:
        os.environ.pop(name, None)
    if decision.setter_value is not None:
        STATE.setter_error = _call_setter(decision.setter_value, decision.rule)
    if STATE.recording is not None:
        error = STATE.setter_error if decision.setter_value is not None else None
        STATE.recording.decided(decision, when, error)
    said = list(decision.warnings)
    if STATE.setter_error:
        said.append(
            f"autoalloc: torch rejected the allocator settings {decision.setter_value!r}: "
            f"{STATE.setter_error}"
        )
    program = STATE.plan.program if STATE.plan is not None else None
    node = set(decision.departures)  # also said by the first process of each further node
    if many_node_agent(program, os.environ):
        # One agent per node: none of them knows whether its node holds global rank 0, so
        # each leaves the job's warnings to its workers, where only global rank 0 speaks.
        _defer(messages.not_yet_said(said, mark=False), node)
    else:
        skip = _torch_frames()
        deferred = _deferred()
        node.update(text for text, own in deferred if own)
        for message in messages.not_yet_said([*said, *(text for text, _ in deferred)]):
            messages.warn(message, skip=skip, node=message in node)
    messages.debug(decision.summary())
    for note in decision.notes:
        messages.debug(f"note: {note}")


def many_node_agent(program: Unwrapped | None, env: Mapping[str, str]) -> bool:
    """Whether this process is a launcher's agent (torchrun) for a job on more than one node
    (``--nnodes 2``, ``--nnodes=1:4`` among the launcher's own arguments, not the program's):
    its workers, not it, know the global ranks."""
    if "RANK" in env or program is None:
        return False
    step = program.launcher()
    if step is None:
        return False
    at = program.steps.index(step)
    inner = program.steps[at + 1].entry if at + 1 < len(program.steps) else program.entry
    args = step.entry.args
    own = args[: max(len(args) - len(inner.args), 0)]  # the program's arguments are not its
    value = None
    for i, word in enumerate(own):  # the last one wins, as with argparse
        if word.startswith("--nnodes="):
            value = word.partition("=")[2]
        elif word == "--nnodes" and i + 1 < len(own):
            value = own[i + 1]
    return value is not None and value.strip() not in ("1", "1:1")


def _defer(fresh: list[str], node: set[str]) -> None:
    """Leave ``fresh`` to the workers: a string for global rank 0 to say, ``{"node": text}``
    for a warning of what this node reads for itself (its first worker says it too)."""
    if fresh:
        left = [{"node": m} if m in node else m for m in fresh]
        kept = [{"node": m} if own else m for m, own in _deferred(keep=True)]
        os.environ[DEFERRED_VAR] = json.dumps([*kept, *left])
        messages.debug(f"multi-node agent: {len(fresh)} warning(s) left to global rank 0")


def _deferred(keep: bool = False) -> list[tuple[str, bool]]:
    """The warnings a multi-node agent left to its workers (taken out of the environment),
    each with whether it is its node's own."""
    raw = os.environ.get(DEFERRED_VAR) if keep else os.environ.pop(DEFERRED_VAR, None)
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return []
    out = []
    for item in value if isinstance(value, list) else ():
        text = item.get("node") if isinstance(item, dict) else item
        if isinstance(text, str):
            out.append((text, isinstance(item, dict)))
    return out


def _call_setter(value: str, rule: str | None) -> str | None:
    """Apply ``value`` with torch's runtime setter (the unguarded one); the error text or None.

    Only on the torch module whose import autoalloc saw execute, and only while it is still
    ``sys.modules["torch"]``: a test suite's mock put there is never configured. The guards'
    model of what torch uses follows the write (one writer for every late apply).
    """
    torch = STATE.torch_module
    if torch is None or sys.modules.get("torch") is not torch:
        messages.debug(
            "sys.modules['torch'] is not the torch autoalloc saw imported: no setter call"
        )
        return None
    from autoalloc import guards

    return guards.write(STATE, torch, value, f"rule {rule}" if rule else "autoalloc")
