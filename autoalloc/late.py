"""After the decision at ``import torch``: what is still watched, and the decisions made late.

One object, ``Late``, owns it: the names the start-up watcher still looks for (the policy's
pending import triggers, the ``training`` rules' module names), which code asked for those
(the evidence of what the program itself uses), and every decision made once torch is
loaded: at an import trigger, at the first optimizer, when ``adaptive`` notices the
symptom. It decides through the plan and carries out through the hook's ``commit``, which
it is handed: the one writer of the allocator variables stays ``hook``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING

from autoalloc import allocconf, messages
from autoalloc.allocconf import InEffect
from autoalloc.decide import Decision
from autoalloc.match import pending_triggers, training_names
from autoalloc.plan import Plan, library_names
from autoalloc.records import replace

if TYPE_CHECKING:
    from autoalloc.evidence import Own

# The wheel's top-level copies of the start-up modules, wherever they lie: their frames are
# told by their module name (the watcher's loader runs between an import and the hook).
_STARTUP = frozenset({"_autoalloc_loader", "_autoalloc_startup"})


def watcher():
    """The start-up watcher on ``sys.meta_path`` (its ``names`` are what it watches)."""
    return next((f for f in sys.meta_path if getattr(f, "autoalloc_watcher", False)), None)


def retire(found) -> None:
    """Take the watcher off ``sys.meta_path`` with a new list: another thread's import may be
    iterating the current one, and removing an entry from it would skip the next finder."""
    if any(f is found for f in sys.meta_path):
        sys.meta_path = [f for f in sys.meta_path if f is not found]


def forget(*names: str) -> None:
    """``names`` need no more watching; the watcher goes once nothing is left to watch."""
    found = watcher()
    if found is not None:
        found.names.difference_update(names)
        if not found.names:
            retire(found)


def segments_on(decision: Decision) -> bool:
    """Nothing to notice: expandable segments are on already, or a rule decided to stay away."""
    if decision.action in ("skip", "disabled"):
        return True
    return allocconf.segments_on(decision.value)


class Late:
    """The watched names, the evidence, the late decisions of one process (``hook.STATE``)."""

    def __init__(self, state, commit: Callable[[Decision, str], None]) -> None:
        self.state, self.commit = state, commit
        # the training rules' module names watched until the first optimizer, only to see
        # which code imports them, and which of them the program's own code imported where
        self.evidence_names: frozenset[str] = frozenset()
        self.evidence_only: frozenset[str] = frozenset()
        self.asked: dict[str, str] = {}

    # ---------------------------------------------------------------- the watched names

    def watch_triggers(self, elsewhere: Iterable[str]) -> None:
        """Nothing decided at ``import torch``: watch the policy's pending import triggers
        (``elsewhere``: what other threads imported meanwhile, which triggers now)."""
        found, state = watcher(), self.state
        if found is None or state.policy is None or state.plan is None:
            return
        pending = pending_triggers(state.policy.rules, state.plan.imported)
        dead = pending & state.own
        if dead:  # already in sys.modules: the program's import of them executes nothing
            messages.debug(f"imports {sorted(dead)} cannot trigger: autoalloc imported them")
        found.names |= pending - dead
        for name in sorted(pending & frozenset(elsewhere) & sys.modules.keys()):
            self.trigger(found, name)  # it has executed already

    def executed(self, name: str) -> None:
        """A watched module other than torch has executed: a trigger decides again."""
        found = watcher()
        if found is not None and name not in self.evidence_only:
            self.trigger(found, name)
        forget(name)

    def trigger(self, found, name: str) -> None:
        """Module ``name`` was really imported: decide again with it counted as imported."""
        found.names.discard(name)
        state = self.state
        if state.decision is None or state.decision.action != "none" or state.plan is None:
            return
        imported = (sys.modules.keys() - state.own) | {name}
        plan = state.plan
        if state.torch_module is None:  # inside torch/__init__: the environment is still read
            new = plan.after_import(name, os.environ, imported, late=False)
        else:
            new = self.decide(lambda now: plan.after_import(name, os.environ, imported, True, now))
        if new.decision.action == "none":
            return
        state.plan = new
        self.commit(new.decision, f"import of {name}")
        found.names.clear()

    # ---------------------------------------------------------------- the first optimizer

    def watch_evidence(self) -> None:
        """Watch the training rules' module names not imported yet, to see who imports them."""
        found, policy = watcher(), self.state.policy
        if found is None or policy is None:
            return
        names = frozenset(n for n in training_names(policy.rules) if n not in sys.modules)
        self.evidence_names = names
        self.evidence_only = frozenset(names - found.names)
        found.names |= names

    def note_importer(self, name: str) -> None:
        """Module ``name`` is about to execute: remember where, when the importer is the
        program's own code (not a library importing it for its own purposes, nor importlib)."""
        own, skip = self.own_code(), _machinery_files()
        frame = sys._getframe(1)
        while frame is not None and (
            frame.f_code.co_filename.startswith(skip) or frame.f_globals.get("__name__") in _STARTUP
        ):
            frame = frame.f_back
        if frame is not None and own.code(frame.f_code.co_filename,
                                          frame.f_globals.get("__name__")):
            self.asked.setdefault(name, f"{frame.f_code.co_filename}:{frame.f_lineno}")

    def own_code(self) -> Own:
        """Which code is the program's (``evidence.Own``), for this process's entry point."""
        from autoalloc import evidence, scan  # only where the training rules or an importer ask

        entry = self.state.entry
        packages = frozenset()
        if entry is not None:
            main = sys.modules.get("__main__")
            packages = evidence.entry_packages(entry.kind, entry.target, main)
        return evidence.Own(scan.installed_dirs(), _machinery_files(), packages)

    def on_optimizer(self) -> None:
        """The process built its first optimizer: decide again with ``training`` rules in
        play, from what the program itself asked for (``evidence``)."""
        messages.debug("the process built its first optimizer")
        state, found = self.state, watcher()
        if found is not None and self.evidence_only:
            found.names -= self.evidence_only  # the training rules decide once, now
        if state.decision is None or state.decision.action != "none" or state.plan is None:
            return
        imported = self.evidence(sys._getframe(1))
        plan = state.plan
        state.plan = self.decide(lambda now: plan.after_training(os.environ, imported, True, now))
        if state.plan.decision.action != "none":
            self.commit(state.plan.decision, "first optimizer")
            if state.adaptive is not None and segments_on(state.plan.decision):
                state.adaptive.stop()  # nothing left to notice
            if found is not None:
                found.names.clear()  # nothing left to watch
        forget()

    def evidence(self, frame: FrameType | None) -> frozenset[str]:
        """The modules the decision counts at the first optimizer: every module the program
        has imported, except that a name a training rule uses counts only with evidence that
        the program asked for it, holds it or its code uses it (``evidence``, ``scan``); a
        module of the program's own never counts as the library of its name."""
        from autoalloc import evidence

        modules, state = sys.modules, self.state
        rules = state.policy.rules if state.policy is not None else ()
        names = training_names(rules)
        loaded = modules.keys() - state.own - evidence.stubs(modules)
        frames = []
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        own = self.own_code()
        said = {**self.asked, **evidence.asked(modules, frames, own)}
        found = evidence.supported(names, said, evidence.loaded_on_use(modules))
        source = state.plan.source if state.plan is not None else None
        if source is not None:
            found.update((n, w) for n, w in source.names.items() if n in source.uses)
        mine = evidence.own_named(library_names(rules), modules, state.entry)
        wanted = ((names & loaded) | evidence.attributes(names, modules)) - found.keys() - mine
        if wanted:  # imported before the watcher was there, or used: read the own files
            from autoalloc import scan

            files: dict[str, object] = {**evidence.own_files(modules, own, frames)}
            if state.entry is not None and state.entry.kind == "code":
                files["<string>"] = _code_text()
            found.update(scan.named_in(files, wanted, files))
        for name in mine:
            found.pop(name, None)
        if messages.debug_enabled():
            shown = "; ".join(f"{name}: {why}" for name, why in sorted(found.items()))
            messages.debug(f"evidence of what the program uses: {shown or 'none'}")
        return frozenset((loaded - names) | found.keys())

    # ---------------------------------------------------------------- deciding late

    def decide(self, decide: Callable[[InEffect], Plan]) -> Plan:
        """A late decision (torch is loaded): the rule's options merged under what torch uses
        now. The one way every late writer decides (the first optimizer, a late import
        trigger, ``adaptive = "apply"``): first from the guards' model of the setter calls;
        torch's own word is asked for only when a write follows, since asking builds its
        configuration."""
        from autoalloc import guards

        now = guards.in_effect(self.state)
        new = decide(now)
        if new.decision.action == "apply" and new.decision.setter_value is not None:
            told = guards.in_effect(self.state, ask_torch=True)
            if told != now:
                new = decide(told)
        return new

    def on_finding(self, finding) -> None:
        """``adaptive`` saw the symptom: say so (advise), or turn the options on (apply); once."""
        from autoalloc import adaptive, guards

        state = self.state
        decision, policy = state.decision, state.policy
        if decision is None or policy is None or state.entry is None or segments_on(decision):
            return
        if guards.in_effect(state).refused():  # the program turned them off itself
            messages.debug(f"adaptive: {finding.describe()}; the program set "
                           "expandable_segments:False")
            return
        if policy.adaptive.value == "apply" and state.plan is not None:
            message = self._apply_adaptive(finding)
            if message is None:
                return
        else:
            message = adaptive.advice(finding, getattr(sys, "orig_argv", sys.argv))
        if messages.not_yet_said([f"autoalloc adaptive {policy.adaptive.value}"]):
            skip = guards.skipped_frames() if state.torch_module is not None else ()
            messages.warn(message, skip=skip)  # on global rank 0 only, as every warning

    def _apply_adaptive(self, finding) -> str | None:
        """``adaptive = "apply"``: the options on, through the late path; the message, or None
        when they stay off (the program's refusal, a backend that ignores them, an error)."""
        from autoalloc import adaptive
        from autoalloc.decide import resolve
        from autoalloc.policy import Rule, Source

        state = self.state
        policy, plan, entry = state.policy, state.plan, state.entry
        rule = Rule("adaptive", policy.adaptive.source or Source("builtin", "adaptive"))

        def decide(now: InEffect) -> Plan:
            new = resolve(policy, rule, entry, os.environ, state.torch, True, now=now)
            return replace(plan, decision=replace(new, reason=f"adaptive = apply: "
                                                  f"{finding.describe()}"))

        state.plan = self.decide(decide)
        self.commit(state.plan.decision, "adaptive")
        off = self._still_off(state.plan.decision)
        if off is not None:
            messages.debug(f"adaptive = apply: expandable_segments stays off: {off}")
            return None
        if state.torch_module is not None:
            state.torch_module.cuda.empty_cache()  # the cached non-expandable segments go back
        return adaptive.applied_message(finding)

    def _still_off(self, decision: Decision) -> str | None:
        """Why a late apply left expandable segments off (None: torch took them on)."""
        if decision.action != "apply" or decision.setter_value is None:
            return "nothing was written"
        if self.state.setter_error:
            return f"torch rejected {decision.setter_value!r} ({self.state.setter_error})"
        backend = allocconf.value_in(decision.value, "backend")
        if backend in allocconf.ASYNC_BACKENDS:
            return f"backend:{backend} ignores it"
        if not allocconf.segments_on(decision.setter_value):
            return "the settings in effect keep it off (the program's choice)"
        return None


def _code_text() -> str:
    """The program given with ``python -c``."""
    argv = list(getattr(sys, "orig_argv", ()))
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-c"), "")


@functools.lru_cache(maxsize=1)
def _machinery_files() -> tuple[str, ...]:
    """Files whose frames are the import machinery or autoalloc's package, never the
    program: what imports a module is the first frame outside them (and ``_STARTUP``)."""
    import importlib

    return ("<frozen importlib", os.path.dirname(importlib.__file__) + os.sep,
            os.path.dirname(os.path.abspath(__file__)) + os.sep)
