"""Notice the first ``torch.optim.Optimizer`` this process builds (the ``training`` condition).

torch has global hooks for optimizer *steps* but none for construction, so ``install``
wraps ``torch.optim.Optimizer.__init__`` once. Every optimizer runs it (AdamW, SGD, icefall's
ScaledAdam, apex/DeepSpeed fused optimizers and the optimizers inside Lightning's, HF's and
DeepSpeed's wrappers all call it), so the first construction anywhere is seen. The wrapper
calls back once, after the optimizer is built, then puts the original ``__init__`` back: later
optimizers cost nothing. The hook installs it only when some rule of the policy has
``training = true``, so other processes pay nothing at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_MARK = "_autoalloc_training"


def install(optimizer_class: Any, on_first: Callable[[], None]) -> bool:
    """Call ``on_first()`` once, when the first optimizer has been built; False if already armed."""
    original = optimizer_class.__dict__.get("__init__")
    if original is None or getattr(original, _MARK, False):
        return False

    fired = []

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if fired:
            return
        fired.append(True)
        # Once is enough: later optimizers run torch's own. A library that wrapped this
        # wrapper in turn (its own __init__ is the class attribute now) keeps its wrapper,
        # which then calls this one, which returns at once.
        if optimizer_class.__dict__.get("__init__") is __init__:
            optimizer_class.__init__ = original
        try:
            on_first()
        except Exception:  # the user's optimizer is built; autoalloc never breaks it
            pass

    setattr(__init__, _MARK, True)
    optimizer_class.__init__ = __init__
    return True

