"""Watch what happens to the allocator after ``import torch``; warn, never block.

Installed once torch's module has executed, and only around configuration calls (never
on an allocation path):

- torch's runtime setters (``torch._C._accelerator_setAllocatorSettings`` on 2.10+,
  ``torch._C._cuda_cudaCachingAllocator_set_allocator_settings`` before; both reached by
  ``torch.cuda.memory._set_allocator_settings``): a call that turns expandable segments
  off or changes the backend after autoalloc applied them gets one warning at the
  caller's file and line;
- ``change_current_allocator`` and ``torch.cuda.MemPool(allocator=...)``: the allocator
  options no longer apply to what they allocate.

The wrappers pass arguments, return values and exceptions through unchanged, and wrap
the C-level setters so that torch's own deprecation warning keeps pointing at user code.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from autoalloc import allocconf, messages

_SETTERS = ("_accelerator_setAllocatorSettings", "_cuda_cudaCachingAllocator_set_allocator_settings")
_warned: set[tuple[str, str]] = set()
_installed = False


def _intent(state: Any) -> dict[str, str]:
    """The options autoalloc applied in this process or inherited from its parent job."""
    decision = getattr(state, "decision", None)
    return decision.applied() if decision is not None else {}


def _applied_by(state: Any) -> str:
    """``rule NAME: key:value,...`` for the messages."""
    decision = getattr(state, "decision", None)
    intent = _intent(state)
    options = ",".join(f"{k}:{v}" for k, v in intent.items())
    return f"rule {decision.rule}: {options}" if decision is not None and decision.rule else options


def setter_conflicts(intent: dict[str, str], value: object) -> list[str]:
    """What a setter call undoes of ``intent``: ``expandable_segments`` off, or another ``backend``."""
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


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(getattr(torch, "__file__", "") or "") + os.sep


def _caller() -> tuple[int, str]:
    """``stacklevel`` (for a warn in our caller's caller) and ``file:line`` of the first user frame."""
    skip = (_torch_dir(), messages.PACKAGE_DIR + os.sep, "<frozen importlib")
    frame = sys._getframe(2)
    level = 2
    while frame is not None:
        name = frame.f_code.co_filename
        base = os.path.basename(name)
        if not (name.startswith(skip) or base in ("typing_extensions.py", "warnings.py", "functools.py")):
            return level, f"{name}:{frame.f_lineno}"
        frame = frame.f_back
        level += 1
    return 2, "<unknown>"


def _warn_once(key: str, message: str) -> None:
    """One warning per kind of call and call site (a setter in a loop warns once)."""
    level, where = _caller()
    if (key, where) in _warned:
        return
    _warned.add((key, where))
    messages.warn(f"autoalloc: {where}: {message}", stacklevel=level)


def _guard_setter(original: Callable[..., Any], state: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def setter(*args: Any, **kwargs: Any) -> Any:
        try:
            intent = _intent(state)
            conflicts = setter_conflicts(intent, args[0] if args else kwargs.get("env"))
            if conflicts:
                effects = []
                if "expandable_segments:False" in conflicts:
                    effects.append("memory segments created from now on are not expandable")
                if any(c.startswith("backend:") for c in conflicts):
                    effects.append("the backend is fixed when torch loads, so torch refuses to change it")
                _warn_once(
                    "setter:" + ",".join(conflicts),
                    f"this call sets {', '.join(conflicts)}, undoing what autoalloc applied ({_applied_by(state)}); "
                    + "; ".join(effects),
                )
        except Exception:
            pass
        return original(*args, **kwargs)

    return setter


def _guard_custom_allocator(
    original: Callable[..., Any], state: Any, what: str, uses_allocator: Callable[..., bool], effect: str, consequence: str
) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            if _intent(state) and uses_allocator(*args, **kwargs):
                _warn_once(what, f"{effect}, so the options autoalloc applied ({_applied_by(state)}) {consequence}")
        except Exception:
            pass
        return original(*args, **kwargs)

    return call


def _mempool_allocator(self: Any, allocator: Any = None, *args: Any, **kwargs: Any) -> bool:
    return allocator is not None


def install(state: Any) -> None:
    """Wrap torch's allocator-configuration entry points (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
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
            init, state, "torch.cuda.MemPool", _mempool_allocator,
            "torch.cuda.MemPool(allocator=...) allocates through a custom allocator", "do not apply to its memory",
        )
