"""The built-in policy scored on the real entry points of eight toolkits, in process.

``tests/corpus/entrypoints.json`` lists the entry points of NeMo, icefall, ESPnet, WeNet,
SpeechBrain, transformers, fairseq and torchaudio (rebuilt by ``scripts/corpus/build.py``
from the toolkits' trees), each with how it is launched, the trigger-relevant modules it
imports, the file that marks its checkout's root, and a label. The policy is scored in
two views: the command line alone (what ``autoalloc explain`` sees) and a run (the command
line plus the modules the script imports). Every checkout is modelled by its marker file
in a temporary directory, so the import fallback's "inside a toolkit checkout" test sees
what it would see in a real clone. Run with ``-s`` to see the per-toolkit table.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from autoalloc import entrypoint, plan, sources, wrappers
from autoalloc.decide import decide
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import first_match
from autoalloc.policy import LayerConfig, Policy, Source, compose
from autoalloc.torchinfo import TorchInfo
from tests.helpers import validate

CORPUS_FILE = Path(__file__).parent / "corpus" / "entrypoints.json"
ROWS: list[dict] = json.loads(CORPUS_FILE.read_text(encoding="utf-8"))["rows"]
LABELS = ("TRAIN", "OFF", "OTHER", "AMBIGUOUS")
OFF_RULES = ("audio-training",)
PRECISION_GOAL = 0.97
RECALL_GOAL = 0.95
UNLISTED_GOAL = 0.95  # precision and recall on programs no rule names (run view)
PY = "/venv/bin/python"
TORCH = TorchInfo("2.13.0", cuda="12.8")


def builtin_policy(enable: Iterable[str] = ()) -> Policy:
    """The built-in layer alone, plus a user layer that turns ``enable`` on."""
    data = sources.parse_toml(Path(sources.BUILTIN_PATH).read_bytes())
    configs = [validate(data, Source("builtin", sources.BUILTIN_PATH))]
    if enable:
        configs.append(LayerConfig(Source("user", "<test>"), enable=tuple(enable)))
    return compose(configs)


Outcome = tuple[str, "str | None"]  # the decision's action and rule


def decision_for(
    policy: Policy, row: dict, root: Path, imported: Iterable[str], trains: bool = False
) -> Outcome:
    """What the decision pipeline decides for the process ``row`` describes, from ``policy``
    alone: ``autoalloc.plan``'s steps after it has read the layers. The one call into
    autoalloc: repoint it when the pipeline's API changes."""
    cwd = str(root / row["toolkit"] / row["cwd"])
    argv = row["argv"]
    if argv[0] != "-m" and not argv[0].endswith(".py"):
        argv = [f"/venv/bin/{argv[0]}", *argv[1:]]  # a console script: torchrun, fairseq-train
    entry = entrypoint.parse([PY, *argv], cwd)
    target = wrappers.unwrap(entry, sources.builtin_wrappers(), cwd, None).entry
    decision = decide(
        policy, plan.utf8_entry(target), {}, TORCH, {*imported, "torch"}, trains=trains
    )
    return decision.action, decision.rule


def imported_modules(row: dict) -> set[str]:
    """The row's imports with their parent packages, as ``sys.modules`` would hold them."""
    out = set()
    for name in row["imports"]:
        parts = name.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return out


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory per toolkit holding only the file that marks its checkout's root."""
    root = tmp_path_factory.mktemp("checkouts")
    for toolkit, marker in {(r["toolkit"], r["marker"]) for r in ROWS}:
        path = root / toolkit / marker
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root


Decisions = dict[str, Outcome]  # row id -> what was decided


def decisions(policy: Policy, root: Path, run: bool) -> Decisions:
    """The deciding rule for every row, in one view."""
    return {
        r["id"]: decision_for(policy, r, root, imported_modules(r) if run else ()) for r in ROWS
    }


@pytest.fixture(scope="module")
def views(checkouts: Path) -> dict[str, Decisions]:
    """Each view computed once: the built-in policy on the command line and in a run, and
    the command line with the off rules enabled."""
    builtin = builtin_policy()
    return {
        "command line": decisions(builtin, checkouts, run=False),
        "run": decisions(builtin, checkouts, run=True),
        "enabled": decisions(builtin_policy(OFF_RULES), checkouts, run=False),
    }


def applies(outcome: Outcome) -> bool:
    return outcome[0] == "apply"


def score(decided: Decisions, positive: str = "TRAIN") -> dict[str, Counter]:
    """Confusion counts per toolkit (and ``all``); AMBIGUOUS rows are left out."""
    table: dict[str, Counter] = {}
    for row in ROWS:
        if row["label"] == "AMBIGUOUS":
            continue
        got, want = applies(decided[row["id"]]), row["label"] == positive
        cell = ("TP" if want else "FP") if got else ("FN" if want else "TN")
        for key in (row["toolkit"], "all"):
            table.setdefault(key, Counter())[cell] += 1
    return table


def ratios(c: Counter) -> tuple[float, float]:
    precision = c["TP"] / (c["TP"] + c["FP"]) if c["TP"] + c["FP"] else 1.0
    recall = c["TP"] / (c["TP"] + c["FN"]) if c["TP"] + c["FN"] else 1.0
    return precision, recall


def render(title: str, table: dict[str, Counter]) -> str:
    lines = [
        title,
        f"{'toolkit':<13}{'TP':>6}{'FP':>6}{'FN':>6}{'TN':>6}{'precision':>11}{'recall':>8}",
    ]
    for key in sorted(table, key=lambda k: (k == "all", k)):
        c = table[key]
        p, r = ratios(c)
        lines.append(
            f"{key:<13}{c['TP']:>6}{c['FP']:>6}{c['FN']:>6}{c['TN']:>6}{p:>11.3f}{r:>8.3f}"
        )
    return "\n".join(lines)


def misses(decided: Decisions) -> list[str]:
    out = []
    for row in ROWS:
        got = applies(decided[row["id"]])
        if row["label"] != "AMBIGUOUS" and got != (row["label"] == "TRAIN"):
            out.append(f"{row['label']:<6} {'applied' if got else 'missed':<8}{row['id']}")
    return out


def test_corpus_is_well_formed() -> None:
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    assert {r["toolkit"] for r in ROWS} == {
        "nemo",
        "icefall",
        "espnet",
        "wenet",
        "speechbrain",
        "transformers",
        "fairseq",
        "torchaudio",
    }
    for row in ROWS:
        assert row["label"] in LABELS, row["id"]
        assert row["argv"] and not Path(row["cwd"]).is_absolute(), row["id"]
        assert not Path(row["marker"]).is_absolute() and ".." not in row["marker"], row["id"]
    counts = Counter(r["label"] for r in ROWS)
    assert len(ROWS) > 1500 and counts["TRAIN"] > 250, counts


@pytest.mark.parametrize("view", ["command line", "run"])
def test_builtin_policy_scores_on_the_corpus(views: dict[str, Decisions], view: str) -> None:
    table = score(views[view])
    title = "a run (command line + imports)" if view == "run" else "the command line alone"
    shown = render(f"built-in policy, {title}:", table)
    print("\n" + shown)
    precision, recall = ratios(table["all"])
    detail = "\n".join([shown, *misses(views[view])])
    assert precision >= PRECISION_GOAL, detail
    assert recall >= RECALL_GOAL, detail


def test_off_rules_cover_the_other_speech_trainers_once_enabled(
    views: dict[str, Decisions],
) -> None:
    """``enable`` turns the other-task rules on: they then catch those trainers."""
    assert score(views["command line"], positive="OFF")["all"]["TP"] == 0  # off by default
    table = score(views["enabled"], positive="OFF")
    print("\n" + render("with enable = the three off rules, OFF rows as positives:", table))
    assert ratios(table["all"])[1] >= 0.9, render("OFF rows", table)
    # speech-to-text trainers still apply (precision above counts them as false positives)
    trained = [r["id"] for r in ROWS if r["label"] == "TRAIN"]
    caught = sum(applies(views["enabled"][i]) for i in trained)
    assert caught / len(trained) >= RECALL_GOAL


def test_import_fallback_stays_out_of_toolkit_checkouts(
    views: dict[str, Decisions], checkouts: Path
) -> None:
    """Inside a checkout the import fallback never decides; the same script elsewhere gets it
    once it builds an optimizer (importing a toolkit alone is not training)."""
    triggers = {"nemo.collections.asr", "icefall", "espnet2.train.trainer"}
    inside = [r for r in ROWS if triggers & imported_modules(r)]
    assert sum(r["label"] == "OTHER" for r in inside) > 100  # decoders, aligners, data prep
    for row in inside:
        assert views["run"][row["id"]][1] != "asr-toolkit-imports", row["id"]
    moved = dict(inside[0], cwd="", argv=["/home/user/my_project/notebook_train.py"])
    imported = imported_modules(moved)
    assert decision_for(builtin_policy(), moved, checkouts, imported) == ("none", None)
    assert decision_for(builtin_policy(), moved, checkouts, imported, trains=True) == (
        "apply",
        "asr-toolkit-imports",
    )


# ---------------------------------------------------------------- programs no rule names

# tests/corpus/unlisted.json: entry points of public trees that no built-in rule names, each with
# the modules its run reaches (its imports, followed through the tree's own modules), whether it
# builds an optimizer, and a label read from its code: TRAIN (speech-to-text training), AUDIO
# (other audio training: TTS, vocoders, codecs, separation, enhancement, speaker, VAD, audio
# classification, music), OTHER (inference, export, evaluation, data preparation, text models),
# AMBIGUOUS (left out). Scored in the run view: the built-in policy decides with those modules
# imported, once the optimizer is built if it is.
UNLISTED: list[dict] = json.loads(
    (Path(__file__).parent / "corpus" / "unlisted.json").read_text(encoding="utf-8")
)["entries"]
# The trees the signals were chosen on (their labels and imports were read while choosing);
# of the trees added later, those whose name hashes odd were held out: never looked at to tune.
TUNED_ON = frozenset({
    "modelscope/FunASR", "FunAudioLLM/SenseVoice", "X-LANCE/SLAM-LLM", "bytedance/SALMONN",
    "fixie-ai/ultravox", "huggingface/distil-whisper", "yeyupiaoling/Whisper-Finetune",
    "jonatasgrosman/huggingsound", "openspeech-team/openspeech", "SeanNaren/deepspeech.pytorch",
    "sooftware/kospeech", "hirofumi0810/neural_sp", "thu-spmi/CAT",
    "facebookresearch/seamless_communication",
})  # fmt: skip


def held_out(repo: str) -> bool:
    return repo not in TUNED_ON and hashlib.sha256(repo.encode()).digest()[0] % 2 == 1


def unlisted_rule(policy: Policy, row: dict) -> str | None:
    """The apply rule that decides for ``row`` in a run (None: none applies)."""
    path = f"/src/{row['repo'].split('/')[1]}/{row['path']}"
    entry = EntryPoint("script", path, tuple(row["launch"]["argv"][1:]), path, path)
    imported = imported_modules({"imports": [*row["reaches"], *row["imports"]]})
    match = first_match(policy.rules, entry, imported, trains=row["optimizer"])
    return match.rule.name if match.rule is not None and match.rule.action == "apply" else None


def unlisted_score(
    policy: Policy, positive: str, rule: str | None = None
) -> tuple[dict[str, Counter], list[str]]:
    """Confusion counts per tree, ``tuned``, ``held out`` and ``all``, and the misses:
    ``positive`` rows against the rows that get the option (from ``rule`` only, if named)."""
    table: dict[str, Counter] = {}
    wrong = []
    for row in UNLISTED:
        if row["label"] == "AMBIGUOUS":
            continue
        decided = unlisted_rule(policy, row)
        got = decided is not None and (rule is None or decided == rule)
        want = row["label"] == positive
        cell = ("TP" if want else "FP") if got else ("FN" if want else "TN")
        part = "held out" if held_out(row["repo"]) else "tuned"
        for key in (row["repo"], part, "all"):
            table.setdefault(key, Counter())[cell] += 1
        if got != want:
            wrong.append(f"{row['label']:<6} {decided or 'none':<16} {row['repo']} {row['path']}")
    return table, wrong


def render_unlisted(title: str, table: dict[str, Counter]) -> str:
    order = sorted(table, key=lambda k: (k in ("tuned", "held out", "all"), k == "all", k))
    lines = [title, f"{'tree':<44}{'TP':>5}{'FP':>5}{'FN':>5}{'TN':>5}{'P':>7}{'R':>7}"]
    for key in order:
        c = table[key]
        p, r = ratios(c)
        mark = " (held out)" if key not in ("tuned", "held out", "all") and held_out(key) else ""
        name = f"{key}{mark}"
        lines.append(
            f"{name:<44}{c['TP']:>5}{c['FP']:>5}{c['FN']:>5}{c['TN']:>5}{p:>7.3f}{r:>7.3f}"
        )
    return "\n".join(lines)


def test_unlisted_corpus_is_well_formed() -> None:
    assert {row["label"] for row in UNLISTED} <= {"TRAIN", "AUDIO", "OTHER", "AMBIGUOUS"}
    for row in UNLISTED:
        assert isinstance(row["optimizer"], bool) and row["reaches"] is not None, row["path"]
    assert len({row["repo"] for row in UNLISTED}) >= 14


# Programs that get the option without being speech-to-text trainers, each read and explained:
# where the imports cannot tell them apart. Any other false positive fails the test.
KNOWN_FALSE_POSITIVES = {
    # text language-model trainers inside speech toolkits: they import the toolkit, and with it
    # its audio stack and its speech-to-text libraries
    ("openspeech-team/openspeech", "openspeech_cli/hydra_lm_train.py"),
    ("thu-spmi/CAT", "cat/lm/train.py"),
    ("thu-spmi/CAT", "cat/lm/trf/train.py"),
    # SLAM-LLM's captioning, music, emotion, spatial-audio and TTS trainers run the same pipeline
    # (and so import the same modules) as its ASR trainers: only their configs differ
    ("X-LANCE/SLAM-LLM", "examples/aac_audiocaps/finetune_aac.py"),
    ("X-LANCE/SLAM-LLM", "examples/drcap_zeroshot_aac/finetune_drcap.py"),
    ("X-LANCE/SLAM-LLM", "examples/mc_musiccaps/deepspeed_finetune_mir.py"),
    ("X-LANCE/SLAM-LLM", "examples/mc_musiccaps/finetune_mir.py"),
    ("X-LANCE/SLAM-LLM", "examples/sec_emotioncaps/finetune_sec.py"),
    ("X-LANCE/SLAM-LLM", "examples/seld_spatialsoundqa/finetune_seld.py"),
    ("X-LANCE/SLAM-LLM", "examples/slam_aac/finetune_aac.py"),
    ("X-LANCE/SLAM-LLM", "examples/vallex/finetune_vallex.py"),
    # a CLAP (contrastive audio-text) trainer: audio in, and text in too, through a text model
    ("open-mmlab/Amphion", "models/tta/picoaudio/picoaudio/audioldm/clap/training/lp_main.py"),
    ("open-mmlab/Amphion", "models/tta/picoaudio/picoaudio/audioldm/clap/training/main.py"),
    # a Qwen2.5-VL training benchmark: LLaMA-Factory's trainer imports torchaudio for its
    # multimodal plugin whatever the model (its text and vision fine-tuning are AMBIGUOUS rows)
    ("hiyouga/LLaMA-Factory", "scripts/bench_qwen.py"),
}


def precision_by_kind(policy: Policy) -> dict[str, tuple[int, int]]:
    """Speech-to-text trainers caught (``recall``) and, for each kind of other program, how
    many get the option: (count getting it, count of that kind). Kinds: programs that build
    no optimizer; programs that train but do no audio work (text models); other audio
    trainers."""
    kinds: dict[str, list[int]] = {k: [0, 0] for k in ("recall", "no optimizer", "no audio work",
                                                       "other audio training")}
    for row in UNLISTED:
        if row["label"] == "AMBIGUOUS":
            continue
        got = unlisted_rule(policy, row) is not None
        if row["label"] == "TRAIN":
            kind = "recall"
        elif row["label"] == "AUDIO":
            kind = "other audio training"
        else:
            kind = "no audio work" if row["optimizer"] else "no optimizer"
        kinds[kind][0] += got
        kinds[kind][1] += 1
    return {k: (v[0], v[1]) for k, v in kinds.items()}


def test_precision_apart_by_kind_of_program() -> None:
    """No program that builds no optimizer gets the option; text-model trainers and other
    audio trainers that do are counted apart (the figures docs/recognition.md quotes)."""
    kinds = precision_by_kind(builtin_policy())
    tp = kinds["recall"][0]
    shown = {k: (got, n, round(tp / (tp + got), 3) if k != "recall" else round(got / n, 3))
             for k, (got, n) in kinds.items()}
    print("\n" + "\n".join(f"{k:<22} {g:>4} of {n:<5} {r}" for k, (g, n, r) in shown.items()))
    assert kinds["no optimizer"][0] == 0
    # the text language-model trainers inside speech toolkits, and LLaMA-Factory's benchmark:
    # KNOWN_FALSE_POSITIVES explains each
    assert kinds["no audio work"][0] == 4
    assert kinds["recall"] == (43, 55)


def test_the_default_policy_on_programs_no_rule_names() -> None:
    """Speech-to-text trainers get the option; of the rest (other audio trainers, inference,
    export, data preparation), only programs known to import what speech-to-text trainers do."""
    table, wrong = unlisted_score(builtin_policy(), "TRAIN")
    shown = render_unlisted("built-in policy, run view, TRAIN rows as positives:", table)
    print("\n" + shown + "\n" + "\n".join(wrong))
    first = [row for row in UNLISTED if row["set"] == "unlisted"]  # unlisted_labels.toml's trees
    assert set(unexplained_false_positives(first)) <= KNOWN_FALSE_POSITIVES, shown


def unexplained_false_positives(rows: list[dict]) -> list[tuple[str, str]]:
    """Rows that get the option from the default policy without being speech-to-text trainers,
    and that KNOWN_FALSE_POSITIVES does not explain."""
    policy = builtin_policy()
    return [
        (row["repo"], row["path"])
        for row in rows
        if row["label"] not in ("TRAIN", "AMBIGUOUS")
        and unlisted_rule(policy, row)
        and (row["repo"], row["path"]) not in KNOWN_FALSE_POSITIVES
    ]


@pytest.mark.xfail(
    strict=True,
    reason="4 speaker trainers of wenet-e2e/wespeaker (held out: not read) get the option",
)
def test_speech_training_precision_with_audio_trainers() -> None:
    """Of the other audio trainers (TTS, vocoders, codecs, separation, enhancement, speaker,
    KWS, classification) and the inference/export tools, none gets the option by default
    beyond the known false positives."""
    assert unexplained_false_positives(UNLISTED) == []


@pytest.mark.xfail(
    strict=True,
    reason="measured 0.782 (43 of 55 trainers; 0.841 on the trees the signals were chosen on, "
    "0.545 on the held-out ones): trainers that import no audio library (Kaldi-IO in their own "
    "code, scipy.io.wavfile, OpenCV lip reading) or nothing that handles text targets (their "
    "own character vocabulary)",
)
def test_the_default_policy_recall_goal() -> None:
    table, _ = unlisted_score(builtin_policy(), "TRAIN")
    assert ratios(table["all"])[1] >= UNLISTED_GOAL


@pytest.mark.xfail(
    strict=True,
    reason="measured 0.705 (43 TP, 18 FP: the 14 known false positives above and 4 held-out "
    "speaker trainers; 0.725 on the trees the signals were chosen on, 0.600 on the held-out ones)",
)
def test_the_default_policy_precision_goal() -> None:
    table, _ = unlisted_score(builtin_policy(), "TRAIN")
    assert ratios(table["all"])[0] >= UNLISTED_GOAL


def best_in_run_view(positive: str) -> tuple[float, float, set[str]]:
    """The best precision and recall that any decision made from a program's modules and its
    optimizer can reach on the corpus, with the trees whose programs it cannot tell apart.

    Programs with the same modules and the same optimizer answer get the same decision,
    whatever the rule; a group that mixes ``positive`` rows with others costs false
    positives if it gets the option and misses if not. Every way of deciding the mixed
    groups is tried (the pure ones are decided right); the best is the one whose lower
    figure is highest."""
    groups: dict[tuple, list[dict]] = {}
    for row in UNLISTED:
        if row["label"] != "AMBIGUOUS":
            key = (frozenset([*row["reaches"], *row["imports"]]), row["optimizer"])
            groups.setdefault(key, []).append(row)
    total = sum(row["label"] == positive for rows in groups.values() for row in rows)
    mixed = [rows for rows in groups.values() if len({r["label"] == positive for r in rows}) > 1]
    assert len(mixed) <= 16, "every way of deciding them is tried: decide groups one by one"
    counts = [(sum(r["label"] == positive for r in rows), sum(r["label"] != positive for r in rows))
              for rows in mixed]  # fmt: skip
    best = (0.0, 0.0)
    for choice in itertools.product((False, True), repeat=len(mixed)):
        tp = total - sum(want for (want, _), on in zip(counts, choice) if not on)
        fp = sum(other for (_, other), on in zip(counts, choice) if on)
        found = (tp / (tp + fp) if tp + fp else 1.0, tp / total)
        best = max(best, found, key=min)
    return best[0], best[1], {r["repo"] for rows in mixed for r in rows}


def test_no_decision_from_modules_and_optimizer_reaches_the_goal_on_this_corpus() -> None:
    """Why the TRAIN goal tests above fail for any rule that decides from what a run imports
    and whether it trains: SLAM-LLM's ASR trainers and its music and emotion captioning
    trainers, CAT's CTC/RNN-T and language-model trainers, fairseq2's wav2vec2 and
    language-model recipes reach exactly the same modules and all build an optimizer (what
    differs is chosen at run time: configs, model classes; and their script paths, names);
    at best 0.929 / 0.945. For ``audio-training`` the same bound is 0.984: its gap is the
    signals', not the view's."""
    precision, recall, trees = best_in_run_view("TRAIN")
    assert (round(precision, 3), round(recall, 3)) == (0.929, 0.945)
    assert min(precision, recall) < UNLISTED_GOAL
    assert trees == {"X-LANCE/SLAM-LLM", "thu-spmi/CAT", "facebookresearch/fairseq2"}
    assert min(best_in_run_view("AUDIO")[:2]) >= UNLISTED_GOAL


def test_audio_training_once_enabled_on_programs_no_rule_names() -> None:
    """``enable = ["audio-training"]``: off by default; once enabled, the speech-to-text
    trainers keep their rule, and what audio-training decides for is other audio training."""
    policy = builtin_policy(OFF_RULES)
    audio = [row for row in UNLISTED if row["label"] == "AUDIO"]
    assert all(unlisted_rule(builtin_policy(), row) != "audio-training" for row in audio)
    table, wrong = unlisted_score(policy, "AUDIO", rule="audio-training")
    shown = render_unlisted("audio-training enabled, AUDIO rows as positives:", table)
    print("\n" + shown + "\n" + "\n".join(wrong))
    assert ratios(table["all"])[0] >= UNLISTED_GOAL, shown
    trainers = [row for row in UNLISTED if row["label"] == "TRAIN"]
    caught = [r for r in trainers if unlisted_rule(builtin_policy(), r) == "speech-training"]
    kept = [row for row in caught if unlisted_rule(policy, row) == "speech-training"]
    assert len(caught) >= 40 and kept == caught  # how many it catches: the recall goal above


@pytest.mark.xfail(
    strict=True,
    reason="measured 0.823 (102 of 124; 0.810 tuned, 0.850 held out): SLAM-LLM's 9 import what "
    "its ASR trainers do (speech-training decides), and trainers whose audio modules a Hydra or "
    "YAML config names (Matcha-TTS, fish-speech, FastSpeech2, emotion2vec, ...) reach none "
    "statically",
)
def test_audio_training_recall_goal() -> None:
    table, _ = unlisted_score(builtin_policy(OFF_RULES), "AUDIO", rule="audio-training")
    assert ratios(table["all"])[1] >= UNLISTED_GOAL
