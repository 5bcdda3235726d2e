"""Regenerate tests/corpus/unlisted.json: entry points of audio trees no built-in rule names.

For each tree in ``TREES`` and ``AUDIO_TREES`` (a public repository at a recorded commit) this
lists the entry points (files with a ``__main__`` block or a Hydra main), records how each is
launched (the first command line found in the tree's shell scripts and READMEs, else ``python
PATH``), the modules it imports (``imports``: the script's own import statements, read with
``ast``) and the modules its run reaches (``reaches``: the same, followed through the tree's own
modules at module level), and joins them with the hand-made labels of the
``tests/corpus/*_labels.toml`` files (TRAIN, AUDIO, OTHER or AMBIGUOUS, whether the program builds
an optimizer, and why; each row names its file as ``set``: ``unlisted``, ``audio``, ...). No
toolkit code is kept: paths, command lines, module names and labels only.

Usage::

    python scripts/corpus/unlisted.py --git-dirs DIR [--out tests/corpus/unlisted.json]

where ``DIR/<owner>+<name>/repo`` is a git directory holding the commit named in ``TREES`` (for
example ``git clone --bare https://github.com/<owner>/<name> DIR/<owner>+<name>/repo``).
``--check`` lists entry points that no label covers; ``--repo OWNER/NAME`` (repeatable) scans
only those trees and writes nothing unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
LABELS = ROOT / "tests" / "corpus"  # every *_labels.toml in it
OUT = ROOT / "tests" / "corpus" / "unlisted.json"


@dataclass(frozen=True)
class Tree:
    """One public repository at one commit, and which of its files are entry points."""

    repo: str
    commit: str
    skip: tuple[str, ...] = ()  # globs of files that are no program's entry point
    extra: tuple[str, ...] = ()  # globs of plain scripts (no __main__ block) that are programs
    imports_all: tuple[str, ...] = ()  # packages whose __init__ imports every submodule
    # top-level names that stay external although a nested folder of the tree bears them
    # (a vendored `.../torch/__init__.py` is not what `import torch` loads)
    external: tuple[str, ...] = ()


_COMMON_SKIP = ("setup.py", "**/setup.py", "docs/**", "**/test_*.py", "**/*_test.py", "tests/**",
                "**/tests/**", "test/**", "**/conftest.py")

TREES = (
    Tree("modelscope/FunASR", "3c58cb56a56598232c3efffa15d313d7e82a4307",
         ("runtime/**", "web-pages/**", "fun_text_processing/**"), imports_all=("funasr",)),
    Tree("FunAudioLLM/SenseVoice", "d478f77b134c50a12e2a77e35a4cea3a6e12901d", ("runtime/**",)),
    # src/slam_llm/models/vallex/transformers.py is not what `from transformers import` loads
    Tree("X-LANCE/SLAM-LLM", "a68e78f93a12a678438c8b43974fd987abb66927",
         external=("transformers",)),
    Tree("bytedance/SALMONN", "a58bba799a2eec05df09df102553f5c623808c12"),  # branch salmonn
    Tree("bytedance/SALMONN", "d96495623580e14bfc1a5204e2852bc1e8007d53"),  # branch salmonn2
    Tree("fixie-ai/ultravox", "648efe7f55510afff7adb45f076e904b3aba1d02"),
    Tree("huggingface/distil-whisper", "cc96130f6e4cc74cab4545f3c6e7e5c204ced871"),
    Tree("yeyupiaoling/Whisper-Finetune", "cb4b601604dab1ac8aff2f9939eda8aee3082394"),
    Tree("jonatasgrosman/huggingsound", "50e9fbaa41377c11d6ef9711700dbc1eae1cd7b0",
         extra=("examples/**",)),
    Tree("openspeech-team/openspeech", "10b25890b64b722c50aa7579c2570ad5c69b2cf2"),
    Tree("SeanNaren/deepspeech.pytorch", "b88a631ef6b96553e16bbaa5bd6a621435bed278"),
    Tree("sooftware/kospeech", "984b5890dd53379486b2abc0165c3396eb52ad37"),
    Tree("hirofumi0810/neural_sp", "b91877c6d2a11f06026480ab422176274d88cbf2"),
    Tree("thu-spmi/CAT", "e4b8cd14aca0d0d6f96a2f864874834c9de45a83"),
    Tree("facebookresearch/seamless_communication", "90e2b57ac4d82fa2bfaa25caeffe39ceb8b2ebec"),
    # speech-to-text trainers and their look-alikes (labels: speech_labels.toml)
    Tree("kaituoxu/Speech-Transformer", "43d83eab2e4e25a4250ddff702aa0a2d4dffe4e6"),
    Tree("kaituoxu/Listen-Attend-Spell", "b43ce63eaf68252fae2056bfcbbdef18c4be2340"),
    Tree("Alexander-H-Liu/End-to-end-ASR-Pytorch", "1103d144423e8e692f1d18cd9db27a96cb49fb9d"),
    Tree("ZhengkunTian/OpenTransformer", "802750a2bba2b5db5a61869a0819bce977bcd7d8"),
    Tree("mravanelli/pytorch-kaldi", "9773257d4c4edb8bd9a2dcd8c81afa2a4ab9da07"),
    Tree("yeyupiaoling/MASR", "fe0010de33440a11bb843ff2c424db4b7a310ac7",  # plain scripts
         extra=("train.py", "eval.py", "export_model.py", "extract_features.py", "create_data.py")),
    Tree("lorenlugosch/end-to-end-SLU", "e94bd479de1a82663c38363979309089acebcd36"),
    Tree("smeetrs/deep_avsr", "b68a8dbba4264210e485e96874c78c520298496b"),
    Tree("mpc001/auto_avsr", "182b62837773ab01052d4ac21ef1d2203ea7d267"),
    Tree("mpc001/Visual_Speech_Recognition_for_Multiple_Languages",
         "5e1405db0ae816509fb312f9a578724c2e0de0c7"),
    Tree("vasistalodagala/whisper-finetune", "718ad18b669d7ed5290a4c1c3577b0b141621555"),
    Tree("ExtraOrdinaryLab/aura", "0c5ff1add5f0f7315858dd755a92c13e143c5508"),
    Tree("cwang621/blsp", "f7bf52fbd3341e90e754351a883336c5485b22de"),
    # recipes run as `python -m recipes.wav2vec2.asr`; a README's `python -m asr` is no library file
    Tree("facebookresearch/fairseq2", "027bdebca4b9177f1ac1df1cc981b9288465d68e",
         ("src/fairseq2/models/asr.py",), extra=("recipes/**/__main__.py",)),
    Tree("hiyouga/LLaMA-Factory", "ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30"),
    Tree("AI4Bharat/IndicWav2Vec", "d61dfa88fbea10bf1917386bcad7ec19ec0c6929"),
    Tree("Open-Speech-EkStep/vakyansh-wav2vec2-experimentation",
         "641a67ab116be666428508de47350910947f8929"),
    Tree("facebookresearch/av_hubert", "258fb50e155134eec2c4b49c2ae8de267075fd18"),
)

# Trees of audio training outside speech-to-text (TTS, vocoders, codecs, separation, enhancement,
# speaker, classification, music) and of ASR inference/export tools: the hard negatives
# (tests/corpus/audio_labels.toml).
AUDIO_TREES = (
    Tree("coqui-ai/TTS", "dbf1a08a0d4e47fdad6172e433eeb34bc6b13b4e",
         extra=("recipes/**/train*.py",)),  # plain scripts calling trainer.fit()
    Tree("open-mmlab/Amphion", "d3de90f02e7f1c7dbc24b04d52fe1b8ef438effe",
         external=("transformers",)),
    Tree("NVIDIA/BigVGAN", "7d2b454564a6c7d014227f635b7423881f14bdac", external=("torch",)),
    Tree("facebookresearch/audiocraft", "896ec7c47f5e5d1e5aa1e4b260c4405328bf009d"),
    Tree("yl4579/StyleTTS2", "5cedc71c333f8d8b8551ca59378bdcc7af4c9529"),
    Tree("shivammehta25/Matcha-TTS", "108906c603fad5055f2649b3fd71d2bbdf222eac"),
    Tree("RVC-Boss/GPT-SoVITS", "48b1a0169a28582a8984402f82cf438d3bfa6aca", external=("torch",)),
    Tree("fishaudio/fish-speech", "3dd1f85c402ee6f0a17c2971d3b0dd8d881ca139"),
    Tree("kan-bayashi/ParallelWaveGAN", "86740373ec609cb9fb192d472d2aea125041491a"),
    Tree("ming024/FastSpeech2", "d4e79eb52e8b01d24703b2dfc0385544092958f3"),
    Tree("descriptinc/descript-audio-codec", "c7cfc5d2647e26471dc394f95846a0830e7bec34"),
    # the last commit with the pyannote-audio-train CLI (training moved to notebooks after it)
    Tree("pyannote/pyannote-audio", "54947d0f66537968081645e7ee1330f700f26a2e"),
    Tree("wenet-e2e/wespeaker", "dfa741957e5c11f477623b6e583d67d0af25ee88"),
    Tree("wenet-e2e/wekws", "1a8ee651620f49a8a7779be4d30668157fc23350"),
    Tree("ddlBoJack/emotion2vec", "a0e606c668227ab0c01527e196a4acc42b1efad9"),
    Tree("qiuqiangkong/audioset_tagging_cnn", "d2f4b8c18eab44737fcc0de1248ae21eb43f6aa4"),
    Tree("Rikorose/DeepFilterNet", "d375b2d8309e0935d165700c91da9de862a99c31"),
    Tree("sp-uhh/sgmse", "ae690e8c046aa163da0c6c774842fa5f9a5f2183"),
    Tree("asteroid-team/asteroid", "92c8d83a9dbe7c3afd1cd097e31254e0b4f82881"),
    Tree("facebookresearch/demucs", "e976d93ecc3865e5757426930257e200846a520a"),
    Tree("k2-fsa/sherpa-onnx", "634265c9b57642fdd158120148785c89aa281c4b"),
    Tree("m-bain/whisperX", "2cfd7b7c5c7bba144954364db747319b50e8232b"),
)

LABEL_KINDS = ("TRAIN", "AUDIO", "OTHER", "AMBIGUOUS")

# `from transformers import WhisperProcessor` imports transformers.models.whisper (lazily, on
# first use): the model families of speech checkpoints, by class-name prefix, longest first.
_HF_SPEECH = (
    ("Wav2Vec2Conformer", "wav2vec2_conformer"), ("Wav2Vec2Bert", "wav2vec2_bert"),
    ("Wav2Vec2", "wav2vec2"), ("WavLM", "wavlm"), ("Hubert", "hubert"), ("Whisper", "whisper"),
    ("Speech2Text", "speech_to_text"), ("SeamlessM4Tv2", "seamless_m4t_v2"),
    ("SeamlessM4T", "seamless_m4t"), ("Qwen2Audio", "qwen2_audio"), ("SpeechT5", "speecht5"),
    ("Data2VecAudio", "data2vec"), ("UniSpeech", "unispeech"), ("SEW", "sew"),
)

_MAIN_RE = re.compile(r"""__name__\s*==\s*['"]__main__['"]|@hydra\.main""")
# Where a program builds a torch optimizer, itself or through the trainer it calls: a first
# guess that the labels confirm or correct by reading the code.
_OPTIM_RE = re.compile(
    r"torch\.optim\.[A-Z]|\boptim\.(Adam|AdamW|SGD|Adadelta|Adagrad|RMSprop)\(|\b(Adam|AdamW|SGD)\("
    r"|build_optimizer|configure_optimizers|create_optimizer|deepspeed\.initialize"
    r"|\.fit\(|trainer\.train\("
)
# "examples/asr/model/slam_model_asr.py:model_factory": a config naming the file a run loads
_PYFILE_RE = re.compile(r"([\w./-]+\.py)(?::\w+)?\Z")
_LAUNCH_RE = re.compile(
    r"(?:^|[\s;&|(])((?:torchrun|python3?|accelerate launch|deepspeed)\b[^\n;|&]*)"
)


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def read_all(git_dir: Path, commit: str, paths: Iterable[str]) -> dict[str, str]:
    """The text of many files at one commit, through one ``git cat-file --batch``."""
    paths = list(paths)
    query = "".join(f"{commit}:{p}\n" for p in paths).encode()
    out = subprocess.run(["git", "-C", str(git_dir), "cat-file", "--batch"], input=query,
                         check=True, capture_output=True).stdout
    texts: dict[str, str] = {}
    pos = 0
    for path in paths:
        header_end = out.index(b"\n", pos)
        header = out[pos:header_end].split()
        if header[-1] == b"missing":
            pos = header_end + 1
            continue
        size = int(header[2])
        texts[path] = out[header_end + 1 : header_end + 1 + size].decode("utf-8", "replace")
        pos = header_end + 1 + size + 1
    return texts


def module_names(path: str) -> Iterator[str]:
    """Every dotted name a file may be imported as (each suffix of its path)."""
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    for i in range(len(parts)):
        yield ".".join(parts[i:])


def imports_of(tree: ast.AST, path: str, top_level_only: bool) -> list[str]:
    """Dotted module names the file imports (relative ones resolved against its package)."""
    package = path.split("/")[:-1]
    nodes = ast.iter_child_nodes(tree) if top_level_only else ast.walk(tree)
    found: list[str] = []
    stack = list(nodes)
    while stack:
        node = stack.pop(0)
        if top_level_only and isinstance(node, (ast.If, ast.Try, ast.With)):
            stack.extend(ast.iter_child_nodes(node))  # `try: import x` at module level runs too
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)
            continue
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.append(base)
            found.extend(f"{base}.{alias.name}" for alias in node.names)
            if base == "transformers":
                found.extend(_hf_models(alias.name for alias in node.names))
    return [name for name in found if name]


def _hf_models(names: Iterable[str]) -> Iterator[str]:
    for name in names:
        for prefix, model in _HF_SPEECH:
            if name.startswith(prefix):
                yield f"transformers.models.{model}"
                break


def named_files(tree: ast.AST) -> Iterator[str]:
    """Python files a module names in its strings (configs that say which file to load)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _PYFILE_RE.match(node.value.strip())
            if match:
                yield match.group(1)


class Index:
    """A tree's Python files: who can be imported as what, and what each imports."""

    def __init__(
        self,
        texts: dict[str, str],
        imports_all: tuple[str, ...] = (),
        external: tuple[str, ...] = (),
    ) -> None:
        self.texts = texts
        self.external = set(external)
        self.imports_all = {f"{p}/__init__.py": p + "/" for p in imports_all}
        self.by_name: dict[str, list[str]] = {}
        for path in texts:
            for name in module_names(path):
                self.by_name.setdefault(name, []).append(path)
        self.parsed: dict[str, ast.AST | None] = {}

    def ast(self, path: str) -> ast.AST | None:
        if path not in self.parsed:
            try:
                self.parsed[path] = ast.parse(self.texts[path])
            except (SyntaxError, ValueError):
                self.parsed[path] = None
        return self.parsed[path]

    def resolve(self, name: str, importer: str) -> str | None:
        """The tree's file that ``import name`` from ``importer`` loads, nearest first."""
        candidates = self.by_name.get(name)
        if not candidates or name.split(".")[0] in self.external:
            return None
        here = importer.split("/")
        return max(candidates, key=lambda p: (_common(p.split("/"), here), -len(p)))

    def closure(self, entry: str) -> tuple[list[str], list[str], set[str]]:
        """Direct external imports, external imports reached, and the tree files run."""
        direct_tree = self.ast(entry)
        direct = imports_of(direct_tree, entry, False) if direct_tree else []
        seen, externals, queue = {entry}, set(), [(entry, direct, self._named(direct_tree, entry))]
        while queue:
            path, names, files = queue.pop()
            for name in names:
                local = self._local(name, path)
                if local is None:
                    externals.add(name)
                    continue
                files = [*files, *local]
            for step in files:
                if step not in seen:
                    seen.add(step)
                    tree = self.ast(step)
                    names = self._runs(tree, step) if tree else []
                    queue.append((step, names, self._named(tree, step)))
        direct_ext = {n for n in direct if self._local(n, entry) is None}
        return _names(direct_ext), _names(externals), seen

    def _runs(self, tree: ast.AST, path: str) -> list[str]:
        """What a reached module imports: all at module level, and the tree's own modules that
        its functions import (a factory importing the model it builds)."""
        local = [n for n in imports_of(tree, path, False) if self._local(n, path) is not None]
        return imports_of(tree, path, True) + local

    def _named(self, tree: ast.AST | None, path: str) -> list[str]:
        """Tree files this one loads by path (config strings) or by importing all submodules."""
        found = [f for f in (named_files(tree) if tree else ()) if f in self.texts]
        prefix = self.imports_all.get(path)
        if prefix:
            found.extend(p for p in self.texts if p.startswith(prefix) and "/test" not in p)
        return found

    def _local(self, name: str, importer: str) -> list[str] | None:
        """The tree files ``import name`` runs (packages first), or None for an external name."""
        parts = name.split(".")
        target = self.resolve(name, importer)
        if target is None:
            # `from pkg import function`: the module is the longest prefix the tree has
            for cut in range(len(parts) - 1, 0, -1):
                target = self.resolve(".".join(parts[:cut]), importer)
                if target:
                    parts = parts[:cut]
                    break
        if target is None:
            return None
        chain = [self.resolve(".".join(parts[:i]), target) for i in range(1, len(parts))]
        return [p for p in chain if p] + [target]


def _names(names: Iterable[str]) -> list[str]:
    """Third-party module names, to three components (transformers.models.whisper), sorted."""
    stdlib = sys.stdlib_module_names
    kept = set()
    for name in names:
        parts = name.split(".")
        if parts[0] in stdlib:
            continue
        while len(parts) > 1 and parts[-1][:1].isupper():  # `from x import Class`: the module is x
            parts.pop()
        kept.add(".".join(parts[:3]))
    return sorted(kept)


def _common(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def launch_forms(texts: dict[str, str], entries: list[str]) -> dict[str, dict[str, object]]:
    """The first command line in the tree's scripts/READMEs that runs each entry point."""
    forms: dict[str, dict[str, object]] = {}
    by_base: dict[str, list[str]] = {}
    for entry in entries:
        by_base.setdefault(entry.rsplit("/", 1)[-1], []).append(entry)
    for doc, text in sorted(texts.items()):
        cwd = doc.rsplit("/", 1)[0] if "/" in doc else "."
        for line in text.replace("\\\n", " ").splitlines():
            for match in _LAUNCH_RE.finditer(line):
                argv = _split(match.group(1))
                for i, token in enumerate(argv):
                    if i and argv[i - 1] == "-m":  # python -m cat.ctc.train
                        token = token.replace(".", "/") + ".py"
                    base = token.rsplit("/", 1)[-1]
                    for entry in by_base.get(base, ()):
                        if entry not in forms and _same_file(token, cwd, entry):
                            forms[entry] = {"cwd": cwd, "argv": argv[: i + 1] + argv[i + 1 : i + 9],
                                            "from": doc}
    return forms


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def _same_file(token: str, cwd: str, entry: str) -> bool:
    if "$" in token or "{" in token:
        return token.rsplit("/", 1)[-1] == entry.rsplit("/", 1)[-1]
    parts: list[str] = [] if cwd == "." else cwd.split("/")
    for part in token.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    joined = "/".join(parts)
    return joined == entry or entry.endswith("/" + token.lstrip("./"))


def load_labels(folder: Path = LABELS) -> dict[str, list[dict[str, object]]]:
    """Every tree's labels, from all ``*_labels.toml`` files of ``folder`` (in name order); each
    label records its file's stem as ``set`` (``audio`` for audio_labels.toml)."""
    labels: dict[str, list[dict[str, object]]] = {}
    for path in sorted(folder.glob("*_labels.toml")):
        with open(path, "rb") as f:
            data = tomllib.load(f)
        for repo, table in data.items():
            for label in table.get("label", []):
                if label.get("label") not in LABEL_KINDS:
                    raise ValueError(f"{path.name}: {repo}: label {label.get('label')!r}")
                set_name = path.name.removesuffix("_labels.toml")
                labels.setdefault(repo, []).append({**label, "set": set_name})
    return labels


def label_for(labels: list[dict[str, object]], path: str) -> dict[str, object] | None:
    """The first label whose ``paths`` glob matches (``*`` does not cross '/', ``**`` does)."""
    for label in labels:
        for pattern in label["paths"]:  # type: ignore[union-attr]
            if _glob(str(pattern)).match(path):
                return label
    return None


def _glob(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def scan(tree: Tree, git_dir: Path, labels: list[dict]) -> tuple[list[dict], list[str]]:
    files = git(git_dir, "ls-tree", "-r", "--name-only", tree.commit).splitlines()
    py = [f for f in files if f.endswith(".py")]
    docs = [f for f in files if f.endswith((".sh", ".md", ".yaml", ".yml", ".txt", ".py"))]
    texts = read_all(git_dir, tree.commit, py)
    index = Index(texts, tree.imports_all, tree.external)
    skip = (*_COMMON_SKIP, *tree.skip)
    candidates = [p for p in py if not any(fnmatch.fnmatch(p, s) for s in skip)]
    forms = launch_forms(read_all(git_dir, tree.commit, docs), candidates)
    # a program: a __main__ block or Hydra main, or a file the tree's own docs run
    entries = [p for p in candidates if _MAIN_RE.search(texts.get(p, "")) or p in forms
               or any(fnmatch.fnmatch(p, e) for e in tree.extra)]
    rows, unlabelled = [], []
    for path in sorted(entries):
        direct, reached, run = index.closure(path)
        label = label_for(labels, path)
        guess = any(_OPTIM_RE.search(texts[p]) for p in run)
        if label is None:
            tops = sorted({n.split(".")[0] for n in reached})
            unlabelled.append(f"{path} opt={int(guess)} {' '.join(tops)}")
            continue
        form = forms.get(path, {"cwd": ".", "argv": ["python", path], "from": None})
        rows.append({
            "repo": tree.repo, "commit": tree.commit, "path": path, "launch": form,
            "imports": direct, "reaches": reached, "label": label["label"],
            "optimizer": bool(label.get("optimizer", guess)), "optimizer_guess": guess,
            "why": label.get("why", ""), "set": label["set"],
        })
    return rows, unlabelled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--git-dirs", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="list unlabelled entry points")
    parser.add_argument("--repo", action="append", default=[], help="scan only this tree")
    args = parser.parse_args(argv)
    labels = load_labels()
    rows: list[dict] = []
    missing = 0
    trees = [t for t in (*TREES, *AUDIO_TREES) if not args.repo or t.repo in args.repo]
    out = args.out or (None if args.repo else OUT)
    for tree in trees:
        git_dir = args.git_dirs / tree.repo.replace("/", "+") / "repo"
        found, unlabelled = scan(tree, git_dir, labels.get(tree.repo, []))
        rows.extend(found)
        for path in unlabelled:
            print(f"unlabelled: {tree.repo} {path}", file=sys.stderr)
        missing += len(unlabelled)
    if args.check or out is None:
        print(_summary(rows), file=sys.stderr)
        return 1 if missing else 0
    lines = ",\n".join(json.dumps(row, sort_keys=True) for row in rows)  # one entry a line
    out.write_text('{"entries": [\n' + lines + "\n]}\n")
    print(f"{len(rows)} entry points written to {out} ({missing} unlabelled)")
    return 0


def _summary(rows: list[dict]) -> str:
    """Entry points per tree and label, with how many of each build an optimizer."""
    counts: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        cell = counts.setdefault((row["repo"], row["label"]), [0, 0])
        cell[0] += 1
        cell[1] += row["optimizer"]
    return "\n".join(f"{repo} {label}: {n} ({opt} with an optimizer)"
                     for (repo, label), (n, opt) in sorted(counts.items()))


if __name__ == "__main__":
    sys.exit(main())
