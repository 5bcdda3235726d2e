"""Arm autoalloc at interpreter start: opt-out checks and an import watcher for ``torch``.

Every Python process in the environment runs ``main()`` (from ``autoalloc.pth``, or
``autoalloc.start`` on Python 3.15+), so this module only touches ``sys``, ``os`` and
``_thread``, which the interpreter has already loaded, and does no work until ``torch`` is imported.
It never raises, never prints (except under ``AUTOALLOC_DEBUG``), never exits.

The wheel ships this file twice: as ``autoalloc._startup`` and as the top-level module
``_autoalloc_startup``, which is what the startup files load. One top-level module costs
one import at start-up instead of two (the package, then this module).
``os`` is imported inside the functions: a module-level ``os`` would keep the ``os``
module alive through the armed watcher until late interpreter shutdown, which costs
``python -c pass`` more than the import itself.
"""

import sys
from _thread import get_ident  # built in, loaded by importlib's bootstrap before site runs

# The environment variables this module reads, and only those: its own copies of
# autoalloc.envvars' names (it must import nothing of the package); tests/test_layout.py
# checks that they agree and that each is used.
DISABLE_VAR = "AUTOALLOC_DISABLE"  # switch autoalloc off for this process and its children
DEBUG_VAR = "AUTOALLOC_DEBUG"  # trace each decision to stderr
ORIGINAL_VAR = "AUTOALLOC_ORIGINAL"  # JSON: the allocator variables before autoalloc wrote them
REPORT_VAR = "AUTOALLOC_REPORT"  # write a report of the optimizer steps at exit (file, dir, -)

_TRUE = ("1", "true", "yes", "on")


def truthy(value: "str | None") -> bool:
    """Whether an environment flag such as ``AUTOALLOC_DISABLE`` is switched on."""
    return value is not None and value.strip().lower() in _TRUE


class Watcher:
    """Meta-path finder that wakes up only for the names in ``names``.

    It starts with ``{"torch"}``; after torch's decision it holds the policy's pending import
    triggers, and it removes itself once there is nothing left to watch. It decides nothing
    itself: it hands back the module's real spec with the loader wrapped (``Loader``), so a
    probe (``importlib.util.find_spec``, a failed ``try: import x``) costs a spec lookup and
    autoalloc acts only when the module really executes.
    """

    autoalloc_watcher = True

    def __init__(self) -> None:
        self.names = {"torch"}
        # The threads inside find_spec now: a thread's own nested lookup (the finders after
        # this one looking for the same name) is not watched again, while another thread's
        # import of torch at that moment still is. `_thread` is built in and always loaded.
        self.busy: set = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        ident = get_ident()
        if ident in self.busy:
            return None
        self.busy.add(ident)
        try:
            spec = self._real_spec(fullname, path, target)
            loader = getattr(spec, "loader", None)
            if hasattr(loader, "exec_module") and not isinstance(loader, Loader):
                spec.loader = Loader(loader)
            return spec
        except Exception as exc:  # never break the host program's import
            _trace(f"internal error at import of {fullname}: {exc!r}")
            return None
        finally:
            self.busy.discard(ident)

    def _real_spec(self, fullname, path, target):
        """The spec the finders after this one give (None: the module does not exist)."""
        meta_path = sys.meta_path
        start = next((i + 1 for i, f in enumerate(meta_path) if f is self), 0)
        for finder in meta_path[start:]:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is not None:
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None

    def invalidate_caches(self) -> None:
        pass


class Loader:
    """A watched module's real loader, wrapped: autoalloc acts when the module executes.

    Right before ``torch`` executes it decides and writes the environment (libc10 has not
    loaded yet); after a module has executed it installs the guards (torch) or applies a
    policy import trigger. Everything else goes to the real loader, which is put back on
    the module and its spec once it has executed. Module-level, so a spec holding it pickles.
    """

    def __init__(self, loader) -> None:
        self.loader = loader

    # Tools test a spec's loader with isinstance (importlib.abc.Loader, SourceFileLoader):
    # isinstance also consults ``__class__``, so the wrapper answers as the loader it wraps,
    # without importing importlib.abc at start-up. ``__reduce__`` keeps pickle on this class.
    @property
    def __class__(self):
        return type(self.__dict__["loader"]) if "loader" in self.__dict__ else Loader

    def __reduce__(self):
        return (Loader, (self.loader,))

    def __getattr__(self, name):
        if name.startswith("__") or "loader" not in self.__dict__:  # pickle's probes
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        imported = set(sys.modules)  # the program's modules, before autoalloc imports its own
        run("before_exec", module, imported)
        self.loader.exec_module(module)
        spec = getattr(module, "__spec__", None)
        if getattr(spec, "loader", None) is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        run("after_exec", module, imported)


def run(step: str, *args) -> None:
    """Call ``autoalloc.hook.<step>``; the decision machinery is imported only now."""
    try:
        from autoalloc import hook

        getattr(hook, step)(*args)
    except Exception as exc:  # never break the host program's import
        _trace(f"internal error in {step}: {exc!r}")


def _trace(message: str) -> None:
    import os

    if truthy(os.environ.get(DEBUG_VAR)):
        try:
            sys.stderr.write(f"autoalloc: {message}\n")
        except Exception:
            pass


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
    """Startup entry point; idempotent, because venvs process ``.pth`` files twice."""
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
        meta_path.insert(0, Watcher())
    except Exception:
        pass
