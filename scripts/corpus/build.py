"""Rebuild tests/corpus/entrypoints.json: real entry points of eight ASR toolkits, labelled.

Not run in CI. Give it snapshots of the toolkits' repositories (a git directory, bare or
not, whose HEAD is read; or a plain directory tree, e.g. a sparse checkout of the parts
named below for the repositories too large to clone whole):

    python scripts/corpus/build.py --nemo DIR --icefall DIR --espnet DIR --wenet DIR \
        --speechbrain DIR --transformers DIR --fairseq DIR --torchaudio DIR [-o OUT]

A toolkit left out keeps its rows from the existing corpus file. Each row records the
entry point's path in its checkout, how it is launched (cwd relative to the checkout root
and argv, as the toolkit's recipes and READMEs start it), the trigger-relevant modules the
script imports (statically, with ``ast``; one level into sibling modules it imports), the
file marking the checkout root, and a label: TRAIN (trains or fine-tunes a model on
variable-length speech batches within the built-in scope), OFF (the same for a speech task
outside it: the rules shipped off until ``enable``), OTHER, or AMBIGUOUS (not scored).
Labels come from the rules in ``label()`` (path layout, then the file's text), overridden
by ``overrides.tsv`` next to this script, where a person has read the file.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent.parent / "tests" / "corpus" / "entrypoints.json"

# The file at each checkout's root that marks it (what builtin.toml's `outside` lists use).
MARKERS = {
    "nemo": "nemo/package_info.py",
    "icefall": "icefall/__init__.py",
    "espnet": "espnet2/__init__.py",
    "wenet": "wenet/__init__.py",
    "speechbrain": "speechbrain/__init__.py",
    "transformers": "src/transformers/__init__.py",
    "fairseq": "fairseq/__init__.py",
    "torchaudio": "src/torchaudio/__init__.py",
}
# Import prefixes worth recording: the built-in rules' triggers and their neighbours.
TRACKED = (
    "nemo",
    "icefall",
    "espnet2",
    "espnet",
    "wenet",
    "speechbrain",
    "fairseq",
    "lhotse",
    "k2",
    "torchaudio",
    "transformers",
    "vllm",
    "sglang",
    "torch_memory_saver",
)
# Modules that import a trigger at import time (checked in the toolkits' sources).
TRANSITIVE = {"espnet2.tasks": "espnet2.train.trainer"}
MAIN_RE = re.compile(
    r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:|@hydra_runner\(|@hydra\.main\(""", re.M
)
TRAINER_RE = re.compile(
    r"\.backward\(|trainer\.fit\(|\.fit\(|train_one_epoch|optimizer\.step\(|trainer\.train\(|"
    r"accelerator\.backward|run_train|\.train\(|finetune\(|pretrain\(|Trainer\(|main_worker|"
    r"\btrain\(\s*(args|cfg|config)?\s*\)"
)


class Tree:
    """Files of one snapshot: a git directory (HEAD) or a plain directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.git = _is_git(root)
        if self.git:
            out = subprocess.run(
                ["git", "-C", root, "ls-tree", "-r", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            self.files = {}
            for line in out.splitlines():
                meta, path = line.split("\t", 1)
                mode, _, sha = meta.split()
                self.files[path] = (mode, sha)
        else:
            self.files = {}
            for dirpath, _, names in os.walk(root):
                for name in names:
                    full = os.path.join(dirpath, name)
                    rel = os.path.relpath(full, root)
                    self.files[rel] = ("120000" if os.path.islink(full) else "100644", full)
        self._cache: dict[str, str] = {}
        self._batch: subprocess.Popen | None = None

    def _blob(self, sha: str) -> str:
        """One blob through a single ``git cat-file --batch`` process."""
        if self._batch is None:
            self._batch = subprocess.Popen(
                ["git", "-C", self.root, "cat-file", "--batch"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        assert self._batch.stdin and self._batch.stdout
        self._batch.stdin.write(sha.encode() + b"\n")
        self._batch.stdin.flush()
        size = int(self._batch.stdout.readline().split()[2])
        data = self._batch.stdout.read(size + 1)[:-1]
        return data.decode("utf-8", "replace")

    def text(self, path: str, depth: int = 0) -> str:
        if path not in self.files or depth > 5:
            return ""
        if path in self._cache:
            return self._cache[path]
        mode, ref = self.files[path]
        if self.git:
            data = self._blob(ref)
        else:
            try:
                data = (
                    Path(ref).read_text("utf-8", "replace")
                    if mode != "120000"
                    else os.readlink(ref)
                )
            except OSError:
                data = ""
        if mode == "120000":  # a symlink: the entry point runs its target's code
            target = os.path.normpath(os.path.join(os.path.dirname(path), data.strip()))
            data = self.text(target, depth + 1)
        self._cache[path] = data
        return data


def _is_git(root: str) -> bool:
    """A git directory (bare, like the snapshots) or a work tree with its .git."""
    bare = os.path.isfile(os.path.join(root, "HEAD")) and os.path.isdir(
        os.path.join(root, "objects")
    )
    return bare or os.path.exists(os.path.join(root, ".git"))


def imports_of(tree: Tree, path: str) -> list[str]:
    """Tracked modules the script imports, statically, plus those of sibling modules it imports."""
    found: set[str] = set()

    def scan(p: str, follow: bool) -> None:
        try:
            module = ast.parse(tree.text(p))
        except (SyntaxError, ValueError):
            return
        for node in ast.walk(module):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                top = name.split(".")[0]
                if top in TRACKED:
                    found.add(".".join(name.split(".")[:4]))
                elif follow:
                    sibling = os.path.join(os.path.dirname(p), top + ".py")
                    if sibling in tree.files and sibling != p:
                        scan(sibling, False)

    scan(path, True)
    for prefix, trigger in TRANSITIVE.items():
        if any(n == prefix or n.startswith(prefix + ".") for n in found):
            found.add(trigger)
    return sorted(found)


def is_entry(tree: Tree, path: str) -> bool:
    return bool(MAIN_RE.search(tree.text(path)))


def trains(tree: Tree, path: str) -> bool:
    return bool(TRAINER_RE.search(tree.text(path)))


# ---------------------------------------------------------------- labelling rules

TRAIN, OFF, OTHER, AMBIGUOUS = "TRAIN", "OFF", "OTHER", "AMBIGUOUS"
# File names that never train a model, whatever they import (tokenizer and n-gram trainers
# included: they fit text models on the CPU).
NOT_TRAINING = re.compile(
    r"(decod|infer|transcri|eval|export|pretrained|averag|avg|compute_|prepar|^test_|_test$|"
    r"convert|scor|align|generat|onnx|jit|benchmark|profil|demo|extract|check|calib|plot|visuali|"
    r"download|spm|bpe_model|train_bpe|sentencepiece|tokeniz|vocab|make_|filter|split|merge|stat|"
    r"perplexity|"
    r"server|client|launch|quantiz|pipeline|oomptimizer|estimate|manifest|lexicon|graph|ngram|"
    r"kenlm|normaliz|analy|segment|process|diarize_|^lm_|_lm$|search|sampl|synthes|vocode)",
    re.I,
)
TRAINING_NAME = re.compile(
    r"(train|finetune|fine_tune|pretrain|pre_training|^speech_to_text_|distill|"
    r"^run_speech_recognition|^run_wav2vec2_pretraining|^run_common_voice|"
    r"^run_audio_classification)",
    re.I,
)


def by_name(name: str, text: str | None, scope: str) -> tuple[str, str]:
    """A label from the file name (and text when there is one) within a task scope.

    ``scope``: ``in`` (speech-to-text: the built-in scope), ``off`` (another speech task) or
    ``other`` (text, vision, tools).
    """
    stem = name[:-3] if name.endswith(".py") else name
    if scope == "other":
        return OTHER, "task outside speech"
    if NOT_TRAINING.search(stem):
        return OTHER, "not a trainer (name)"
    if text is None:
        if not TRAINING_NAME.search(stem):
            return OTHER, "not a trainer (name)"
    elif not TRAINER_RE.search(text):
        return OTHER, "no training loop"
    elif not TRAINING_NAME.search(stem) and "trainer.fit(" not in text:
        return OTHER, "a module's self-test or a tool"
    return (TRAIN, "trainer in scope") if scope == "in" else (OFF, "trainer of an off-scope task")


def row(
    toolkit: str,
    path: str,
    cwd: str,
    argv: list[str],
    imports: list[str],
    label: str,
    why: str,
    source: str = "static",
) -> dict:
    return {
        "toolkit": toolkit,
        "path": path,
        "cwd": cwd,
        "argv": argv,
        "imports": imports,
        "marker": MARKERS[toolkit],
        "label": label,
        "why": why,
        "imports_from": source,
    }


def entry_scripts(tree: Tree, prefixes: tuple[str, ...]) -> Iterator[str]:
    for path in sorted(tree.files):
        if (
            path.endswith(".py")
            and path.startswith(prefixes)
            and "/__" not in path
            and "/test/" not in path
            and "/tests/" not in path
            and is_entry(tree, path)
        ):
            yield path


# ---------------------------------------------------------------- per toolkit

NEMO_SCOPE = [
    (r"^examples/asr/speech_classification/", "off"),  # MatchboxNet KWS / VAD
    (r"^examples/(asr|slu|speechlm|speechlm2)/", "in"),
    (r"^examples/(tts|audio|speaker_tasks)/", "off"),
    (r"^examples/", "other"),
    (r"^(scripts|tools)/", "other"),
]


def _scope(table: list[tuple[str, str]], path: str) -> str:
    return next((s for pattern, s in table if re.search(pattern, path)), "other")


def nemo(tree: Tree) -> Iterator[dict]:
    for path in entry_scripts(tree, ("examples/", "scripts/", "tools/")):
        text = tree.text(path)
        label, why = by_name(os.path.basename(path), text, _scope(NEMO_SCOPE, path))
        yield row("nemo", path, "", [path], imports_of(tree, path), label, why)


ICEFALL_TASKS = {
    "ASR": "in",
    "ASR_v2": "in",
    "ST": "in",
    "SLU": "in",
    "SURT": "in",
    "SSL": "in",
    "WSASR": "in",
    "ASR_LLM": "in",
    "VSR": "in",
    "TTS": "off",
    "KWS": "off",
    "CODEC": "off",
    "AT": "off",
    "LM": "other",
}
ICEFALL_NOT_SPEECH_DIRS = {"local", "rnn_lm", "transformer_lm", "shared", "scripts"}


def icefall(tree: Tree) -> Iterator[dict]:
    for path in entry_scripts(tree, ("egs/",)):
        parts = path.split("/")
        text = tree.text(path)
        if len(parts) >= 5:
            cwd, script = "/".join(parts[:3]), "./" + "/".join(parts[3:])
            scope = ICEFALL_TASKS.get(parts[2], "other")
            if parts[3] in ICEFALL_NOT_SPEECH_DIRS:
                scope = "other"
        else:
            cwd, script, scope = "/".join(parts[:-1]), "./" + parts[-1], "other"
        label, why = by_name(parts[-1], text, scope)
        yield row("icefall", path, cwd, [script], imports_of(tree, path), label, why)


ESPNET_IN = (
    "asr",
    "asr_transducer",
    "asr_hybrid",
    "asr_mix",
    "s2t",
    "s2t_train_ctc",
    "st",
    "enh_s2t",
    "enh_asr",
    "slu",
    "uasr",
    "hubert",
    "ssl",
    "avsr",
    "lightning",
)
ESPNET_OFF = (
    "tts",
    "tts2",
    "gan_tts",
    "svs",
    "gan_svs",
    "enh",
    "enh_tse",
    "cdiffuse_enh",
    "diar",
    "diar_enh",
    "spk",
    "lid",
    "cls",
    "ser",
    "asvspoof",
    "gan_codec",
    "gan_tok",
    "beats",
    "beats_tokenizer",
    "non_parallel_vc",
    "parallel_vc",
    "s2st",
    "aai",
    "audio_metric",
    "enh_train_sidon",
)
ESPNET_AMBIGUOUS = {
    "rst": "task of rst_train not settled by reading its name",
    "aqa": "audio question answering (a speech-LLM or an audio task)",
}


def espnet(modules: list[str]) -> Iterator[dict]:
    cwd = "egs2/librispeech/asr1"
    for name in modules:
        module = f"espnet2.bin.{name}"
        task = name[: -len("_train")] if name.endswith("_train") else name
        if name == "s2t_train_ctc":
            task = "s2t_train_ctc"
        imports = (
            ["espnet2.tasks", "espnet2.train.trainer"]
            if re.search(r"_(train|inference|decode|align)|^launch$|^pack$", name)
            and name != "launch"
            else []
        )
        argv = ["-m", module, "--ngpu", "1", "--batch_type", "numel", "--config", "conf/train.yaml"]
        if name.endswith("_train") or name == "s2t_train_ctc":
            if task in ESPNET_IN:
                label, why = TRAIN, "trainer in scope"
            elif task in ESPNET_AMBIGUOUS:
                label, why = AMBIGUOUS, ESPNET_AMBIGUOUS[task]
            elif task in ESPNET_OFF:
                label, why = OFF, "trainer of an off-scope task"
            else:
                label, why = OTHER, "text or unrelated trainer"
            yield row("espnet", module, cwd, argv, imports, label, why, "name")
            stats = ["-m", module, "--collect_stats", "true", "--config", "conf/train.yaml"]
            yield row(
                "espnet",
                module,
                cwd,
                stats,
                imports,
                OTHER,
                "--collect_stats stage: CPU statistics pass",
                "name",
            )
        else:
            yield row("espnet", module, cwd, argv[:2], imports, OTHER, "not a trainer", "name")


WENET_TRAINERS = {"wenet/bin/train.py"}


def wenet(tree: Tree) -> Iterator[dict]:
    for path in entry_scripts(tree, ("wenet/bin/", "tools/", "examples/", "wenet/")):
        text = tree.text(path)
        if path in WENET_TRAINERS:
            argv = [
                "torchrun",
                "--standalone",
                "--nnodes=1",
                "--nproc_per_node=8",
                path,
                "--config",
                "conf/train_conformer.yaml",
                "--train_engine",
                "torch_ddp",
            ]
            yield row("wenet", path, "", argv, imports_of(tree, path), TRAIN, "the trainer")
        else:
            label, why = by_name(
                os.path.basename(path),
                text,
                "other" if "train" not in os.path.basename(path) else "in",
            )
            yield row("wenet", path, "", [path], imports_of(tree, path), label, why)


SB_TASKS = {
    "ASR": "in",
    "SLU": "in",
    "ST": "in",
    "AST": "in",
    "direct": "in",
    "multistage": "in",
    "self-supervised-learning": "in",
    "MTL": "in",
    "separation": "off",
    "enhance": "off",
    "enhancement": "off",
    "TTS": "off",
    "vocoder": "off",
    "SpeakerRec": "off",
    "VAD": "off",
    "Diarization": "off",
    "emotion_diarization": "off",
    "lang_id": "off",
    "classification": "off",
    "SoundClassification": "off",
    "emotion_recognition": "off",
    "dereverb": "off",
    "focalcodec": "off",
    "diffusion": "off",
    "stuttering-detection": "off",
    "S2ST": "off",
    "sisnr-estimation": "off",
    "quantization": "other",
    "KWS": "off",
    "speaker_id": "off",
    "hyperparameter_optimization_speaker_id": "off",
    "enhancement_template": "off",
    "speech_recognition": "other",
    "decoupled": "in",
    "Alignment": "in",
    "SENSE": "in",
}
SB_AMBIGUOUS = {
    "decoupled": "SLU that trains a text model on ASR output",
    "Alignment": "HMM/CTC aligner training",
    "SENSE": "speech-text sentence embeddings",
}


def speechbrain(tree: Tree) -> Iterator[dict]:
    for path in entry_scripts(tree, ("recipes/", "tools/", "templates/")):
        parts = path.split("/")
        text = tree.text(path)
        task = parts[2] if len(parts) > 3 else parts[1] if path.startswith("templates/") else ""
        if path.startswith("templates/enhancement"):
            task = "enhancement_template"
        scope = SB_TASKS.get(task, "other")
        label, why = by_name(parts[-1], text, scope)
        if task in SB_AMBIGUOUS and label == TRAIN:
            label, why = AMBIGUOUS, SB_AMBIGUOUS[task]
        cwd = "/".join(parts[:-1])
        argv = [parts[-1], "hparams/train.yaml"] if "train" in parts[-1] else [parts[-1]]
        yield row("speechbrain", path, cwd, argv, imports_of(tree, path), label, why)


HF_SCOPE = [
    (r"/(speech-recognition|speech-pretraining)/", "in"),
    (r"/audio-classification/", "off"),
]


def transformers(paths: list[str]) -> Iterator[dict]:
    for path in paths:
        label, why = by_name(os.path.basename(path), None, _scope(HF_SCOPE, path))
        cwd, name = os.path.dirname(path), os.path.basename(path)
        yield row(
            "transformers",
            path,
            cwd,
            [name, "--output_dir", "out", "--do_train"],
            ["transformers"],
            label,
            why,
            "name",
        )


AUDIO_SCOPE = [
    (r"^examples/(asr|avsr|hubert|self_supervised_learning|pipeline_wav2letter)/", "in"),
    (r"^examples/(source_separation|pipeline_tacotron2|pipeline_wavernn|dnn_beamformer)/", "off"),
]


def torchaudio(paths: list[str]) -> Iterator[dict]:
    for path in paths:
        label, why = by_name(os.path.basename(path), None, _scope(AUDIO_SCOPE, path))
        cwd, name = os.path.dirname(path), os.path.basename(path)
        yield row(
            "torchaudio", path, cwd, [name, "--exp-dir", "exp"], ["torchaudio"], label, why, "name"
        )


FAIRSEQ_COMMANDS = (
    "fairseq-train",
    "fairseq-hydra-train",
    "fairseq-generate",
    "fairseq-preprocess",
    "fairseq-interactive",
    "fairseq-eval-lm",
    "fairseq-validate",
    "fairseq-score",
)
FAIRSEQ_TRAINERS = (
    "fairseq-train",
    "fairseq-hydra-train",
    "fairseq_cli/train.py",
    "fairseq_cli/hydra_train.py",
    "train.py",
    "fairseq_cli.train",
    "fairseq_cli.hydra_train",
)
FAIRSEQ_TASKS_IN = {
    "audio_pretraining",
    "audio_finetuning",
    "hubert_pretraining",
    "speech_to_text",
    "speech_recognition",
    "speech_text_joint_to_text",
    "simul_speech_to_text",
    "speech_to_text_multitask",
    "multilingual_speech_to_text",
    "mms",
}
FAIRSEQ_TASKS_OFF = {
    "text_to_speech",
    "speech_to_speech",
    "frm_text_to_speech",
    "audio_classification",
    "speech_unit_modeling",
    "speech_dlm_task",
}
FAIRSEQ_SPEECH_DIRS = (
    "speech_recognition",
    "speech_to_text",
    "wav2vec",
    "hubert",
    "speech_text_joint_to_text",
    "mms",
    "simultaneous_translation",
    "unit2speech",
    "speech_synthesis",
    "speech_to_speech",
    "textless_nlp",
    "emotion_conversion",
    "voxpopuli",
    "audio_nlp",
)


def fairseq_label(readme_dir: str, argv: list[str]) -> tuple[str, str]:
    text = " ".join(argv)
    task = re.search(r"(?:--task[ =]|task\._name=|task=)([A-Za-z0-9_]+)", text)
    if task:
        name = task.group(1)
        if name in FAIRSEQ_TASKS_IN or name.startswith("speech_to_text"):
            return TRAIN, f"task {name}"
        if name in FAIRSEQ_TASKS_OFF:
            return OFF, f"task {name}"
        return OTHER, f"task {name}"
    config = re.search(r"--config-dir[ =](\S+)", text)
    cfg = (
        (config.group(1) if config else "")
        + " "
        + " ".join(a for a in argv if a.startswith("--config-name"))
    )
    if re.search(
        r"data2vec.*(text|vision|nlp|image)|(text|vision|nlp|image).*data2vec|roberta", text
    ):
        return OTHER, "data2vec text/vision config"
    if re.search(r"wav2vec|hubert|data2vec|audio|speech|asr", cfg, re.I):
        return TRAIN, "speech config"
    if readme_dir.startswith(tuple(f"examples/{d}" for d in FAIRSEQ_SPEECH_DIRS)):
        return AMBIGUOUS, "speech README, task not on the command line"
    return OTHER, "text task"


def readme_commands(text: str) -> Iterator[list[str]]:
    lines, buf = [], ""
    for line in text.splitlines():
        line = line.strip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        lines.append(buf + line)
        buf = ""
    for line in lines:
        line = re.sub(r"^\$\s*", "", line)
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
            tokens = tokens[1:]
        if not tokens:
            continue
        if tokens[0] in FAIRSEQ_COMMANDS:
            yield tokens
        elif (
            tokens[0] in ("python", "python3")
            and len(tokens) > 1
            and (
                tokens[1] in ("train.py", "fairseq_cli/train.py", "fairseq_cli/hydra_train.py")
                or (tokens[1] == "-m" and len(tokens) > 2 and tokens[2].startswith("fairseq_cli"))
            )
        ):
            yield ["python", *tokens[1:]]


def fairseq(tree: Tree) -> Iterator[dict]:
    for path in entry_scripts(tree, ("examples/", "fairseq_cli/", "scripts/")):
        text = tree.text(path)
        if path in ("fairseq_cli/train.py", "fairseq_cli/hydra_train.py"):
            yield row(
                "fairseq",
                path,
                "",
                [path],
                imports_of(tree, path),
                AMBIGUOUS,
                "the task comes from its arguments",
            )
            continue
        top = path.split("/")[1] if path.startswith("examples/") else ""
        scope = (
            "in"
            if top
            in (
                "speech_recognition",
                "speech_to_text",
                "wav2vec",
                "hubert",
                "speech_text_joint_to_text",
                "mms",
            )
            else "other"
        )
        label, why = by_name(os.path.basename(path), text, scope)
        yield row("fairseq", path, "", [path], imports_of(tree, path), label, why)
    seen: set[tuple[str, ...]] = set()
    for readme in sorted(
        p
        for p in tree.files
        if re.search(r"(^|/)README[^/]*\.md$", p)
        or (p.startswith("examples/") and p.endswith(".md"))
    ):
        folder = os.path.dirname(readme)
        for n, argv in enumerate(readme_commands(tree.text(readme))):
            key = tuple(argv)
            if key in seen:
                continue
            seen.add(key)
            trainer = (
                argv[0] in FAIRSEQ_TRAINERS
                or argv[1] in FAIRSEQ_TRAINERS
                or (argv[1] == "-m" and argv[2] in FAIRSEQ_TRAINERS)
            )
            label, why = fairseq_label(folder, argv) if trainer else (OTHER, "not a trainer")
            if argv[0] == "python":
                argv = argv[1:]
            yield row("fairseq", f"{readme}#{n}", "", argv, [], label, why, "command line")


# ---------------------------------------------------------------- assemble


def read_listing(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            out.extend(line.split())
    return out


def overrides() -> dict[str, tuple[str, str]]:
    out = {}
    with open(HERE / "overrides.tsv", newline="") as f:
        for rec in csv.reader(f, delimiter="\t"):
            if rec and not rec[0].startswith("#"):
                out[rec[0]] = (rec[1], rec[2])
    return out


def build(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    for name, fn in (
        ("nemo", nemo),
        ("icefall", icefall),
        ("wenet", wenet),
        ("speechbrain", speechbrain),
        ("fairseq", fairseq),
    ):
        root = getattr(args, name)
        if root:
            rows += list(fn(Tree(root)))
    if args.espnet:
        listed = Tree(args.espnet).files if os.path.isdir(args.espnet) else {}
        names = sorted(
            {
                Path(p).stem
                for p in listed
                if p.startswith("espnet2/bin/") and p.endswith(".py") and "/." not in p
            }
            - {"__init__"}
        )
        rows += list(espnet(names or read_listing(HERE / "listings/espnet.txt")))
    for name, fn in (("transformers", transformers), ("torchaudio", torchaudio)):
        root = getattr(args, name)
        listing = read_listing(HERE / f"listings/{name}.txt")
        if root and os.path.isdir(root):
            tree = Tree(root)
            listing = [p for p in listing if p in tree.files] or listing
        if root:
            rows += list(fn(listing))
    return rows


def compact(imports: list[str]) -> list[str]:
    """Imports cut to what a trigger can name: three levels under ``nemo.collections`` and
    ``espnet2`` (``nemo.collections.asr``, ``espnet2.train.trainer``), top-level packages
    elsewhere; a name implied by a longer one is left out."""
    deep = ("nemo.collections.", "espnet2.")
    cut = sorted({".".join(n.split(".")[: 3 if n.startswith(deep) else 1]) for n in imports})
    return [n for n in cut if not any(o != n and o.startswith(n + ".") for o in cut)]


def finish(rows: list[dict], old: list[dict], given: set[str]) -> list[dict]:
    rows = rows + [r for r in old if r["toolkit"] not in given]
    fixed = overrides()
    ids: set[str] = set()
    for r in rows:
        r["imports"] = compact(r["imports"])
        rid = r["path"] if "--collect_stats" not in r["argv"] else r["path"] + "#collect_stats"
        r["id"] = f"{r['toolkit']}:{rid}"
        if r["id"] in ids:
            raise SystemExit(f"duplicate row {r['id']}")
        ids.add(r["id"])
        if r["id"] in fixed:
            r["label"], r["why"] = fixed[r["id"]][0], "read: " + fixed[r["id"]][1]
    return sorted(rows, key=lambda r: r["id"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in MARKERS:
        parser.add_argument(f"--{name}", help=f"snapshot of {name} (git dir or tree)")
    parser.add_argument(
        "--listings",
        action="store_true",
        help="use the file listings for espnet, transformers and torchaudio",
    )
    parser.add_argument("-o", "--out", default=str(OUT))
    args = parser.parse_args()
    if args.listings:
        for name in ("espnet", "transformers", "torchaudio"):
            setattr(args, name, getattr(args, name) or "-")
    given = {n for n in MARKERS if getattr(args, n)}
    old = json.loads(Path(args.out).read_text())["rows"] if Path(args.out).exists() else []
    rows = finish(build(args), old, given)
    keys = (
        "id",
        "toolkit",
        "path",
        "cwd",
        "argv",
        "imports",
        "marker",
        "label",
        "why",
        "imports_from",
    )
    body = ",\n".join("    " + json.dumps({k: r[k] for k in keys}) for r in rows)
    Path(args.out).write_text(
        '{\n  "about": "Entry points of eight ASR toolkits, labelled; rebuilt by '
        'scripts/corpus/build.py",\n  "rows": [\n' + body + "\n  ]\n}\n"
    )
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["label"]] = counts.get(r["label"], 0) + 1
    print(len(rows), "rows", counts)


if __name__ == "__main__":
    main()
