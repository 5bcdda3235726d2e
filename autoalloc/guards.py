"""Watch what happens to the allocator after ``import torch``; warn, never block.

Installed once torch's module has executed, and only around configuration calls (never
on an allocation path):

- torch's runtime setters (``_SETTERS`` on ``torch._C``, which
  ``torch.cuda.memory._set_allocator_settings`` calls), in a process where autoalloc
  applied options or inherited a job's:
  - a call that turns expandable segments off or changes the backend gets one warning at
    the caller's file and line;
  - a call that drops options in effect (what every call resets unless it names it:
    ``allocconf.dropped_by_setter``) gets one warning naming each one and where it came
    from, or, with ``on_setter = "merge"``, passes torch the call's options merged over
    what is in effect;
  every call is recorded (``Setters.calls``, on the hook's state) for ``doctor`` and
  ``autoalloc.status()``;
- ``change_current_allocator`` and ``torch.cuda.MemPool(allocator=...)``: the allocator
  options no longer apply to what they allocate.

The wrappers pass arguments, return values and exceptions through unchanged (a string
torch rejects reaches it as it was given), and wrap the C-level setters so that torch's own
deprecation warning keeps pointing at user code. Each warning is said once per call site
and once per job (``AUTOALLOC_WARNED``), on global rank 0 and DataLoader worker 0 only.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from autoalloc import allocconf, messages, torchinfo
from autoalloc.envvars import ORIGINAL_VAR, global_rank
from autoalloc.records import fields, record

_SETTERS = (  # 2.10+, and before
    "_accelerator_setAllocatorSettings", "_cuda_cudaCachingAllocator_set_allocator_settings"
)
# Frames between the user's call and ours: torch's (its deprecated wrapper) and the modules
# that implement ``@deprecated`` and ``functools.wraps``.
_NOT_USER = ("typing_extensions.py", "warnings.py", "functools.py")

@record
class SetterCall:
    """One runtime setter call seen in this process, and what it did to the options in effect."""

    where: str  # the caller's file:line
    value: str  # the string the caller passed
    passed: str  # what torch was given (the merged string with on_setter = "merge")
    dropped: tuple[tuple[str, str], ...]  # options in effect that the call put back to default
    kept: bool  # on_setter = "merge" kept them
    error: str | None = None  # torch's exception, if it raised


@record
class _Model:
    """What torch's allocator uses now, as autoalloc models it: the environment's string torch
    read, then every setter call since (``allocconf.after_setter``), and who set each option."""

    pairs: list[tuple[str, str]]
    origin: dict[str, str]  # key -> the environment variable, "the call at FILE:LINE", a rule
    last: str  # the last string torch was given (its getter returns it)
    runtime: set[str] = field(default_factory=set)  # keys a call of the program set last


@record
class Setters:
    """What the guards remember in one process; it lives on the hook's state (``setters``)."""

    installed: bool = False
    warned: set[tuple[str, str]] = field(default_factory=set)  # (kind of call, call site)
    calls: list[SetterCall] = field(default_factory=list)  # for doctor and status()
    model: _Model | None = None  # None until first needed
    # What torch used at the first guarded call where autoalloc had applied options (doctor).
    asked: list[tuple[str, str]] | None = None
    asked_origin: dict[str, str] = field(default_factory=dict)


def _setters(state: Any) -> Setters:
    """The guards' memory on ``state``, made on first use (a process that never imports
    torch never imports this module)."""
    if state.setters is None:
        state.setters = Setters()
    return state.setters


def _intent(state: Any) -> dict[str, str]:
    """The options autoalloc applied in this process or inherited from its parent job."""
    decision = getattr(state, "decision", None)
    return decision.applied() if decision is not None else {}


def _applied_by(state: Any) -> str:
    """``rule NAME: key:value,...`` for the messages."""
    decision = getattr(state, "decision", None)
    intent = _intent(state)
    options = ",".join(f"{k}:{v}" for k, v in intent.items())
    if decision is not None and decision.rule:
        return f"rule {decision.rule}: {options}"
    return options


def setter_conflicts(intent: dict[str, str], value: object) -> list[str]:
    """What a setter call undoes of ``intent``: ``expandable_segments`` off, another ``backend``."""
    if not isinstance(value, str) or not intent:
        return []
    try:
        pairs = allocconf.parse(value)
    except allocconf.ConfError:
        return []  # torch will reject it itself
    found = []
    segments = allocconf.last_value(pairs, "expandable_segments")
    if intent.get("expandable_segments") == "True" and segments == "False":
        found.append("expandable_segments:False")
    backend = allocconf.last_value(pairs, "backend")
    if backend is not None and backend != intent.get("backend", "native"):
        found.append(f"backend:{backend}")
    return found


def _describe(valued: Any) -> str:
    source = valued.source
    if source is None:
        return "autoalloc's defaults"
    if valued.rule:
        return f"rule {valued.rule} in {source.path}"
    return f"the {source.layer} policy {source.path}"


def _user_string(decision: Any, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The variable the user set that torch reads, and its value before autoalloc changed it."""
    if decision.action == "inherited":
        try:
            original = json.loads(env.get(ORIGINAL_VAR) or "null")
        except ValueError:
            original = None
        if not isinstance(original, dict):  # the parent wrote nothing: the string is the user's
            return decision.read_var, decision.value or ""
        before = {k: v for k, v in original.items() if isinstance(v, str)}
    else:
        before = dict(decision.env_before)
    var = allocconf.effective_var(before, decision.torch)
    return var, before.get(var, "") if var else ""


def origins(decision: Any, policy: Any, env: Mapping[str, str]) -> dict[str, str]:
    """Where each option of the string torch reads came from: the user's variable or the policy."""
    if decision is None or decision.action not in ("apply", "inherited") or not decision.value:
        return {}
    try:
        pairs = allocconf.parse(decision.value)
        var, text = _user_string(decision, env)
        user = dict(allocconf.parse(text))
    except allocconf.ConfError:
        return {}
    rule = next((r for r in getattr(policy, "rules", ()) if r.name == decision.rule), None)
    options = policy.options_for(rule) if rule is not None else {}
    out = {}
    for key, value in pairs:
        if key in user and (user[key] == value or key not in options):
            out[key] = var or "the environment"
        elif key in options:
            out[key] = _describe(options[key])
        else:
            out[key] = f"rule {decision.rule}" if decision.rule else "a parent process"
    return out


def reset_message(dropped: list[tuple[str, str]], origin: Mapping[str, str]) -> str:
    """``resets k:v, k:v (from SOURCE) to torch's defaults; set on_setter = ...``."""
    groups: dict[str, list[str]] = {}
    for key, value in dropped:
        groups.setdefault(origin.get(key, "an earlier call"), []).append(f"{key}:{value}")
    named = " and ".join(f"{', '.join(items)} (from {source})" for source, items in groups.items())
    one = len(dropped) == 1
    return (
        f"resets {named} to torch's default{'' if one else 's'}; "
        f'set on_setter = "merge" to keep {"it" if one else "them"}'
    )


def skipped_frames() -> tuple[str, ...]:
    """The files a warning never names as the program's line: torch's, and those between the
    program's call and torch's (``_NOT_USER``)."""
    torch = sys.modules.get("torch")
    return (os.path.dirname(getattr(torch, "__file__", "") or "") + os.sep, *_NOT_USER)


def _secondary() -> bool:
    """A process whose siblings make the same calls: a rank other than global rank 0, or a
    DataLoader worker other than worker 0 (one warning per job, not one per process)."""
    if global_rank():
        return True
    worker = sys.modules.get("torch.utils.data._utils.worker")
    info = getattr(worker, "_worker_info", None)
    return info is not None and getattr(info, "id", 0) != 0


def _warn_once(state: Any, key: str, message: str, where: str | None = None) -> None:
    """One warning per kind of call and call site (a setter in a loop warns once), per job."""
    if where is None:
        where = messages.user_frame(skipped_frames())[1]
    warned = _setters(state).warned
    if (key, where) in warned:
        return
    warned.add((key, where))
    text = f"autoalloc: {where}: {message}"
    if _secondary():
        return
    if messages.not_yet_said([text]):
        messages.warn(text, skip=skipped_frames())


def _base(state: Any) -> _Model:
    """The model before any call autoalloc saw: the string torch reads from the environment."""
    torch = getattr(state, "torch", None)
    var = allocconf.effective_var(os.environ, torch)
    text = os.environ.get(var, "") if var else ""
    try:
        pairs = allocconf.parse(text)
    except allocconf.ConfError:
        pairs = []  # torch rejects it at its first use: its defaults, as far as autoalloc knows
    origin = dict.fromkeys((k for k, _ in pairs), var or "the environment")
    decided = origins(getattr(state, "decision", None), getattr(state, "policy", None), os.environ)
    origin.update((k, v) for k, v in decided.items() if k in origin)
    return _Model(pairs, origin, text)


def _torch_last_string(state: Any) -> str | None:
    """The last allocator string torch was given, by torch's own word: its getter (2.12+).

    The getter builds torch's allocator configuration: asked only where autoalloc is about to
    write or applied options, and only of the torch autoalloc saw imported while it is
    ``sys.modules["torch"]`` (a mock put there is never called). Never the snapshot (seconds
    on a CUDA build, for doctor and tests only): before 2.12 the model of the environment
    and the calls seen stands.
    """
    torch = getattr(state, "torch_module", None)
    if torch is None or sys.modules.get("torch") is not torch:
        return None
    try:
        return torchinfo.allocator_string(torch)
    except Exception:
        return None


def _model_now(state: Any, ask_torch: bool) -> _Model:
    """The model, created on first use; with ``ask_torch``, a call autoalloc did not see
    (inside ``torch/__init__`` before the guards, or through a reference taken earlier)
    is added from torch's own last string."""
    setters = _setters(state)
    if setters.model is None:
        setters.model = _base(state)
    model = setters.model
    raw = _torch_last_string(state) if ask_torch else None
    if raw is not None and raw != model.last:
        try:
            unseen = allocconf.parse(raw)
        except allocconf.ConfError:
            unseen = []
        _note(state, model, unseen, {k for k, _ in unseen}, "an earlier setter call", True)
        model.last = raw
    return model


def _note(
    state: Any, model: _Model, passed: list[tuple[str, str]], named: set[str], origin: str,
    runtime: bool,
) -> None:
    """Torch accepted ``passed``: the options in effect follow; ``named`` (the keys the caller
    asked for, or any key whose value changed) are now ``origin``'s."""
    torch = getattr(state, "torch", None)
    before = dict(model.pairs)
    model.pairs = allocconf.after_setter(model.pairs, passed, torch.release if torch else None)
    for key, value in passed:
        if key in named or before.get(key) != value:
            model.origin[key] = origin
            (model.runtime.add if runtime else model.runtime.discard)(key)
    model.runtime &= {k for k, _ in model.pairs}


def in_effect(state: Any, ask_torch: bool = False) -> allocconf.InEffect:
    """What torch uses now, for a late apply: the options, who set each, the program's keys.

    ``ask_torch`` only right before a write (it builds torch's allocator configuration).
    """
    model = _model_now(state, ask_torch)
    return allocconf.InEffect(tuple(model.pairs), dict(model.origin), frozenset(model.runtime))


def write(state: Any, torch: Any, text: str, origin: str) -> str | None:
    """autoalloc's own late write: torch's unguarded setter gets ``text`` (the full merged
    string); the model follows. Torch's error, or None."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter = getattr(setter, "__wrapped__", setter)
    model = _model_now(state, False)
    model.last = text  # torch keeps even a string it refuses (what is in effect then stays)
    try:
        setter(text)
    except Exception as exc:  # ValueError on 2.10+, RuntimeError before, AttributeError on old CPU
        return f"{type(exc).__name__}: {exc}"
    try:
        _note(state, model, allocconf.parse(text), set(), origin, False)
    except allocconf.ConfError:
        pass
    return None


@record
class _Plan:
    """What a guarded call is about to do, worked out before torch sees it."""

    value: str
    where: str
    conflicts: list[str]
    call: list[tuple[str, str]] | None  # None: a string autoalloc cannot parse (torch decides)
    dropped: list[tuple[str, str]]
    merge: bool
    quiet: bool = False  # autoalloc applied nothing here: the call is only modelled


def _plan(state: Any, args: tuple, kwargs: dict) -> _Plan | None:
    """What the call is about to do. Where autoalloc applied nothing the process is left
    alone (``quiet``): the call is only counted in the model, for a later late apply."""
    value = args[0] if args else kwargs.get("env")
    if not isinstance(value, str):
        return None
    intent = _intent(state)
    # A call autoalloc did not see counts first, asked of torch only where autoalloc applied
    # options; elsewhere the model follows the calls (a late apply asks before it writes).
    model = _model_now(state, ask_torch=bool(intent))
    where = messages.user_frame(skipped_frames())[1]
    try:
        call: list[tuple[str, str]] | None = allocconf.parse(value)
    except allocconf.ConfError:
        call = None
    if not intent:
        return _Plan(value, where, [], call, [], False, quiet=True)
    setters = _setters(state)
    if setters.asked is None:
        setters.asked = list(model.pairs)
        setters.asked_origin.update(model.origin)
    conflicts = setter_conflicts(intent, value)
    if call is None:
        return _Plan(value, where, conflicts, None, [], False)
    torch = getattr(state, "torch", None)
    dropped = allocconf.dropped_by_setter(model.pairs, call, torch.release if torch else None)
    policy = getattr(state, "policy", None)
    merge = bool(dropped) and policy is not None and policy.on_setter.value == "merge"
    return _Plan(value, where, conflicts, call, dropped, merge)


def _keep(original: Callable[..., Any], plan: _Plan, effect: list[tuple[str, str]]) -> str | None:
    """on_setter = "merge": torch gets the call's options over what is in effect; that string."""
    merged = allocconf.merged_for_setter(effect, plan.call or [])
    text = allocconf.serialize(merged)
    try:
        allocconf.check_options(merged)
        original(text)
    except Exception as exc:  # a combination torch refuses: back to exactly what was asked for
        try:
            original(plan.value)
        except Exception:
            pass
        messages.debug(
            f"{plan.where}: on_setter = merge: torch refuses {messages.shortened(text)} ({exc}); "
            "not merged"
        )
        return None
    kept = ", ".join(f"{k}:{v}" for k, v in plan.dropped)
    messages.debug(
        f"{plan.where}: on_setter = merge: torch gets {messages.shortened(text)} "
        f"for {messages.shortened(plan.value)} (keeps {kept})"
    )
    return text


def _say(state: Any, plan: _Plan, dropped: list[tuple[str, str]]) -> None:
    """The one warning for this call: what it undoes of autoalloc's options, what it drops."""
    parts = []
    if plan.conflicts:
        effects = []
        if "expandable_segments:False" in plan.conflicts:
            effects.append("memory segments created from now on are not expandable")
        if any(c.startswith("backend:") for c in plan.conflicts):
            effects.append("the backend is fixed when torch loads, so torch refuses to change it")
        parts.append(
            f"this call sets {', '.join(plan.conflicts)}, undoing what autoalloc applied "
            f"({_applied_by(state)}); " + "; ".join(effects)
        )
    if dropped:
        model = _setters(state).model
        origin = model.origin if model is not None else {}
        parts.append(("it also " if parts else "this call ") + reset_message(dropped, origin))
    if parts:
        _warn_once(state, "setter", "; ".join(parts), plan.where)


def _record(state: Any, plan: _Plan, passed: str | None, error: BaseException | None) -> None:
    """Update the model of what torch uses, and remember the call for doctor and status().

    A call torch rejected changes nothing in the model: what the program and the user asked
    for before it is still what a later call merges over.
    """
    model = _model_now(state, False)
    if error is None and plan.call is not None:
        applied = allocconf.parse(passed) if passed is not None else plan.call
        named = {k for k, _ in plan.call}
        _note(state, model, applied, named, f"the call at {plan.where}", True)
    model.last = passed if passed is not None else plan.value  # torch keeps even one it refused
    if plan.quiet:
        return
    _setters(state).calls.append(SetterCall(
        plan.where, plan.value, passed or plan.value, tuple(plan.dropped), passed is not None,
        None if error is None else f"{type(error).__name__}: {error}",
    ))


def changed_by(calls: list[SetterCall], asked: list[tuple[str, str]]) -> dict[str, str]:
    """For each option asked for, the last call that dropped it or set it to another value."""
    want = dict(asked)
    out: dict[str, str] = {}
    for call in calls:
        for key, _ in () if call.kept else call.dropped:
            out[key] = call.where
        try:
            passed = allocconf.parse(call.passed)
        except allocconf.ConfError:
            continue
        for key, value in passed:
            if key in want and value != want[key]:
                out[key] = call.where
    return out


def setter_report(
    state: Any,
    snapshot_value: Callable[[str], str | bool | None],
    same: Callable[[str, str, str | None], bool],
) -> dict[str, Any] | None:
    """After runtime setter calls (None before any): each option the environment and the
    policy asked for, what torch uses now and the call that changed it.

    ``snapshot_value(key)`` is torch's parsed value (``False`` where torch cannot say one,
    e.g. through the getter, which returns only the last string passed); autoalloc's model
    of the calls stands in for it there.
    """
    setters = state.setters
    if setters is None or not setters.calls:
        return None
    model = dict(setters.model.pairs if setters.model is not None else [])
    asked = setters.asked or []
    changed = changed_by(setters.calls, asked)
    options = {}
    for key, value in asked:
        now = snapshot_value(key)
        source = "snapshot"
        if now is False:
            now, source = model.get(key), "autoalloc's model of the calls"
        options[key] = {
            "asked": value, "from": setters.asked_origin.get(key, "?"), "now": now,
            "reported_by": source,
            "changed_by": changed.get(key), "ok": same(key, value, now),  # type: ignore[arg-type]
        }
    calls = [{f.name: getattr(call, f.name) for f in fields(call)} for call in setters.calls]
    return {"calls": calls, "options": options}


def _guard_setter(original: Callable[..., Any], state: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def setter(*args: Any, **kwargs: Any) -> Any:
        try:
            plan = _plan(state, args, kwargs)
        except Exception:
            plan = None
        if plan is None:
            return original(*args, **kwargs)
        try:
            result = original(*args, **kwargs)
        except Exception as exc:
            _after(original, state, plan, exc)
            raise
        _after(original, state, plan, None)
        return result

    # pybind's __qualname__ names no attribute of torch._C: pickle finds the setter by name
    setter.__qualname__ = getattr(original, "__name__", setter.__qualname__)
    return setter


def _after(
    original: Callable[..., Any], state: Any, plan: _Plan, error: BaseException | None
) -> None:
    """Merge or warn once the call has run; never raises."""
    try:
        merge = plan.merge and error is None  # never for a quiet plan
        passed = _keep(original, plan, list(_model_now(state, False).pairs)) if merge else None
        if not plan.quiet:
            _say(state, plan, [] if passed is not None or error is not None else plan.dropped)
        _record(state, plan, passed, error)
    except Exception as exc:
        messages.debug(f"internal error in the setter guard: {exc!r}")


def _guard_custom_allocator(
    original: Callable[..., Any],
    state: Any,
    what: str,
    uses_allocator: Callable[..., bool],
    effect: str,
    consequence: str,
) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            if _intent(state) and uses_allocator(*args, **kwargs):
                applied = _applied_by(state)
                said = f"{effect}, so the options autoalloc applied ({applied}) {consequence}"
                _warn_once(state, what, said)
        except Exception:
            pass
        return original(*args, **kwargs)

    return call


def install(state: Any) -> None:
    """Wrap torch's allocator-configuration entry points (once per process)."""
    setters = _setters(state)
    if setters.installed:
        return
    setters.installed = True
    torch = sys.modules.get("torch")
    if torch is None:
        return
    c = getattr(torch, "_C", None)
    for name in _SETTERS:
        original = getattr(c, name, None)
        if original is not None:
            setattr(c, name, _guard_setter(original, state))
    cuda = getattr(torch, "cuda", None)
    memory = getattr(cuda, "memory", None)
    change = getattr(memory, "change_current_allocator", None)
    if change is not None:
        wrapped = _guard_custom_allocator(
            change, state, "change_current_allocator", lambda *a, **k: True,
            "change_current_allocator replaces torch's caching allocator", "no longer apply",
        )
        for module in (memory, cuda):
            if getattr(module, "change_current_allocator", None) is change:
                module.change_current_allocator = wrapped
    pool = getattr(cuda, "MemPool", None)
    init = getattr(pool, "__init__", None)
    if isinstance(pool, type) and init is not None and init is not object.__init__:
        pool.__init__ = _guard_custom_allocator(
            init, state, "torch.cuda.MemPool",
            lambda self, allocator=None, *args, **kwargs: allocator is not None,
            "torch.cuda.MemPool(allocator=...) allocates through a custom allocator",
            "do not apply to its memory",
        )
