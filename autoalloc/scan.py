"""Read a program's own source, never run it: what the run-time evidence is likely to see.

``autoalloc explain`` predicts the decision a program gets at its first optimizer from this.
It parses (``ast``) the entry script and the modules of its own that it imports (files found
beside it or in the working directory, never installed libraries), and the YAML files the
command line or the source names, within a small budget of files and time. It finds:

- the modules the program imports, with the line of each (``from x import Class`` also gives
  ``x.Class``, and a Hugging Face speech model class its model package, as the run-time
  evidence names it once the class is used);
- the classes and functions a YAML configuration names (``!new:``, ``!name:``, ``_target_:``);
- where the program builds an optimizer: ``torch.optim.*``, a Lightning
  ``configure_optimizers`` or ``.fit``, an HF ``Trainer``, ``deepspeed.initialize``,
  SpeechBrain's ``Brain.fit``;
- what the source cannot tell: a module named at run time (``importlib.import_module(name)``),
  a class a checkpoint or configuration chooses (``AutoModelFor*``, ``hydra.utils.instantiate``).
"""

from __future__ import annotations

import ast
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import field

from autoalloc.evidence import is_own_file, prefixes
from autoalloc.records import record

MAX_FILES = 200
MAX_BYTES = 2 << 20  # a file larger than this is not read
BUDGET_S = 1.0

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
_CONFIG_RE = re.compile(r"(?:!(?:new|name|apply|module):|_target_:\s*['\"]?)([A-Za-z_][\w.]*)")
_YAML_RE = re.compile(r"[\w./-]+\.ya?ml\Z")


@record(frozen=True)
class Scan:
    """What a program's own source says (``names``: module or class name -> file:line)."""

    script: str
    names: dict[str, str] = field(default_factory=dict)
    optimizer: str | None = None  # "torch.optim.AdamW at own.py:42"
    unknown: tuple[str, ...] = ()  # what only the run can tell, each with where
    files: tuple[str, ...] = ()  # own Python files read
    configs: tuple[str, ...] = ()  # YAML files read
    complete: bool = True  # false: the file or time budget ran out

    def imported(self) -> frozenset[str]:
        """The names with their parent packages, as the decision counts them."""
        return frozenset(p for name in self.names for p in prefixes(name))


def scan(
    script: str, args: Sequence[str], cwd: str, libraries: tuple[str, ...],
    budget_s: float = BUDGET_S,
) -> Scan:
    """Read ``script`` and its own modules; ``FileNotFoundError`` if it does not exist."""
    if not os.path.isfile(script):
        raise FileNotFoundError(script)
    roots = _roots(os.path.abspath(script), cwd, libraries)
    reader = _Reader(roots, libraries, time.monotonic() + budget_s)
    reader.read(os.path.abspath(script))
    for path in _yaml_files(args, cwd, reader.strings):
        reader.config(path)
    return Scan(script, reader.names, reader.optimizer, tuple(dict.fromkeys(reader.unknown)),
                tuple(reader.done), tuple(reader.configs), reader.complete)


_CHECKOUT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def _roots(script: str, cwd: str, libraries: tuple[str, ...]) -> tuple[str, ...]:
    """Where the program's own modules are imported from: the script's folder, the working
    directory, the checkout's root above the script (and its ``src``), and the own folders
    on ``sys.path`` (editable installs)."""
    import sys

    roots = [os.path.dirname(script), cwd]
    here = os.path.dirname(script)
    for _ in range(12):
        if any(os.path.exists(os.path.join(here, m)) for m in _CHECKOUT_MARKERS):
            roots += [here, os.path.join(here, "src")]
            break
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    roots += [p for p in sys.path if p and is_own_file(os.path.join(p, "x.py"), libraries)]
    return tuple(r for r in dict.fromkeys(roots) if os.path.isdir(r))


def _yaml_files(args: Sequence[str], cwd: str, strings: Iterable[tuple[str, str]]) -> list[str]:
    """YAML files the command line names, and those the source names by a literal path."""
    found = []
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg
        if _YAML_RE.search(value):
            found.append(os.path.join(cwd, value))
    for text, base in strings:
        if _YAML_RE.search(text):
            found += [os.path.join(base, text), os.path.join(cwd, text)]
    return [p for p in dict.fromkeys(found) if os.path.isfile(p)]


class _Reader:
    """Walks the program's own files from the entry script, breadth first."""

    def __init__(self, roots: tuple[str, ...], libraries: tuple[str, ...], deadline: float):
        self.roots, self.libraries, self.deadline = roots, libraries, deadline
        self.names: dict[str, str] = {}
        self.optimizer: str | None = None
        self.unknown: list[str] = []
        self.done: list[str] = []
        self.configs: list[str] = []
        self.strings: list[tuple[str, str]] = []
        self.trainers: set[str] = set()  # the program's own trainer classes
        self.complete = True

    def _budget(self) -> bool:
        if len(self.done) >= MAX_FILES or time.monotonic() > self.deadline:
            self.complete = False
        return self.complete

    def read(self, first: str) -> None:
        queue = [first]
        while queue:
            path = queue.pop(0)
            if path in self.done or not self._budget():
                continue
            self.done.append(path)
            tree = _parse(path)
            if tree is not None:
                queue += self._visit(tree, path)

    def _visit(self, tree: ast.AST, path: str) -> list[str]:
        """Record what the file imports and does; the own files it imports, to read next.

        The entry script's imports count wherever they are; another own module's, at module
        level only (a function's import runs only if it is called), though the own modules
        its functions import are read too (a factory importing the model it builds)."""
        where, entry = os.path.basename(path), not self.done[1:]
        bound: dict[str, str] = {}  # local name -> what it stands for
        top = _module_level(tree)
        own: list[str] = []
        for node in ast.walk(tree):
            line = f"{where}:{getattr(node, 'lineno', 0)}"
            for name, alias in _imported(node):
                if alias:
                    bound[alias] = name
                if entry or node in top:
                    self._add(name, line)
                own += self._own_files(name, path)
            own += _relative_files(node, path)
            self._note_class(node, bound)
            self._note_call(node, bound, line)
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

    def _note_call(self, node: ast.AST, bound: dict[str, str], where: str) -> None:
        if not isinstance(node, ast.Call):
            return
        if _getattr_of(node.func, bound) == "torch.optim":  # getattr(torch.optim, name)(...)
            self._optimizer(f"getattr(torch.optim, ...) at {where}")
            return
        called = _dotted(node.func, bound)
        if called is None:
            return
        last = called.rpartition(".")[2]
        if last in OPTIMIZERS and ("optim" in called or called == bound.get(last)):
            self._optimizer(f"{called} at {where}")
        elif (last in TRAINERS and called.startswith(("transformers", "trl"))) or \
                called in self.trainers:
            self._optimizer(f"{called} at {where} (it builds the optimizer)")
        elif called in ("deepspeed.initialize",):
            self._optimizer(f"deepspeed.initialize at {where}")
        elif last == "fit" and any(v.startswith(FIT_LIBRARIES) for v in bound.values()):
            self._optimizer(f".fit() at {where} (the trainer builds the optimizer)")
        elif called in ("importlib.import_module", "__import__") and not _constant_arg(node):
            self.unknown.append(f"{called}(...) at {where} (a module named at run time)")
        elif called.endswith("instantiate") and "hydra" in called:
            self.unknown.append(f"{called} at {where} (the configuration chooses the class)")
        elif called in ("importlib.import_module", "__import__"):
            self._add(_constant_arg(node) or "", where)

    def _optimizer(self, text: str) -> None:
        if self.optimizer is None:
            self.optimizer = text

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
        try:
            if os.path.getsize(path) > MAX_BYTES:
                return
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        self.configs.append(path)
        where = os.path.basename(path)
        for number, text in enumerate(lines, 1):
            for match in _CONFIG_RE.finditer(text):
                name = match.group(1)
                self._add(name, f"{where}:{number}")
                module, _, qualname = name.rpartition(".")
                if "." in module and qualname[:1].isupper():  # the package's public name
                    self.names.setdefault(f"{module.partition('.')[0]}.{qualname}",
                                          f"{where}:{number}")


def imports_in(
    paths: Iterable[str], wanted: Iterable[str], budget_s: float = 0.2
) -> dict[str, str]:
    """Which of ``wanted`` the import statements of ``paths`` name (itself or a module inside
    it), each with the first file:line: the run-time evidence for a module the program imported
    before ``import torch``, when the watcher was not yet there to see it."""
    left, found = set(wanted), {}
    deadline = time.monotonic() + budget_s
    for count, path in enumerate(dict.fromkeys(paths)):
        if not left or count >= MAX_FILES or time.monotonic() > deadline:
            break
        tree = _parse(path)
        for node in ast.walk(tree) if tree is not None else ():
            for name, _ in _imported(node):
                hit = next((w for w in prefixes(name) if w in left), None)
                if hit is not None:
                    found[hit] = f"{path}:{getattr(node, 'lineno', 0)}"
                    left.discard(hit)
    return found


def hf_model(class_name: str) -> str | None:
    """The Hugging Face model package of a speech model class (``WhisperProcessor``)."""
    for prefix, model in HF_MODELS:
        if class_name.startswith(prefix) and class_name[len(prefix):len(prefix) + 1].isupper():
            return model
    return None


def _parse(path: str) -> ast.AST | None:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, "rb") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
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
    """``a.b.c`` for a call of ``a.b.c(...)``, with ``a`` replaced by what it was imported as."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    head = bound.get(func.id, func.id)
    return ".".join([head, *reversed(parts)])


def _constant_arg(call: ast.Call) -> str | None:
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None
