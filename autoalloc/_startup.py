"""Arm autoalloc at interpreter start: opt-out checks and an import watcher for ``torch``.

Every Python process in the environment runs ``main()`` (from ``autoalloc.pth``, or
``autoalloc.start`` on Python 3.15+), so this module only touches ``sys`` and ``os``,
which the interpreter has already loaded, and does no work until ``torch`` is imported.
It never raises, never prints (except under ``AUTOALLOC_DEBUG``), never exits.
"""

import os
import sys

_TRUE = ("1", "true", "yes", "on")


def truthy(value: "str | None") -> bool:
    """Whether an environment flag such as ``AUTOALLOC_DISABLE`` is switched on."""
    return value is not None and value.strip().lower() in _TRUE


class Watcher:
    """Meta-path finder that wakes up only for the names in ``names``.

    It starts with ``{"torch"}``; after torch is loaded it holds the policy's pending
    import triggers, and it removes itself once there is nothing left to watch.
    """

    autoalloc_watcher = True

    def __init__(self) -> None:
        self.names = {"torch"}
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or self.busy:
            return None
        self.busy = True
        try:
            # The decision machinery is imported only now, next to a ~1 s torch import.
            from autoalloc import hook

            return hook.on_find(self, fullname, path, target)
        except Exception as exc:  # never break the host program's import
            if truthy(os.environ.get("AUTOALLOC_DEBUG")):
                sys.stderr.write(f"autoalloc: internal error at import of {fullname}: {exc!r}\n")
            return None
        finally:
            self.busy = False

    def invalidate_caches(self) -> None:
        pass


def main() -> None:
    """Startup entry point; idempotent, because venvs process ``.pth`` files twice."""
    try:
        if sys.flags.isolated:
            return
        # Disabled: nothing to do, unless a parent process of this job wrote allocator
        # variables, which the watcher then restores at `import torch`, or AUTOALLOC_REPORT
        # asks for a report (the "off" arm of `autoalloc ab`).
        env = os.environ
        if truthy(env.get("AUTOALLOC_DISABLE")):
            if "AUTOALLOC_ORIGINAL" not in env and "AUTOALLOC_REPORT" not in env:
                return
        meta_path = sys.meta_path
        for finder in meta_path:
            if getattr(finder, "autoalloc_watcher", False):
                return
        if "torch" in sys.modules:
            return
        meta_path.insert(0, Watcher())
    except Exception:
        pass
