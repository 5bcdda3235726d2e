"""What the program itself asked for: the run-time evidence of the ``training`` rules.

A name in ``sys.modules`` says only that some code imported it. Libraries import audio and
tokenizer packages for their own reasons (transformers' ``audio_utils`` and datasets' config
import soundfile when it is installed; SpeechBrain imports torchaudio and sentencepiece at its
own import), and lazy packages put stubs for modules whose code never ran (transformers <= 4.51
registers one for every model package). So a module a ``training`` rule names counts only when

- the program's own code asked for it: an import statement in the entry script or in one of
  its own modules (files outside the interpreter's library directories), seen as it happened,
  or a module, class, function or object from it that the program holds (in its own modules'
  globals, in the frames of its own code that built the optimizer, or one level inside a dict,
  list or namespace there: a configuration's objects, such as SpeechBrain's ``hparams``); or
- a lazy package loaded it on use: a module whose parent is a lazy package (transformers'
  model packages) executes only when the program touches one of its classes, directly or
  through an auto class that a checkpoint or configuration chose.

Names are module names, and for what the program holds also ``module.Qualname`` and the
top-level package's public alias ``package.Qualname`` (``transformers.Wav2Vec2ForCTC``), so a
rule can name a class. The functions here are pure: the hook hands them ``sys.modules``, the
frames and the library directories (``scan`` knows which files are the program's own).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from types import FrameType, FunctionType, ModuleType, SimpleNamespace

# which files are the program's own, and the libraries' directories: where its source is read
from autoalloc.scan import is_own_file, local, prefixes

# Bounds, so that a program with huge namespaces costs a bounded look: its first optimizer
# waits for it.
MAX_MODULES = 2000
MAX_NAMES = 5000
MAX_ITEMS = 1000
_CONTAINERS = (dict, list, tuple, SimpleNamespace)



def pending(module: object) -> bool:
    """Whether ``module`` is a stub whose code has not run: ``importlib.util.LazyLoader``'s
    module before its first attribute access."""
    kind = type(module)
    return kind.__name__ == "_LazyModule" and kind.__module__ == "importlib.util"


def lazy_package(module: object) -> bool:
    """A package that loads its submodules when one of its names is first used (transformers'
    ``_LazyModule`` and the like)."""
    return type(module).__name__ == "_LazyModule" and not pending(module)


def executed(name: str, modules: Mapping[str, object]) -> bool:
    """Whether the module ``name`` in ``modules`` is more than a stub: its code ran, and for a
    lazy package below the top level, something was loaded from it."""
    return modules.get(name) is not None and name not in stubs(modules)


def _metadata(name: str) -> bool:
    """A lazy package's ``configuration_*`` module: auto classes' tables read those of models
    nobody uses (``run_clm.py``'s ``AutoModelForCausalLM`` reads Whisper's)."""
    return name.rpartition(".")[2].startswith("configuration")


def stubs(modules: Mapping[str, object]) -> set[str]:
    """The names of ``modules`` that are stubs (``executed`` is false): not imports. One pass
    over ``modules`` (transformers <= 4.51 registers some 300 placeholders)."""
    items = list(modules.items())
    odd = [(name, m) for name, m in items if type(m) is not ModuleType and m is not None]
    if not odd:
        return set()
    used: set[str] = set()  # packages something real was loaded below
    for key, m in items:
        if m is not None and not lazy_package(m) and not pending(m) and not _metadata(key):
            parent = key.rpartition(".")[0]
            while parent and parent not in used:
                used.add(parent)
                parent = parent.rpartition(".")[0]
    return {
        name for name, m in odd
        if pending(m) or (lazy_package(m) and "." in name and name not in used)
    }


def loaded_on_use(modules: Mapping[str, object]) -> dict[str, str]:
    """Module names (with their parent packages) a lazy package loaded because something
    used one of its names, each with the module that shows it."""
    out: dict[str, str] = {}
    for name, module in list(modules.items()):
        parent, dot, _ = name.rpartition(".")
        if not dot or lazy_package(module) or pending(module) or module is None:
            continue
        if _metadata(name):
            continue
        if lazy_package(modules.get(parent)):
            for prefix in prefixes(name):
                out.setdefault(prefix, f"{name} was loaded on use")
    return out


def names_of(value: object) -> Iterator[str]:
    """The names a held value stands for: a module's name; for a class, a function or an
    object, its (or its type's) module, ``module.Qualname`` and ``package.Qualname``.

    Types are tested with ``type()``, never ``isinstance``: that may read ``__class__``, which
    runs a ``LazyLoader`` module's code; and a value's own attributes are never read.
    """
    kind = type(value)
    if issubclass(kind, ModuleType):
        if not pending(value):
            name = value.__dict__.get("__name__")
            if isinstance(name, str):
                yield name
        return
    owner = value if issubclass(kind, (type, FunctionType)) else kind
    try:
        module, qualname = owner.__module__, owner.__qualname__
    except Exception:  # an odd metaclass: nothing to say
        return
    if not isinstance(module, str) or module == "builtins":
        return
    yield module
    if isinstance(qualname, str):
        yield f"{module}.{qualname}"
        top = module.partition(".")[0]
        if top != module:
            yield f"{top}.{qualname}"


def held(namespace: Mapping[str, object]) -> Iterator[str]:
    """The names of what ``namespace`` holds, and one level inside its containers."""
    for count, value in enumerate(list(namespace.values())):
        if count >= MAX_NAMES:
            return
        yield from names_of(value)
        if type(value) in _CONTAINERS:  # exactly: a subclass's own methods could run code
            yield from _inside(value)


def _inside(container: object) -> Iterator[str]:
    """The names of what a plain container holds. Plain types only: a lazy mapping
    (transformers' model tables are OrderedDict subclasses) loads a module per value read."""
    if type(container) is SimpleNamespace:
        container = container.__dict__
    items = list(container.values() if type(container) is dict else container)  # type: ignore
    for item in items[:MAX_ITEMS]:
        if type(item) not in (str, int, float, bool, type(None)):
            yield from names_of(item)


class Own:
    """Which code is the program's own: files outside the library directories, and the
    modules of its entry point's package wherever that is installed (``python -m
    mypkg.train``, a console script's package); never ``skip`` (autoalloc's files)."""

    __slots__ = ("libraries", "packages", "skip")

    def __init__(
        self, libraries: tuple[str, ...], skip: tuple[str, ...] = (),
        packages: frozenset[str] = frozenset(),
    ) -> None:
        self.libraries, self.skip, self.packages = libraries, skip, packages

    def code(self, path: object, module: object = None) -> bool:
        """Whether the code of file ``path`` (module ``module``) is the program's own."""
        if isinstance(path, str) and path.startswith(self.skip):
            return False
        if isinstance(module, str) and module.partition(".")[0] in self.packages:
            return True
        if module == "__main__" and isinstance(path, str) and path.startswith("<"):
            return True  # the program's own text: python -c, stdin, a REPL or notebook cell
        return is_own_file(path, self.libraries)


def asked(
    modules: Mapping[str, object], frames: Iterable[FrameType], own: Own
) -> dict[str, str]:
    """Names the program's own code holds, with where: its frames first (the code that built
    the optimizer), then its own modules' globals."""
    out: dict[str, str] = {}
    for frame in frames:
        path = frame.f_code.co_filename
        if own.code(path, frame.f_globals.get("__name__")):
            where = f"{path}:{frame.f_lineno}"
            for name in held(frame.f_locals):
                out.setdefault(name, where)
    for count, module in enumerate(_own_modules(modules, own)):
        if count >= MAX_MODULES:
            break
        path = module.__dict__.get("__file__")
        where = path if isinstance(path, str) else "__main__"
        for name in held(module.__dict__):
            out.setdefault(name, where)
    return out


def _own_modules(modules: Mapping[str, object], own: Own) -> Iterator[ModuleType]:
    """The program's own modules that have executed, ``__main__`` first."""
    main = modules.get("__main__")
    seen = set()
    for module in (main, *list(modules.values())):
        if module is None or id(module) in seen or pending(module):
            continue  # reading a LazyLoader module's attributes would run its code
        if not issubclass(type(module), ModuleType):
            continue
        seen.add(id(module))
        path, name = module.__dict__.get("__file__"), module.__dict__.get("__name__")
        if (module is main and not (isinstance(path, str) and path.startswith(own.skip))) or \
                own.code(path, name):
            yield module


def own_files(
    modules: Mapping[str, object], own: Own, frames: Iterable[FrameType] = ()
) -> dict[str, dict]:
    """The files of the program's own modules that have executed (``__main__`` first) and of
    its own code in ``frames`` (a ``<...>`` name for text: ``-c``, a notebook cell), each with
    its globals (whose loader reads a zipped one)."""
    out: dict[str, dict] = {}
    for module in _own_modules(modules, own):
        path = module.__dict__.get("__file__")
        if isinstance(path, str):
            out.setdefault(path, module.__dict__)
    for frame in frames:
        path = frame.f_code.co_filename
        if own.code(path, frame.f_globals.get("__name__")):
            out.setdefault(path, frame.f_globals)
    return out


def own_named(names: Iterable[str], modules: Mapping[str, object], entry: object) -> set[str]:
    """Of ``names``, those whose top-level module is the program's own, not the library of the
    same name: a module file that lies in the script's folder or the working directory (an
    own ``tgt.py`` is not the TextGrid library). A package there may be a library's copy."""
    where = {os.path.dirname(getattr(entry, "path", "") or "")}
    try:
        where.add(os.getcwd())
    except OSError:
        pass
    out = set()
    for name in names:
        module = modules.get(name.partition(".")[0])
        if issubclass(type(module), ModuleType) and not pending(module):
            path = module.__dict__.get("__file__")
            if isinstance(path, str) and local(path) in where:
                out.add(name)
    return out


def attributes(names: Iterable[str], modules: Mapping[str, object]) -> set[str]:
    """Of ``names``, those inside a loaded module that are not modules themselves
    (``torch.nn.CTCLoss``, ``evaluate.load:wer``): what only the program's code shows."""
    out = set()
    for name in names:
        parent = name.partition(":")[0].rpartition(".")[0]
        if name not in modules and parent and type(modules.get(parent)) is ModuleType:
            out.add(name)
    return out


def entry_packages(kind: str, target: str, main: object) -> frozenset[str]:
    """The program's own top-level packages by its entry point: a ``-m`` module's, and for a
    console script those of the functions its ``__main__`` holds (``from mypkg.cli import
    main``), but the standard library's."""
    import sys

    if kind == "module":
        return frozenset({target.partition(".")[0]})
    if kind != "command" or not issubclass(type(main), ModuleType) or pending(main):
        return frozenset()
    tops = set()
    for value in list(main.__dict__.values()):
        if type(value) is FunctionType and isinstance(value.__module__, str):
            tops.add(value.__module__.partition(".")[0])
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    return frozenset(t for t in tops if t not in stdlib and t not in ("__main__", "builtins"))


def supported(
    candidates: Iterable[str], said: Mapping[str, str], used: Mapping[str, str]
) -> dict[str, str]:
    """The candidate names with evidence, and the evidence: the program holds the name or
    something inside it, or a lazy package loaded it on use."""
    held_below: dict[str, str] = {}
    for name, where in said.items():
        for prefix in prefixes(name):
            held_below.setdefault(prefix, f"{name} ({where})" if prefix != name else where)
    out = {}
    for name in candidates:
        why = held_below.get(name) or used.get(name)
        if why is not None:
            out[name] = why
    return out
