"""Carry out the decision at ``import torch``: the one writer of the allocator variables.

Of the environment, only the allocator variables and autoalloc's own records of what it
applied or deferred are written here; two other small writes live where they belong:
``messages`` marks the warnings a job has said (``AUTOALLOC_WARNED``), and the startup
module pins a relative ``AUTOALLOC_REPORT`` to the directory the process started in.

The startup watcher wraps the loader of ``torch`` (and, later, of the policy's import
triggers), which calls ``before_exec`` right before the module's own code runs and
``after_exec`` once it has. For torch, ``before_exec`` runs the pipeline (``plan``) and
writes the environment before libc10 loads; ``after_exec`` installs the guards. A
trigger module that has executed decides again; after torch is loaded, the full merged
string goes through the runtime setter.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import field
from types import ModuleType
from typing import TYPE_CHECKING

from autoalloc import allocconf, entrypoint, layercache, messages, torchinfo
from autoalloc.allocconf import InEffect
from autoalloc.decide import Decision
from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import DEFERRED_VAR, REPORT_VAR
from autoalloc.match import pending_triggers, training_names, watches_training
from autoalloc.plan import Plan, plan
from autoalloc.policy import Policy
from autoalloc.records import record, replace
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
    # the training rules' module names watched until the first optimizer, only to see which
    # code imports them (evidence), and which of them the program's own code imported where
    evidence_names: frozenset[str] = frozenset()
    evidence_only: frozenset[str] = frozenset()  # of those, the ones no trigger rule names
    asked: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
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


def _watcher():
    return next((f for f in sys.meta_path if getattr(f, "autoalloc_watcher", False)), None)


def _retire(watcher) -> None:
    """Take the watcher off ``sys.meta_path`` with a new list: another thread's import may be
    iterating the current one, and removing an entry from it would skip the next finder."""
    if any(f is watcher for f in sys.meta_path):
        sys.meta_path = [f for f in sys.meta_path if f is not watcher]


def before_exec(
    module: ModuleType, imported: set[str], elsewhere: AbstractSet[str] = frozenset()
) -> None:
    """Right before a watched module executes: for torch, decide and write the environment.

    ``imported``: ``sys.modules`` as the program left it, before autoalloc imported anything
    of its own for the decision (platformdirs, tomllib, ...): those are not the program's.
    ``elsewhere``: the names other threads of the program have looked up since (their
    imports, still the program's), filled in while the decision runs.
    """
    if module.__name__ in STATE.evidence_names:
        _note_importer(module.__name__)
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
    commit(STATE.plan.decision)
    watcher = _watcher()
    if watcher is not None and STATE.decision.action == "none" and STATE.policy is not None:
        pending = pending_triggers(STATE.policy.rules, STATE.plan.imported)
        dead = pending & STATE.own
        if dead:  # already in sys.modules: the program's import of them executes nothing
            messages.debug(f"imports {sorted(dead)} cannot trigger: autoalloc imported them")
        watcher.names |= pending - dead
        # imported by another thread while autoalloc decided: it has executed, so it triggers now
        for name in sorted(pending & frozenset(elsewhere) & sys.modules.keys()):
            _on_trigger(watcher, name)


def after_exec(module: ModuleType, imported: set[str]) -> None:
    """A watched module has executed: torch gets its guards; a trigger may decide now."""
    watcher = _watcher()
    if module.__name__ == "torch":
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
        if watcher is not None:
            watcher.names.discard("torch")
    elif watcher is not None and module.__name__ in STATE.evidence_only:
        watcher.names.discard(module.__name__)
    elif watcher is not None:
        _on_trigger(watcher, module.__name__)
    if watcher is not None and not watcher.names:
        _retire(watcher)


def _on_trigger(watcher, name: str) -> None:
    """Module ``name`` was really imported: decide again with it counted as imported."""
    watcher.names.discard(name)
    decision = STATE.decision
    if decision is None or decision.action != "none" or STATE.plan is None:
        return
    imported = (sys.modules.keys() - STATE.own) | {name}
    plan = STATE.plan
    if STATE.torch_module is None:  # inside torch/__init__: the environment is still read
        new = plan.after_import(name, os.environ, imported, late=False)
    else:
        new = _late(lambda now: plan.after_import(name, os.environ, imported, True, now))
    if new.decision.action == "none":
        return
    STATE.plan = new
    commit(new.decision, f"import of {name}")
    watcher.names.clear()


def _arm_training(torch: ModuleType) -> None:
    """Watch for the first optimizer when a ``training = true`` rule could still decide."""
    decision, policy = STATE.decision, STATE.policy
    if decision is None or decision.action != "none" or policy is None:
        return
    if watches_training(policy.rules):
        from autoalloc import training

        training.install(torch.optim.Optimizer, _on_optimizer)
        _watch_evidence(policy)


def _watch_evidence(policy: Policy) -> None:
    """Watch the training rules' module names not imported yet, to see which code imports them."""
    watcher = _watcher()
    if watcher is None:
        return
    names = frozenset(n for n in training_names(policy.rules) if n not in sys.modules)
    STATE.evidence_names = names
    STATE.evidence_only = frozenset(names - watcher.names)
    watcher.names |= names


def _note_importer(name: str) -> None:
    """Module ``name`` is about to execute: remember where, when the importer is the program's
    own code (not a library importing it for its own purposes, nor importlib's machinery)."""
    own, skip = _own_code(), _machinery_files()
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith(skip) or frame.f_globals.get("__name__") in _STARTUP
    ):
        frame = frame.f_back
    if frame is not None and own.code(frame.f_code.co_filename, frame.f_globals.get("__name__")):
        STATE.asked.setdefault(name, f"{frame.f_code.co_filename}:{frame.f_lineno}")


def _own_code():
    """Which code is the program's (``evidence.Own``), for this process's entry point."""
    from autoalloc import evidence

    entry = STATE.entry
    packages = frozenset()
    if entry is not None:
        packages = evidence.entry_packages(entry.kind, entry.target, sys.modules.get("__main__"))
    return evidence.Own(evidence.installed_dirs(), _machinery_files(), packages)


# The wheel's top-level copies of the start-up modules, wherever they lie: their frames are
# told by their module name (the watcher's loader runs between an import and the hook).
_STARTUP = frozenset({"_autoalloc_loader", "_autoalloc_startup"})


@functools.lru_cache(maxsize=1)
def _machinery_files() -> tuple[str, ...]:
    """Files whose frames are the import machinery or autoalloc's package, never the
    program: what imports a module is the first frame outside them (and ``_STARTUP``)."""
    import importlib

    return ("<frozen importlib", os.path.dirname(importlib.__file__) + os.sep,
            os.path.dirname(os.path.abspath(__file__)) + os.sep)


def _on_optimizer() -> None:
    """The process built its first optimizer: decide again with ``training`` rules in play,
    from what the program itself asked for (``evidence``)."""
    messages.debug("the process built its first optimizer")
    decision, watcher = STATE.decision, _watcher()
    if watcher is not None and STATE.evidence_only:
        watcher.names -= STATE.evidence_only  # the training rules decide once, now
    if decision is None or decision.action != "none" or STATE.plan is None:
        return
    imported = _training_evidence(sys._getframe(1))
    plan = STATE.plan
    STATE.plan = _late(lambda now: plan.after_training(os.environ, imported, True, now))
    if STATE.plan.decision.action == "none":
        if watcher is not None and not watcher.names:
            _retire(watcher)
        return
    commit(STATE.plan.decision, "first optimizer")
    if STATE.adaptive is not None and _segments_on(STATE.plan.decision):
        STATE.adaptive.stop()  # nothing left to notice
    if watcher is not None:  # nothing left to watch: off sys.meta_path, as after_exec does
        watcher.names.clear()
        _retire(watcher)


def _training_evidence(frame) -> frozenset[str]:
    """The modules the decision counts at the first optimizer: every module the program has
    imported, except that a name a training rule uses counts only with evidence that the
    program asked for it (``evidence``); and names of classes the program holds."""
    from autoalloc import evidence

    modules = sys.modules
    names = training_names(STATE.policy.rules) if STATE.policy is not None else frozenset()
    loaded = modules.keys() - STATE.own - evidence.stubs(modules)
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    own = _own_code()
    said = {**STATE.asked, **evidence.asked(modules, frames, own)}
    found = evidence.supported(names, said, evidence.loaded_on_use(modules))
    before = (names & loaded) - found.keys()
    if before:  # imported before the watcher was there: what the program's own files import
        from autoalloc import scan

        found.update(scan.imports_in(evidence.own_files(modules, own), before))
    if messages.debug_enabled():
        shown = "; ".join(f"{name}: {why}" for name, why in sorted(found.items()))
        messages.debug(f"evidence of what the program uses: {shown or 'none'}")
    return frozenset((loaded - names) | found.keys())


def _late(decide: Callable[[InEffect], Plan]) -> Plan:
    """A late decision (torch is loaded): the rule's options merged under what torch uses now.

    The one way every late writer decides (the first optimizer, a late import trigger,
    ``adaptive = "apply"``): first from the guards' model of the setter calls; torch's own
    word is asked for only when a write follows, since asking builds its configuration.
    """
    from autoalloc import guards

    now = guards.in_effect(STATE)
    new = decide(now)
    if new.decision.action == "apply" and new.decision.setter_value is not None:
        told = guards.in_effect(STATE, ask_torch=True)
        if told != now:
            new = decide(told)
    return new


def _arm_adaptive(torch: ModuleType, sampler: StepSampler | None) -> None:
    """Watch the optimizer steps for the re-allocation symptom (``adaptive``; CUDA builds only).

    ``sampler``: the recorder's (``AUTOALLOC_REPORT``), so the counters are read once a step.
    """
    decision, policy = STATE.decision, STATE.policy
    if policy is None or policy.adaptive.value == "off":
        return
    if decision is None or _segments_on(decision):
        return
    from autoalloc import adaptive

    STATE.adaptive = adaptive.install(torch, _on_finding, sampler)


def _segments_on(decision: Decision) -> bool:
    """Nothing to notice: expandable segments are on already, or a rule decided to stay away."""
    if decision.action in ("skip", "disabled"):
        return True
    return allocconf.segments_on(decision.value)


def _on_finding(finding) -> None:
    """``adaptive`` saw the symptom: say so (advise), or turn the options on (apply); once."""
    from autoalloc import adaptive, guards
    from autoalloc.decide import resolve
    from autoalloc.policy import Rule, Source

    decision, policy, entry = STATE.decision, STATE.policy, STATE.entry
    if decision is None or policy is None or entry is None or _segments_on(decision):
        return
    if guards.in_effect(STATE).refused():  # the program turned them off itself: nothing to say
        messages.debug(f"adaptive: {finding.describe()}; the program set expandable_segments:False")
        return
    if policy.adaptive.value == "apply" and STATE.plan is not None:
        rule = Rule("adaptive", policy.adaptive.source or Source("builtin", "adaptive"))
        plan, torch = STATE.plan, STATE.torch

        def decide(now: InEffect) -> Plan:
            new = resolve(policy, rule, entry, os.environ, torch, True, now=now)
            reason = f"adaptive = apply: {finding.describe()}"
            return replace(plan, decision=replace(new, reason=reason))

        STATE.plan = _late(decide)
        commit(STATE.plan.decision, "adaptive")
        off = _still_off(STATE.plan.decision)
        if off is not None:  # the program's refusal, a backend that ignores it, torch's error
            messages.debug(f"adaptive = apply: expandable_segments stays off: {off}")
            return
        if STATE.torch_module is not None:
            STATE.torch_module.cuda.empty_cache()  # the cached non-expandable segments go back
        message = adaptive.applied_message(finding)
    else:
        message = adaptive.advice(finding, getattr(sys, "orig_argv", sys.argv))
    if messages.not_yet_said([f"autoalloc adaptive {policy.adaptive.value}"]):
        messages.warn(message, skip=_torch_frames())  # on global rank 0 only, as every warning


def _still_off(decision: Decision) -> str | None:
    """Why a late apply left expandable segments off (None: torch took them on)."""
    if decision.action != "apply" or decision.setter_value is None:
        return "nothing was written"
    if STATE.setter_error:
        return f"torch rejected {decision.setter_value!r} ({STATE.setter_error})"
    backend = allocconf.value_in(decision.value, "backend")
    if backend in allocconf.ASYNC_BACKENDS:
        return f"backend:{backend} ignores it"
    if not allocconf.segments_on(decision.setter_value):
        return "the settings in effect keep it off (the program's choice)"
    return None


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
