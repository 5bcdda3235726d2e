"""Carry out the decision at ``import torch``: the only place that writes the environment.

The startup watcher calls ``on_find`` when ``torch`` (or, later, a policy import
trigger) is about to be imported. For torch it finds the real spec, decides before any
of torch's code runs, writes the environment, and arranges for the guards to be
installed once torch's module has executed. A trigger that fires after torch is loaded
applies the full merged string through the runtime setter.
"""

from __future__ import annotations

import os
import sys
import zlib
from dataclasses import dataclass, field

from autoalloc import entrypoint, report, sources, torchinfo
from autoalloc._startup import truthy
from autoalloc.decide import Decision, decide, disabled
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import pending_triggers
from autoalloc.policy import Policy
from autoalloc.torchinfo import TorchInfo


@dataclass
class State:
    """What this process decided; ``autoalloc.status()`` reads it."""

    decision: Decision | None = None
    policy: Policy | None = None
    entry: EntryPoint | None = None
    torch: TorchInfo | None = None
    errors: list[str] = field(default_factory=list)
    setter_error: str | None = None


STATE = State()
WARNED_VAR = "AUTOALLOC_WARNED"


def on_find(watcher, fullname: str, path, target):
    """Called by the startup watcher for a watched name; returns torch's spec or None."""
    if fullname == "torch":
        return _on_torch(watcher, path, target)
    _on_trigger(watcher, fullname)
    return None


def _real_spec(watcher, fullname: str, path, target):
    meta_path = sys.meta_path
    start = meta_path.index(watcher) + 1 if watcher in meta_path else 0
    for finder in meta_path[start:]:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is not None:
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
    return None


def _on_torch(watcher, path, target):
    spec = _real_spec(watcher, "torch", path, target)
    if spec is None:
        return None
    if STATE.decision is None:
        STATE.torch = torchinfo.from_spec(spec)
        STATE.entry = _decided_for(entrypoint.current())
        if truthy(os.environ.get("AUTOALLOC_DISABLE")):
            decision = disabled(STATE.entry, os.environ, STATE.torch, "AUTOALLOC_DISABLE is set")
        else:
            STATE.policy = sources.load(STATE.entry, os.environ, entrypoint.current_cwd())
            decision = decide(STATE.policy, STATE.entry, os.environ, STATE.torch, set(sys.modules))
        commit(decision)
        if decision.action == "none" and STATE.policy is not None:
            watcher.names |= pending_triggers(STATE.policy.rules, sys.modules)
    _after_exec(spec, watcher)
    return spec


def _decided_for(entry: EntryPoint) -> EntryPoint:
    """The entry point to decide for: a torchrun launcher's workers, else this process's own.

    Deciding in the launcher lets every rank inherit the environment and its
    ``AUTOALLOC_APPLIED`` mark, so a job warns once instead of once per rank.
    """
    decided, workers = entrypoint.decided_for(entry, sys.executable or "python", entrypoint.current_cwd())
    if workers is not None:
        report.debug(f"{entry.describe()} is a launcher: deciding for its workers ({' '.join(workers[1:])})")
    return decided


def _after_exec(spec, watcher) -> None:
    """Run ``_torch_loaded`` once torch's module has executed (wraps this spec's loader)."""
    loader = spec.loader
    exec_module = getattr(loader, "exec_module", None)
    if exec_module is None or getattr(exec_module, "_autoalloc", False):
        return

    def wrapped(module):
        exec_module(module)
        try:
            _torch_loaded(watcher)
        except Exception as exc:
            STATE.errors.append(repr(exc))
            report.debug(f"internal error after import torch: {exc!r}")

    wrapped._autoalloc = True  # type: ignore[attr-defined]
    try:
        loader.exec_module = wrapped
    except (AttributeError, TypeError):  # a loader that forbids it: no guards, nothing else lost
        pass


def _torch_loaded(watcher) -> None:
    from autoalloc import guards

    guards.install(STATE)
    if os.environ.get("AUTOALLOC_REPORT"):  # the measurement half, only when asked for
        from autoalloc.ab import recorder

        recorder.install()
    watcher.names.discard("torch")
    if not watcher.names and watcher in sys.meta_path:
        sys.meta_path.remove(watcher)


def _on_trigger(watcher, name: str) -> None:
    watcher.names.discard(name)
    decision = STATE.decision
    if decision is None or decision.action != "none" or STATE.policy is None or STATE.entry is None:
        return
    torch_module = sys.modules.get("torch")
    late = torch_module is not None and not getattr(getattr(torch_module, "__spec__", None), "_initializing", False)
    imported = set(sys.modules) | {name}
    new = decide(STATE.policy, STATE.entry, os.environ, STATE.torch, imported, late=late)
    if new.action == "none":
        return
    commit(new)
    watcher.names.clear()
    if "torch" in sys.modules and watcher in sys.meta_path:
        sys.meta_path.remove(watcher)


def commit(decision: Decision) -> None:
    """Carry out a decision: environment writes, the runtime setter, warnings, the debug trace."""
    STATE.decision = decision
    for name, value in decision.writes.items():
        os.environ[name] = value
    for name in decision.unsets:
        os.environ.pop(name, None)
    if decision.setter_value is not None:
        STATE.setter_error = _call_setter(decision.setter_value)
    messages = list(decision.warnings)
    if STATE.setter_error:
        messages.append(f"autoalloc: torch rejected the allocator settings {decision.setter_value!r}: {STATE.setter_error}")
    for message in _not_yet_said(messages):
        report.warn(message)
    report.debug(decision.summary())
    for note in decision.notes:
        report.debug(f"note: {note}")


def _not_yet_said(messages: list[str]) -> list[str]:
    """The messages no process of this job has warned about yet; marks them as said.

    ``AUTOALLOC_WARNED`` carries a short digest of each warning to child processes, so a
    bad policy file or a conflict is reported once per job, not once per worker.
    """
    said = os.environ.get(WARNED_VAR, "").split(",")
    fresh = []
    for message in messages:
        digest = format(zlib.crc32(message.encode("utf-8", "surrogateescape")), "08x")
        if digest not in said:
            said.append(digest)
            fresh.append(message)
    if fresh:
        os.environ[WARNED_VAR] = ",".join(d for d in said if d)
    return fresh


def _call_setter(value: str) -> str | None:
    """Apply ``value`` with torch's runtime setter (the unguarded one); the error text or None."""
    torch = sys.modules["torch"]
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter = getattr(setter, "__wrapped__", setter)
    try:
        setter(value)
    except Exception as exc:  # ValueError on 2.10+, RuntimeError before, AttributeError on old CPU builds
        return f"{type(exc).__name__}: {exc}"
    return None
