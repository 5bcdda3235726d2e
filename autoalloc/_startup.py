"""Arm autoalloc at interpreter start: this module goes on ``sys.meta_path`` and waits for torch.

Every Python process in the environment loads it (``autoalloc.pth``, or ``autoalloc.start``
on Python 3.15+), so it is as small as a finder can be: it touches only ``sys`` and ``os``,
which the interpreter has already loaded, defines no class, and does nothing until ``torch``
is looked up. The module itself is the meta-path finder (its ``find_spec`` function is the
finder's method). The rest of the watcher, the loader wrapper above all, is
``_autoalloc_loader`` (``autoalloc/_loader.py``), imported at the first lookup of a watched
name: its code, unmarshalled here, would cost every ``python -c pass`` a sixth more
(1.24 M instructions for the hook instead of 1.07 M, Python 3.11). It never raises, never
prints, never exits.

The wheel ships both files twice: in the package, and as top-level modules
(``_autoalloc_startup``, ``_autoalloc_loader``). The startup files load the first, which
arms itself when imported under that name, so the ``.pth`` line needs no call. ``os`` is
imported inside functions: a module-level ``os`` would keep the ``os`` module alive through
the armed watcher until late interpreter shutdown, which costs ``python -c pass`` more than
the import itself.
"""

import sys

# The environment variables this module reads, and only those: its own copies of
# autoalloc.envvars' names (it must import nothing of the package); tests/test_layout.py
# checks that they agree and that each is used.
DISABLE_VAR = "AUTOALLOC_DISABLE"  # switch autoalloc off for this process and its children
ORIGINAL_VAR = "AUTOALLOC_ORIGINAL"  # JSON: the allocator variables before autoalloc wrote them
REPORT_VAR = "AUTOALLOC_REPORT"  # write a report of the optimizer steps at exit (file, dir, -)

_TRUE = ("1", "true", "yes", "on")

autoalloc_watcher = True  # how autoalloc and its tests find the armed watcher on sys.meta_path
# The names watched: torch, then (after torch's decision) the policy's pending import
# triggers; the hook takes the watcher off sys.meta_path once nothing is left to watch.
names = {"torch"}


def truthy(value: "str | None") -> bool:
    """Whether an environment flag such as ``AUTOALLOC_DISABLE`` is switched on."""
    return value is not None and value.strip().lower() in _TRUE


def find_spec(fullname, path=None, target=None):
    """The finder's method: ``None`` at once, unless ``fullname`` is watched.

    importlib holds its global import lock while it asks the finders: importing anything
    of the ``autoalloc`` package here could deadlock with another thread importing it.
    ``_autoalloc_loader`` is imported by this function alone.
    """
    if fullname not in names:
        return None
    try:
        import _autoalloc_loader

        return _autoalloc_loader.find_spec(sys.modules.get(__name__), fullname, path, target)
    except Exception:  # a partial installation: stay out of the way
        return None


def __reduce_ex__(protocol):
    # copy.copy/deepcopy(sys.meta_path), which programs do, keep this module as it is
    return __name__


def pin_report(env) -> None:
    """A relative ``AUTOALLOC_REPORT`` made absolute now, against the directory the program
    started in: a trainer that changes directory later (Hydra) and its children, wherever
    they run, write where the user meant. The one place this is done: the recorder is armed
    only at an `import torch` the watcher that ``main`` installs afterwards sees."""
    import os

    target = env[REPORT_VAR]
    if target and target != "-" and not os.path.isabs(target):
        try:
            env[REPORT_VAR] = os.path.join(os.getcwd(), target)
        except OSError:
            pass


def main() -> None:
    """Put this module on ``sys.meta_path``; idempotent (venvs process ``.pth`` files twice)."""
    try:
        import os

        if sys.flags.isolated:
            return
        # Disabled: nothing to do, unless a parent process of this job wrote allocator
        # variables, which the watcher then restores at `import torch`, or AUTOALLOC_REPORT
        # asks for a report (the "off" arm of `autoalloc ab`).
        env = os.environ
        if REPORT_VAR in env:
            pin_report(env)
        if truthy(env.get(DISABLE_VAR)):
            if ORIGINAL_VAR not in env and REPORT_VAR not in env:
                return
        meta_path = sys.meta_path
        for finder in meta_path:
            if getattr(finder, "autoalloc_watcher", False):
                return
        if "torch" in sys.modules:
            return
        meta_path.insert(0, sys.modules[__name__])
    except Exception:
        pass


if __name__ == "_autoalloc_startup":  # loaded by the .pth line: arm now
    main()
