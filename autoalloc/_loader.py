"""The armed watcher at work: a watched name's real spec, its loader wrapped.

Imported at the first lookup of a watched name, under importlib's global lock, as the
top-level module ``_autoalloc_loader`` (the wheel's copy of this file): importing a module of
the ``autoalloc`` package there could deadlock with another thread's import of it. Nothing
else may import this module by name for the same reason (a thread doing so at the moment
another looks torch up for the first time would hold its module lock while waiting for the
global one). It imports nothing but ``sys``, ``os`` and ``_thread`` (loaded already) until a
watched module executes; then ``autoalloc.hook``.

The start-up module (``_startup``, on ``sys.meta_path``) hands a lookup of a watched name
(``torch``, later the policy's pending import triggers) to ``find_spec`` here, which returns
the spec the finders after the watcher give, its loader wrapped in ``Loader``. A probe
(``importlib.util.find_spec``, a failed ``try: import x``) costs a spec lookup; autoalloc
acts only when the module really executes.
"""

import _thread  # built in, loaded by importlib's bootstrap before site runs
import sys
from _thread import get_ident

_count = getattr(_thread, "_count", None)  # the threads started besides the main one

DEBUG_VAR = "AUTOALLOC_DEBUG"  # its own copy of autoalloc.envvars' name (tests/test_layout.py)

# The threads inside find_spec now: a thread's own nested lookup (the finders after the
# watcher looking for the same name) is not watched again, while another thread's import of
# torch at that moment still is.
_busy: set = set()


def find_spec(watcher, fullname, path=None, target=None):
    """``fullname``'s spec from the finders after ``watcher``, its loader wrapped."""
    ident = get_ident()
    if ident in _busy:
        return None
    _busy.add(ident)
    try:
        spec = _real_spec(watcher, fullname, path, target)
        loader = getattr(spec, "loader", None)
        if hasattr(loader, "exec_module") and not isinstance(loader, Loader):
            spec.loader = Loader(loader)
        return spec
    except Exception as exc:  # never break the host program's import
        _trace(f"internal error at import of {fullname}: {exc!r}")
        return None
    finally:
        _busy.discard(ident)


def _real_spec(watcher, fullname, path, target):
    """The spec the finders after ``watcher`` give (None: the module does not exist)."""
    meta_path = sys.meta_path
    start = next((i + 1 for i, f in enumerate(meta_path) if f is watcher), 0)
    for finder in meta_path[start:]:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is not None:
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
    return None


class Loader:
    """A watched module's real loader, wrapped: autoalloc acts when the module executes.

    Right before ``torch`` executes it decides and writes the environment (libc10 has not
    loaded yet); after a module has executed it installs the guards (torch) or applies a
    policy import trigger. Everything else goes to the real loader, which is put back on
    the module and its spec once it has executed.
    """

    def __init__(self, loader) -> None:
        self.loader = loader

    # Tools test a spec's loader with isinstance (importlib.abc.Loader, SourceFileLoader):
    # isinstance also consults ``__class__``, so the wrapper answers as the loader it wraps,
    # without importing importlib.abc.
    @property
    def __class__(self):
        return type(self.__dict__["loader"]) if "loader" in self.__dict__ else Loader

    def __reduce_ex__(self, protocol):
        # A pickled or copied spec holds the real loader: the wrapper is this process's
        # machinery (and a pickle must load where autoalloc is not installed).
        real = self.__dict__["loader"]
        if isinstance(real, type):  # BuiltinImporter, FrozenImporter: the class itself
            return (tuple.__getitem__, ((real,), 0))
        return real.__reduce_ex__(protocol)

    def __getattr__(self, name):
        if name.startswith("__") or "loader" not in self.__dict__:  # pickle's probes
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        # Another thread of the program may import modules while autoalloc decides: those are
        # the program's too. Looked for only where there is another thread (one C call).
        others = _elsewhere() if _count is None or _count() else None
        imported = set(sys.modules)  # the program's modules, before autoalloc imports its own
        try:
            run("before_exec", module, imported, *(() if others is None else (others.names,)))
        finally:
            if others is not None:
                sys.meta_path = [f for f in sys.meta_path if f is not others]
        self.loader.exec_module(module)
        spec = getattr(module, "__spec__", None)
        if getattr(spec, "loader", None) is self:
            spec.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        run("after_exec", module, imported)


def _elsewhere():
    """A finder put first on ``sys.meta_path`` while autoalloc decides, which finds nothing: its
    ``names`` are those other threads look up meanwhile (their imports, the program's). A
    function, not a class: made only where the process has another thread."""
    ident, names = get_ident(), set()  # the thread that decides

    def find_spec(fullname, path=None, target=None):
        if get_ident() != ident:
            names.add(fullname)
        return None

    find_spec.find_spec, find_spec.names = find_spec, names
    sys.meta_path = [find_spec, *sys.meta_path]  # a new list: another thread may be iterating
    return find_spec


def run(step: str, *args) -> None:
    """Call ``autoalloc.hook.<step>``; the decision machinery is imported only now (no
    import lock is held while a module executes)."""
    try:
        from autoalloc import hook

        getattr(hook, step)(*args)
    except Exception as exc:  # never break the host program's import
        _trace(f"internal error in {step}: {exc!r}")


def _trace(message: str) -> None:
    """One line to stderr under ``AUTOALLOC_DEBUG``; never raises."""
    try:
        import os

        if (os.environ.get(DEBUG_VAR) or "").strip().lower() in ("1", "true", "yes", "on"):
            sys.stderr.write(f"autoalloc: {message}\n")
    except Exception:
        pass
