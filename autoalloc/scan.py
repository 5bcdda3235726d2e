"""Read a program's own source, never run it: what it imports, uses and builds.

The decision at ``import torch`` reads it (an own script that shows speech-to-text training
gets the option before torch starts), the first optimizer reads it for what the run cannot
show, and ``autoalloc explain`` predicts from it. It parses (``ast``) the entry script and the
modules of its own that it imports (files found beside it or in the working directory, never
installed libraries), and the YAML files the command line or the source names, within a
budget of files and bytes (never the clock: a loaded machine reads what an idle one does).
It finds:

- the modules the program imports, with the line of each (``from x import Class`` also gives
  ``x.Class``, and a Hugging Face speech model class its model package, as the run-time
  evidence names it once the class is used); a module of the program's own is not a library
  of the same name;
- what it uses of them, among the names asked for (``wanted``: the policy's): ``nn.CTCLoss``
  read as ``torch.nn.CTCLoss``, and a call with a literal first argument as ``name:arg``
  (``evaluate.load("wer")`` is ``evaluate.load:wer``);
- the classes and functions a YAML configuration names (``!new:``, ``!name:``, ``_target_:``);
- where the program builds an optimizer: ``torch.optim.*``, a Lightning ``.fit``, an HF
  ``Trainer``, ``deepspeed.initialize``, SpeechBrain's ``Brain.fit``; and whether the entry
  script itself does (``builds_here``), not only a module it imports;
- what the source cannot tell: a module named at run time (``importlib.import_module(name)``),
  a class a checkpoint or configuration chooses (``AutoModelFor*``, ``hydra.utils.instantiate``);
- what it did not read, and why (``unread``).

Which files are the program's own (``is_own_file``: outside the interpreter's library
directories, ``installed_dirs``) is decided here, for the reading and for ``evidence``.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import field

from autoalloc.records import record

MAX_FILES = 200
MAX_BYTES = 1 << 20  # a file larger than this is not read
MAX_TOTAL = 2 << 20  # nor any file once this much has been read

# Hugging Face speech model classes -> their model package (longest prefix first).
HF_MODELS = (
    ("Wav2Vec2Conformer", "wav2vec2_conformer"), ("Wav2Vec2Bert", "wav2vec2_bert"),
    ("Wav2Vec2", "wav2vec2"), ("WavLM", "wavlm"), ("Hubert", "hubert"), ("Whisper", "whisper"),
    ("Speech2Text", "speech_to_text"), ("SpeechEncoderDecoder", "speech_encoder_decoder"),
    ("SeamlessM4Tv2", "seamless_m4t_v2"), ("SeamlessM4T", "seamless_m4t"),
    ("Qwen2Audio", "qwen2_audio"), ("SpeechT5", "speecht5"), ("Data2VecAudio", "data2vec"),
    ("UniSpeechSat", "unispeech_sat"), ("UniSpeech", "unispeech"), ("SEWD", "sew_d"),
    ("SEW", "sew"), ("AST", "audio_spectrogram_transformer"), ("Clap", "clap"),
    ("Encodec", "encodec"),
)  # fmt: skip
OPTIMIZERS = frozenset(
    "Adam AdamW SGD Adagrad Adadelta Adamax ASGD LBFGS NAdam RAdam RMSprop Rprop SparseAdam "
    "Adafactor Muon".split()
)
TRAINERS = frozenset({"Trainer", "Seq2SeqTrainer", "SFTTrainer"})  # HF, TRL: build AdamW
# .fit() trains with these (coqui-tts's Trainer is the `trainer` package)
FIT_LIBRARIES = ("lightning", "pytorch_lightning", "speechbrain", "nemo", "trainer", "TTS")
_IMPORTERS = ("importlib.import_module", "__import__")
# compiled on first use (re keeps them): most processes read no YAML
_CONFIG_RE = r"(?:!(?:new|name|apply|module):|_target_:\s*['\"]?)([A-Za-z_][\w.]*)"
_YAML_RE = r"[\w./-]+\.ya?ml\Z"


@record(frozen=True)
class Scan:
    """What a program's own source says (``names``: module, class or use -> file:line)."""

    script: str
    names: dict[str, str] = field(default_factory=dict)
    optimizer: str | None = None  # "torch.optim.AdamW at own.py:42"
    builds_here: bool = False  # the entry script itself builds it (or runs a trainer's fit)
    unknown: tuple[str, ...] = ()  # what only the run can tell, each with where
    files: tuple[str, ...] = ()  # own Python files read
    configs: tuple[str, ...] = ()  # YAML files read
    unread: tuple[str, ...] = ()  # own files not read: "path (why)"
    uses: tuple[str, ...] = ()  # of the names, those its code uses (not imports)
    own: tuple[str, ...] = ()  # top-level names that are its own modules, beside it or in cwd

    @property
    def complete(self) -> bool:
        """Whether every own file it came to was read."""
        return not self.unread

    def imported(self, libraries: Container[str] = ()) -> frozenset[str]:
        """The names with their parent packages, as the decision counts them; of
        ``libraries`` (names of libraries), not those its own modules of that name stand for."""
        found = frozenset(p for name in self.names for p in prefixes(name))
        if not self.own or not libraries:
            return found
        return frozenset(n for n in found
                         if n.partition(".")[0] not in self.own or n not in libraries)

    def where(self, name: str) -> str:
        """Where the source shows ``name`` (or a name inside it): ``file:line``."""
        if name in self.names:
            return self.names[name]
        return next(w for n, w in self.names.items() if n.startswith(name + "."))


def scan(
    script: str, args: Sequence[str], cwd: str, libraries: tuple[str, ...],
    wanted: Iterable[str] = (),
) -> Scan:
    """Read ``script`` and its own modules; ``FileNotFoundError`` if it does not exist."""
    if not os.path.isfile(script):
        raise FileNotFoundError(script)
    script = os.path.abspath(script)
    reader = _Reader(roots(script, cwd, libraries), libraries, frozenset(wanted))
    reader.here = {os.path.dirname(script), os.path.abspath(cwd)}
    reader.read(script)
    for path in _yaml_files(args, cwd, reader.strings):
        reader.config(path)
    return Scan(script, reader.names, reader.optimizer, reader.builds_here,
                tuple(dict.fromkeys(reader.unknown)), tuple(reader.done), tuple(reader.configs),
                tuple(dict.fromkeys(reader.unread)), tuple(reader.uses), tuple(reader.own))


def cached(
    script: str, args: Sequence[str], cwd: str, libraries: Callable[[], tuple[str, ...]],
    wanted: frozenset[str],
) -> Scan:
    """``scan``, remembered across processes by the layer cache where the hook enabled it: used
    again while each file it read or passed over is as it was (size, time, inode). Only an
    edit brings a new import, so files it did not find are not watched. The interpreter's
    ``libraries`` are asked for only to read: an entry is this environment's already."""
    from autoalloc import layercache

    script, kept = os.path.abspath(script), (Scan,)
    data = (tuple(_yaml_files(args, cwd, ())), tuple(sorted(wanted)))
    hit = layercache.get("scan", (script, cwd), data, kept)
    if type(hit) is tuple and len(hit) == 3 and type(hit[2]) is Scan and _stamps(hit[0]) == hit[1]:
        return hit[2]
    found = scan(script, args, cwd, libraries(), wanted)
    paths = (*found.files, *found.configs, *(u.rpartition(" (")[0] for u in found.unread))
    layercache.put("scan", (script, cwd), data, (paths, _stamps(paths), found))
    return found


def _stamps(paths: Iterable[str]) -> tuple:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


_CHECKOUT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def roots(script: str, cwd: str, libraries: tuple[str, ...]) -> tuple[str, ...]:
    """Where the program's own modules are imported from: the script's folder, the working
    directory, the checkout's root above the script (and its ``src``), and the own folders
    on ``sys.path`` (editable installs)."""
    import sys

    found = [os.path.dirname(script), cwd]
    here = os.path.dirname(script)
    for _ in range(12):
        if any(os.path.exists(os.path.join(here, m)) for m in _CHECKOUT_MARKERS):
            found += [here, os.path.join(here, "src")]
            break
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    found += [p for p in sys.path if p and is_own_file(os.path.join(p, "x.py"), libraries)]
    return tuple(r for r in dict.fromkeys(found) if os.path.isdir(r))


def _yaml_files(args: Sequence[str], cwd: str, strings: Iterable[tuple[str, str]]) -> list[str]:
    """YAML files the command line names, and those the source names by a literal path."""
    found = []
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg
        if value.endswith((".yaml", ".yml")) and re.search(_YAML_RE, value):
            found.append(os.path.join(cwd, value))
    for text, base in strings:
        if re.search(_YAML_RE, text):
            found += [os.path.join(base, text), os.path.join(cwd, text)]
    return [p for p in dict.fromkeys(found) if os.path.isfile(p)]


class _Budget:
    """Files and bytes left to read; each file refused says why (``unread``)."""

    def __init__(self) -> None:
        self.files, self.bytes = MAX_FILES, MAX_TOTAL
        self.unread: list[str] = []

    def source(self, path: str, module: object = None) -> bytes | None:
        """The bytes of ``path`` if the budget allows, else None (and why, in ``unread``).
        What is not a plain file is ``module``'s text (a string) or is read by ``linecache``
        through the loader of ``module`` (its globals: a module of a zip archive; a notebook
        cell, which its kernel left in ``linecache``)."""
        try:
            text = None if os.path.isfile(path) else _text(path, module)
            size = os.path.getsize(path) if text is None else len(text)
            if self.files <= 0 or size > min(MAX_BYTES, self.bytes):
                why = ("larger than 1 MiB" if size > MAX_BYTES else
                       "over the budget of files" if self.files <= 0 else "over the 2 MiB read")
                self.unread.append(f"{path} ({why})")
                return None
            if text is None:
                with open(path, "rb") as f:
                    data = f.read(size + 1)
            else:
                data = text.encode("utf-8", "surrogateescape")
        except OSError as exc:
            self.unread.append(f"{path} ({exc.strerror or 'unreadable'})")
            return None
        self.files, self.bytes = self.files - 1, self.bytes - len(data)
        return data

    def parse(self, path: str, module: object = None) -> ast.AST | None:
        data = self.source(path, module)
        if data is None:
            return None
        try:
            return ast.parse(data, path)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            self.unread.append(f"{path} (cannot be parsed: {type(exc).__name__})")
            return None


class _Reader(_Budget):
    """Walks the program's own files from the entry script, breadth first."""

    def __init__(
        self, roots: tuple[str, ...], libraries: tuple[str, ...], wanted: frozenset[str],
        show: Callable[[str], str] = os.path.basename,
    ) -> None:
        super().__init__()
        self.roots, self.libraries, self.wanted, self.show = roots, libraries, wanted, show
        self.names: dict[str, str] = {}
        self.optimizer: str | None = None
        self.builds_here = False
        self.unknown: list[str] = []
        self.done: list[str] = []
        self.configs: list[str] = []
        self.strings: list[tuple[str, str]] = []
        self.trainers: set[str] = set()  # the program's own trainer classes
        self.uses: dict[str, None] = {}
        self.own: dict[str, None] = {}  # top-level names of its own modules in ``here``
        self.here: set[str] = set()

    def read(self, first: str) -> None:
        queue, seen = [first], set()
        while queue:
            path = queue.pop(0)
            if path in seen:
                continue
            seen.add(path)
            tree = self.parse(path)
            if tree is not None:
                self.done.append(path)
                queue += self._visit(tree, path, entry=path == first)

    def _visit(self, tree: ast.AST, path: str, entry: bool) -> list[str]:
        """Record what the file imports, uses and does; the own files it imports, to read next.

        The entry script's imports count wherever they are; another own module's, at module
        level only (a function's import runs only if it is called), though the own modules
        its functions import are read too (a factory importing the model it builds)."""
        where = self.show(path)
        bound: dict[str, str] = {}  # local name -> what it stands for
        top = _module_level(tree)
        own: list[str] = []
        for node in ast.walk(tree):
            line = f"{where}:{getattr(node, 'lineno', 0)}"
            for name, alias in _imported(node):
                if alias:
                    bound[alias] = name
                files = self._own_files(name, path)
                if files and local(files[0]) in self.here:
                    self.own.setdefault(name.partition(".")[0])
                if entry or node in top:
                    self._add(name, line)
                own += files
            own += _relative_files(node, path)
            if isinstance(node, ast.Attribute) and self.wanted:
                used = _dotted(node, bound)
                if used in self.wanted:
                    self._use(used, line)
            self._note_class(node, bound)
            if self._note_call(node, bound, line) and entry:
                self.builds_here = True
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.strings.append((node.value, os.path.dirname(path)))
        return own

    def _note_class(self, node: ast.AST, bound: dict[str, str]) -> None:
        """A class of the program's that subclasses an HF/TRL trainer is a trainer too."""
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                called = _dotted(base, bound) or ""
                hf = called.startswith(("transformers.", "trl."))
                if (hf and called.rpartition(".")[2] in TRAINERS) or called in self.trainers:
                    self.trainers.add(node.name)
                    bound.setdefault(node.name, node.name)

    def _add(self, name: str, where: str) -> None:
        self.names.setdefault(name, where)
        top, _, rest = name.partition(".")
        if top == "transformers" and rest:
            model = hf_model(rest.rpartition(".")[2])
            if model:
                self.names.setdefault(f"transformers.models.{model}", where)
            if rest.rpartition(".")[2].startswith(("AutoModel", "AutoProcessor", "pipeline")):
                self.unknown.append(f"{name} at {where} (the checkpoint chooses the model)")

    def _note_call(self, node: ast.AST, bound: dict[str, str], where: str) -> bool:
        """Note what a call does; whether it builds an optimizer."""
        if not isinstance(node, ast.Call):
            return False
        if _getattr_of(node.func, bound) == "torch.optim":  # getattr(torch.optim, name)(...)
            return self._optimizer(f"getattr(torch.optim, ...) at {where}")
        called = _dotted(node.func, bound)
        if called is None:
            return False
        last, literal = called.rpartition(".")[2], _literal_args(node)
        if last in OPTIMIZERS and ("optim" in called or called == bound.get(last)):
            return self._optimizer(f"{called} at {where}")
        if (last in TRAINERS and called.startswith(("transformers", "trl"))) or \
                called in self.trainers:
            return self._optimizer(f"{called} at {where} (it builds the optimizer)")
        if called == "deepspeed.initialize":
            return self._optimizer(f"deepspeed.initialize at {where}")
        if last == "fit" and any(v.startswith(FIT_LIBRARIES) for v in bound.values()):
            return self._optimizer(f".fit() at {where} (the trainer builds the optimizer)")
        if called in _IMPORTERS or _passes_importer(node, bound):
            if not literal:
                self.unknown.append(f"{called}(...) at {where} (a module named at run time)")
            for name in literal:
                self._add(name, where)
        elif called.endswith("instantiate") and "hydra" in called:
            self.unknown.append(f"{called} at {where} (the configuration chooses the class)")
        elif literal and f"{called}:{literal[0]}" in self.wanted:
            self._use(f"{called}:{literal[0]}", where)
        return False

    def _use(self, name: str, where: str) -> None:
        self.names.setdefault(name, where)
        self.uses.setdefault(name)

    def _optimizer(self, text: str) -> bool:
        if self.optimizer is None:
            self.optimizer = text
        return True

    def _own_files(self, name: str, importer: str) -> list[str]:
        """The program's own files that importing ``name`` runs (packages first)."""
        parts = name.split(".")
        found = []
        for root in (os.path.dirname(importer), *self.roots):
            for i in range(1, len(parts) + 1):
                base = os.path.join(root, *parts[:i])
                for path in (base + ".py", os.path.join(base, "__init__.py")):
                    if os.path.isfile(path) and is_own_file(path, self.libraries):
                        found.append(path)
            if found:
                return found
        return found

    def config(self, path: str) -> None:
        """Names a YAML configuration instantiates or refers to."""
        data = self.source(path)
        if data is None:
            return
        self.configs.append(path)
        where = os.path.basename(path)
        for number, text in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            for match in re.finditer(_CONFIG_RE, text):
                name = match.group(1)
                self._add(name, f"{where}:{number}")
                module, _, qualname = name.rpartition(".")
                if "." in module and qualname[:1].isupper():  # the package's public name
                    self.names.setdefault(f"{module.partition('.')[0]}.{qualname}",
                                          f"{where}:{number}")


def named_in(
    paths: Iterable[str], wanted: Iterable[str], modules: Mapping[str, object] | None = None
) -> dict[str, str]:
    """Which of ``wanted`` the files ``paths`` import (itself or a module inside it) or use,
    each with the first path:line: the run-time evidence for what the program imported
    before ``import torch`` (when the watcher was not yet there to see it), and for what its
    code uses. What is not a plain file is read from ``modules`` (file -> its source text, or
    its module's globals: ``_Budget.source``)."""
    left, found = set(wanted), {}
    reader = _Reader((), (), frozenset(left), show=str)
    for path in dict.fromkeys(paths):
        if not left:
            break
        reader.names = {}
        tree = reader.parse(path, (modules or {}).get(path))
        if tree is None:
            continue
        reader._visit(tree, path, entry=True)  # each read as an entry: its imports all count
        for name, where in reader.names.items():
            hit = next((w for w in prefixes(name) if w in left), None)
            if hit is not None:
                found[hit] = where
                left.discard(hit)
    return found


def _text(path: str, module: object) -> str:
    """The source of what is not a plain file: ``module`` itself when it is text, else what
    ``linecache`` finds through the loader of ``module``'s globals."""
    import linecache

    if isinstance(module, str):
        return module
    return "".join(linecache.getlines(path, module if isinstance(module, dict) else None))


def library_dirs(paths: Iterable[str]) -> tuple[str, ...]:
    """The directories of installed code (stdlib, site-packages), each ending in a separator."""
    out = []
    for path in paths:
        if path:
            path = os.path.normpath(path)
            out.append(path if path.endswith(os.sep) else path + os.sep)
    return tuple(dict.fromkeys(out))


@functools.lru_cache(maxsize=1)
def installed_dirs() -> tuple[str, ...]:
    """This interpreter's library directories: its standard library and site-packages (the
    one function that reads the interpreter's configuration). As ``sysconfig`` names
    them, without it: the decision at ``import torch`` asks, and sysconfig costs 10 M
    instructions there."""
    import site
    import sys

    version = "python{}.{}".format(*sys.version_info[:2])
    paths = [os.path.dirname(os.__file__)]  # the standard library, where os lies
    paths += [os.path.join(p, "Lib") if os.name == "nt" else os.path.join(p, "lib", version)
              for p in (sys.prefix, sys.exec_prefix)]  # platstdlib, a venv's own lib too
    paths += getattr(site, "getsitepackages", list)()
    paths.append(getattr(site, "getusersitepackages", str)())
    return library_dirs(paths)


def is_own_file(path: object, libraries: tuple[str, ...]) -> bool:
    """Whether ``path`` is the program's own code: a real file outside every library directory
    and outside any ``site-packages`` or ``dist-packages`` folder."""
    if not isinstance(path, str) or not path or path.startswith("<"):
        return False
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not path.startswith(libraries)


def local(path: str) -> str | None:
    """The folder a module file is imported from; None for a package (a library's copy may
    be one: only a module file is surely the program's own)."""
    if os.path.basename(path) == "__init__.py":
        return None
    return os.path.dirname(os.path.abspath(path))


def prefixes(name: str) -> Iterator[str]:
    """``a``, ``a.b``, ``a.b.c`` for ``a.b.c``."""
    at = name.find(".")
    while at != -1:
        yield name[:at]
        at = name.find(".", at + 1)
    yield name


def hf_model(class_name: str) -> str | None:
    """The Hugging Face model package of a speech model class (``WhisperProcessor``)."""
    for prefix, model in HF_MODELS:
        if class_name.startswith(prefix) and class_name[len(prefix):len(prefix) + 1].isupper():
            return model
    return None


def _imported(node: ast.AST) -> Iterator[tuple[str, str | None]]:
    """(dotted name, the local name it binds or None) for each name an absolute import
    statement names (a relative import names the program's own modules: ``_relative_files``
    follows it). ``from a.b import c`` binds ``c`` alone, ``import a.b`` binds ``a``."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                yield alias.name, alias.asname
            else:
                top = alias.name.partition(".")[0]
                yield alias.name, top if top == alias.name else None
                if top != alias.name:
                    yield top, top
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        yield node.module, None
        for alias in node.names:
            if alias.name != "*":
                yield f"{node.module}.{alias.name}", alias.asname or alias.name


def _module_level(tree: ast.AST) -> set[ast.AST]:
    """The statements that run when the module is imported: its body, and inside ``if``,
    ``try`` and ``with`` blocks there."""
    out: set[ast.AST] = set()
    todo = list(getattr(tree, "body", []))
    while todo:
        node = todo.pop()
        out.add(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for key in ("body", "orelse", "finalbody"):
                todo += getattr(node, key, [])
            for handler in getattr(node, "handlers", []):
                todo += handler.body
    return out


def _getattr_of(func: ast.AST, bound: dict[str, str]) -> str | None:
    """``x.y`` for a call of ``getattr(x.y, ...)`` (the callee of ``getattr(...)(...)``)."""
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.args:
        if func.func.id == "getattr":
            return _dotted(func.args[0], bound)
    return None


def _passes_importer(call: ast.Call, bound: dict[str, str]) -> bool:
    """A call handing ``importlib.import_module`` to something that calls it
    (``Thread(target=importlib.import_module, args=("soundfile",))``)."""
    values = [*call.args, *(k.value for k in call.keywords)]
    return any(_dotted(v, bound) in _IMPORTERS for v in values)


def _literal_args(call: ast.Call) -> tuple[str, ...]:
    """The literal strings a call passes first, or in an ``args=(...)`` tuple it passes on."""
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return (first.value,)
    for keyword in call.keywords:
        if keyword.arg == "args" and isinstance(keyword.value, (ast.Tuple, ast.List)):
            items = keyword.value.elts
            return tuple(i.value for i in items[:1] if isinstance(i, ast.Constant)
                         and isinstance(i.value, str))  # fmt: skip
    return ()


def _relative_files(node: ast.AST, path: str) -> list[str]:
    """The files a relative import (``from .data import x``) runs."""
    if not isinstance(node, ast.ImportFrom) or not node.level:
        return []
    base = os.path.dirname(path)
    for _ in range(node.level - 1):
        base = os.path.dirname(base)
    parts = (node.module or "").split(".") if node.module else []
    found = []
    for i in range(len(parts) + 1):
        here = os.path.join(base, *parts[:i])
        found.append(os.path.join(here, "__init__.py"))
    if parts:
        found.append(os.path.join(base, *parts) + ".py")
    found += [os.path.join(base, *parts, a.name) + ".py" for a in node.names]
    return [f for f in found if os.path.isfile(f)]


def _dotted(func: ast.AST, bound: dict[str, str]) -> str | None:
    """``a.b.c`` for ``a.b.c`` (a call's callee, an attribute), with ``a`` replaced by what it
    was imported as."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    head = bound.get(func.id, func.id)
    return ".".join([head, *reversed(parts)])
