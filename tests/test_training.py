"""The ``training`` condition and the built-in ``speech-training`` rule.

In process: the rule scored on the first set of tests/corpus/unlisted.json (entry points of
speech toolkits no other built-in rule names; the trees added since, with audio trainers outside
speech-to-text, are scored in tests/test_corpus.py), the condition's policy syntax, ``explain --trains``, the
``adaptive`` key's provenance. End to end (real torch, subprocesses): a speech fine-tuning
script gets the option once it builds its optimizer; without the speech stack, or without an
optimizer, nothing; deny rules, AUTOALLOC_DISABLE, DataLoader workers and torchrun ranks.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from autoalloc import sources
from autoalloc.decide import decide
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import first_match
from autoalloc.policy import PolicyError, Source, compose
from autoalloc.torchinfo import TorchInfo
from tests.helpers import (
    ES,
    Sandbox,
    assert_applied,
    assert_untouched,
    autoalloc_warnings,
    validate,
)

CORPUS = [
    row
    for row in json.loads((Path(__file__).parent / "corpus" / "unlisted.json").read_text())["entries"]
    if row["set"] == "unlisted"  # labelled in tests/corpus/unlisted_labels.toml
]
BUILTIN = validate(
    sources.parse_toml(Path(sources.BUILTIN_PATH).read_bytes()),
    Source("builtin", sources.BUILTIN_PATH),
)
POLICY = compose([BUILTIN])
TORCH = TorchInfo("2.13.0", cuda="12.8")


def _entry(row: dict) -> EntryPoint:
    path = f"/src/{row['repo'].split('/')[1]}/{row['path']}"
    return EntryPoint("script", path, tuple(row["launch"]["argv"][1:]), path, path)


def _imported(row: dict) -> set[str]:
    """Every module a run reaches, with its parent packages (importing a.b imports a)."""
    out = set()
    for name in row["reaches"]:
        parts = name.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def _predicted(row: dict, trains: bool, imports: bool = True) -> bool:
    imported = _imported(row) if imports else set()
    match = first_match(POLICY.rules, _entry(row), imported, trains and row["optimizer"])
    return match.rule is not None and match.rule.action == "apply"


def _score(trains: bool, imports: bool = True) -> tuple[int, int, int, int]:
    """True/false positives, false/true negatives of the built-in policy on the corpus."""
    tp = fp = fn = tn = 0
    for row in CORPUS:
        if row["label"] not in ("TRAIN", "OTHER"):  # AUDIO: scored in tests/test_corpus.py
            continue
        predicted, train = _predicted(row, trains, imports), row["label"] == "TRAIN"
        tp += predicted and train
        fp += predicted and not train
        fn += train and not predicted
        tn += not predicted and not train
    return tp, fp, fn, tn


def test_the_corpus_covers_the_trees() -> None:
    trees = {row["repo"] for row in CORPUS}
    assert len(trees) == 14 and len(CORPUS) == 352
    assert sum(row["label"] == "TRAIN" for row in CORPUS) == 34
    assert sum(row["label"] == "AUDIO" for row in CORPUS) == 10


def test_names_alone_miss_these_toolkits() -> None:
    # command line and import triggers, as before this rule: no optimizer seen
    assert _score(trains=False)[:3] == (0, 0, 34)


def test_speech_training_scores_on_unlisted_toolkits() -> None:
    tp, fp, fn, tn = _score(trains=True)
    assert (tp, fp, fn, tn) == (34, 3, 0, 305)  # precision 0.919, recall 1.000
    assert tp / (tp + fp) > 0.9 and tp / (tp + fn) == 1.0


def test_the_false_positives_are_text_lm_trainers_inside_speech_toolkits() -> None:
    others = [row for row in CORPUS if row["label"] == "OTHER"]
    wrong = [row["path"] for row in others if _predicted(row, trains=True)]
    assert wrong == ["openspeech_cli/hydra_lm_train.py", "cat/lm/train.py", "cat/lm/trf/train.py"]


def test_importing_the_stack_without_an_optimizer_is_not_enough() -> None:
    # inference, export and data preparation import the stack too: the optimizer tells them apart
    stack = {n for r in POLICY.rules if r.name == "speech-training" for n in r.imports}
    quiet = [row for row in CORPUS if row["label"] == "OTHER" and not row["optimizer"]]
    with_stack = [row for row in quiet if stack & _imported(row)]
    assert len(with_stack) > 150
    assert not any(_predicted(row, trains=True) for row in quiet)


def test_every_trainer_imports_a_listed_module() -> None:
    stack = {n for r in POLICY.rules if r.name == "speech-training" for n in r.imports}
    trainers = [row for row in CORPUS if row["label"] == "TRAIN"]
    missing = [row["path"] for row in trainers if not stack & _imported(row)]
    assert missing == []


# ------------------------------------------------------------------ the policy syntax


def _layer(text: str):
    return validate(sources.parse_toml(text.encode()), Source("project", "/p/autoalloc.toml"))


def test_training_rule_syntax() -> None:
    layer = _layer('[[rules]]\nname = "t"\ntraining = true\n')
    assert layer.rules[0].training is True
    with pytest.raises(PolicyError, match="training must be true or false"):
        _layer('[[rules]]\nname = "t"\ntraining = "yes"\n')
    with pytest.raises(PolicyError, match="needs at least one of"):
        _layer('[[rules]]\nname = "t"\ntraining = false\n')


def test_training_combines_with_imports_and_scripts_like_argv() -> None:
    layer = _layer(
        '[[rules]]\nname = "both"\ntraining = true\nimports = ["mykit"]\n'
        '[[rules]]\nname = "named"\ntraining = true\nscripts = ["run.py"]\n'
    )
    rules = compose([layer]).rules
    run = EntryPoint("script", "/w/run.py", (), "/w/run.py", "/w/run.py")
    other = EntryPoint("script", "/w/x.py", (), "/w/x.py", "/w/x.py")
    assert first_match(rules, other, {"mykit"}).rule is None
    assert first_match(rules, other, {"mykit"}, trains=True).rule.name == "both"
    assert first_match(rules, other, set(), trains=True).rule is None
    assert first_match(rules, run, set()).rule is None
    found = first_match(rules, run, set(), trains=True)
    assert found.rule.name == "named" and "builds an optimizer" in found.reason


def test_deny_rules_still_win() -> None:
    entry = EntryPoint("script", "/w/finetune.py", (), "/w/finetune.py", "/w/finetune.py")
    decision = decide(POLICY, entry, {}, TORCH, {"torchaudio", "vllm"}, trains=True)
    assert (decision.action, decision.rule) == ("skip", "llm-serving")
    decision = decide(POLICY, entry, {}, TORCH, {"torchaudio", "transformers"}, trains=True)
    assert (decision.action, decision.rule) == ("apply", "speech-training")
    assert decide(POLICY, entry, {}, TORCH, {"torchaudio", "transformers"}).action == "none"


def test_not_inside_a_checkout_with_rules_of_its_own(tmp_path: Path) -> None:
    # a renamed NeMo checkout: its TTS trainer imports torchaudio and builds an optimizer, and
    # stays off (audio-training is off until enabled); the same script outside a checkout applies
    (tmp_path / "mynemo" / "nemo").mkdir(parents=True)
    (tmp_path / "mynemo" / "nemo" / "package_info.py").write_text("")
    inside = str(tmp_path / "mynemo" / "examples" / "tts" / "fastpitch.py")
    outside = str(tmp_path / "elsewhere" / "fastpitch.py")
    for path, action in ((inside, "none"), (outside, "apply")):
        entry = EntryPoint("script", path, (), path, path)
        assert decide(POLICY, entry, {}, TORCH, {"torchaudio", "transformers"}, trains=True).action == action


def test_adaptive_key_and_its_source() -> None:
    assert POLICY.adaptive.value == "off" and POLICY.adaptive.source is None
    layer = _layer('adaptive = "advise"\n')
    policy = compose([BUILTIN, layer])
    assert policy.adaptive.value == "advise" and policy.adaptive.source.path == "/p/autoalloc.toml"
    with pytest.raises(PolicyError, match="adaptive must be"):
        _layer('adaptive = "yes"\n')


# ------------------------------------------------------------------ end to end, real torch

# An audio stack (soundfile, installed with lhotse in the test venv) and a text-target library
# (jiwer, the WER scorer: an empty stand-in beside the script, see speech_script)
STACK_LINE = "import soundfile, jiwer"
SPEECH_FINETUNE = textwrap.dedent(f"""
    {STACK_LINE}
    import torch
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
""")


# The same, its optimizer built by a module of its own: the script's source alone does not
# show the training, so the run decides at the first optimizer.
LATE_FINETUNE = SPEECH_FINETUNE.replace("opt = torch.optim.AdamW(model.parameters(), lr=1e-3)",
                                        "import trainer\nopt = trainer.optimizer(model)")
TRAINER = "import torch\n\n\ndef optimizer(model):\n    return torch.optim.SGD(model.parameters(), lr=0.1)\n"


def speech_script(sandbox: Sandbox, name: str, body: str) -> Path:
    """``body`` as script ``name``, with an empty ``jiwer`` package beside it (not in the venv)
    and an own ``trainer`` module that builds an optimizer."""
    sandbox.write("jiwer/__init__.py", "")
    sandbox.write("trainer.py", TRAINER)
    return sandbox.script(name, body)


def test_speech_finetune_gets_the_option_once_it_builds_an_optimizer(sandbox: Sandbox) -> None:
    before = "import os, soundfile, torch\nprint('BEFORE', os.environ.get('AUTOALLOC_APPLIED'))\n"
    speech_script(sandbox, "finetune.py", before + LATE_FINETUNE)
    result = sandbox.run(["finetune.py"], env={"AUTOALLOC_DEBUG": "1"})
    assert "BEFORE None" in result.stdout  # nothing before the optimizer is built
    assert_applied(result, "speech-training")
    assert "module soundfile is imported with jiwer (none of its not_imports is) and it builds an optimizer" in result.stderr
    assert "via the runtime setter" in result.stderr


@pytest.mark.slow  # the merged string through the setter: the DataLoader test below
def test_a_training_rule_of_ones_own_on_each_build(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.user_policy('[[rules]]\nname = "mine"\ntraining = true\nimports = ["json"]\n')
    sandbox.script("finetune.py", SPEECH_FINETUNE.replace(STACK_LINE, "import json"))
    result = sandbox.run(["finetune.py"], python=torch_python,
                         env={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"})
    # the full merged string went to the setter: what the CUDA allocator parsed says so too
    assert_applied(result, "mine", expected=f"garbage_collection_threshold:0.6,{ES}")


@pytest.mark.slow  # in process above; the TTS trainer below is left alone end to end
def test_without_the_speech_stack_untouched(sandbox: Sandbox) -> None:
    speech_script(sandbox, "finetune.py", SPEECH_FINETUNE.replace(STACK_LINE, "import json, jiwer"))
    assert_untouched(sandbox.run(["finetune.py"]))


@pytest.mark.slow  # other audio training left alone: the TTS trainer below
def test_an_audio_stack_without_text_targets_untouched(sandbox: Sandbox) -> None:
    # a vocoder or enhancement trainer: audio in, audio out, nothing that handles text
    sandbox.script("finetune.py", SPEECH_FINETUNE.replace(STACK_LINE, "import soundfile"))
    assert_untouched(sandbox.run(["finetune.py"]))


@pytest.mark.slow  # no optimizer, left alone: the export below
def test_inference_with_the_stack_but_no_optimizer_untouched(sandbox: Sandbox) -> None:
    body = "import soundfile, torch\nmodel = torch.nn.Linear(4, 2)\nmodel(torch.randn(1, 4))\n"
    sandbox.script("transcribe.py", body)
    assert_untouched(sandbox.run(["transcribe.py"]))


@pytest.mark.slow  # in process: test_deny_rules_still_win
def test_deny_rule_wins_over_training(sandbox: Sandbox) -> None:
    sandbox.user_policy('[[rules]]\nname = "no-x"\naction = "skip"\nimports = ["json"]\n')
    speech_script(sandbox, "finetune.py", "import json\n" + SPEECH_FINETUNE)
    result = sandbox.run(["finetune.py"])
    assert_untouched(result)
    assert result.stderr == ""


@pytest.mark.slow  # AUTOALLOC_DISABLE end to end: test_e2e_core
def test_autoalloc_disable_turns_training_off(sandbox: Sandbox) -> None:
    speech_script(sandbox, "finetune.py", SPEECH_FINETUNE)
    result = sandbox.run(["finetune.py"], env={"AUTOALLOC_DISABLE": "1"})
    assert_untouched(result)
    assert result.stderr == ""


def _site(sandbox: Sandbox, *packages: str) -> dict[str, str]:
    """Empty stand-in packages (``nemo.collections.asr``, ``phonemizer``) under ``site``, for
    libraries the test venv does not have; returns the env that puts them on sys.path."""
    for package in packages:
        parts = package.split(".")
        for i in range(1, len(parts) + 1):
            sandbox.write(f"site/{'/'.join(parts[:i])}/__init__.py", "")
    return {"PYTHONPATH": str(sandbox.work / "site")}


@pytest.mark.slow  # the outweighing is checked in process (test_builtin_policy) and on the corpus
def test_a_speech_to_text_trainer_with_text_targets(sandbox: Sandbox) -> None:
    # a TTS front-end pulled in too (a toolkit's text normaliser): the WER scorer outweighs it
    env = _site(sandbox, "jiwer", "pyopenjtalk")
    sandbox.write("trainer.py", TRAINER)  # decided at the first optimizer: the reason shown
    sandbox.script("finetune.py", "import jiwer, pyopenjtalk\n" + LATE_FINETUNE)
    result = sandbox.run(["finetune.py"], env={**env, "AUTOALLOC_DEBUG": "1"})
    assert_applied(result, "speech-training")
    assert "pyopenjtalk of its not_imports too, outweighed by jiwer" in result.stderr


@pytest.mark.slow  # decided in test_builtin_policy (TRAINS); coqui trainers: test_real_libraries
def test_a_tts_trainer_is_off_until_audio_training_is_enabled(sandbox: Sandbox) -> None:
    env = _site(sandbox, "phonemizer", "auraloss")
    body = "import phonemizer, auraloss, soundfile\n" + SPEECH_FINETUNE.replace(STACK_LINE, "")
    sandbox.script("train_tts.py", body)
    assert_untouched(sandbox.run(["train_tts.py"], env=env))
    sandbox.user_policy('enable = ["audio-training"]\n')
    assert_applied(sandbox.run(["train_tts.py"], env=env), "audio-training")


# the full run: test_checkout_e2e::test_own_script_importing_the_toolkit_gets_the_fallback
# applies the trigger end to end; test_builtin_policy's IMPORTS cases leave a toolkit import
# without an optimizer alone (in process)
@pytest.mark.slow
def test_an_asr_toolkit_import_without_an_optimizer_is_left_alone(sandbox: Sandbox) -> None:
    env = _site(sandbox, "nemo.collections.asr")
    export = "import nemo.collections.asr, torch\ntorch.nn.Linear(4, 2)(torch.randn(1, 4))\n"
    sandbox.script("export_nemo.py", export)
    assert_untouched(sandbox.run(["export_nemo.py"], env=env))
    sandbox.script("train_nemo.py", SPEECH_FINETUNE.replace(STACK_LINE, "import nemo.collections.asr"))
    assert_applied(sandbox.run(["train_nemo.py"], env=env), "asr-toolkit-imports")


WRAPPED = (
    "import torch\nprint('WRAPPED', hasattr(torch.optim.Optimizer.__init__, '_autoalloc_training'))\n"
)


def test_the_optimizer_hook_only_when_a_rule_needs_it_and_until_the_first_optimizer(
    sandbox: Sandbox,
) -> None:
    code = "opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"
    result = sandbox.run(["-c", WRAPPED + code + WRAPPED.split("\n", 1)[1]])
    assert result.stdout.split() == ["WRAPPED", "True", "WRAPPED", "False"], result.stderr
    sandbox.user_policy('disable = ["speech-training", "asr-toolkit-imports"]\n')
    result = sandbox.run(["-c", WRAPPED])
    assert "WRAPPED False" in result.stdout, result.stderr


WORKERS = """
    import os, sys
    import soundfile, jiwer, torch
    from torch.utils.data import DataLoader, Dataset

    class Data(Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, i):
            from autoalloc import hook
            d = hook.STATE.decision
            return f"{d.action if d else None}:{hook.STATE.trains}:{os.environ.get('AUTOALLOC_APPLIED')}"

    if __name__ == "__main__":
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters())
        loader = DataLoader(Data(), num_workers=2, multiprocessing_context="spawn", batch_size=None)
        print("WORKERS", sorted(set(loader)))
"""


@pytest.mark.slow  # spawned DataLoader workers: the full run, as the other multi-process runs
def test_dataloader_workers_build_nothing_and_say_nothing(sandbox: Sandbox) -> None:
    speech_script(sandbox, "finetune.py", WORKERS)
    result = sandbox.run(["finetune.py"], env={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.7"})
    assert_applied(result, "speech-training", expected=f"garbage_collection_threshold:0.7,{ES}")
    # spawned workers inherit what the trainer applied, decide nothing new, build no optimizer
    line = next(x for x in result.stdout.splitlines() if x.startswith("WORKERS"))
    assert line == f"WORKERS ['inherited:False:speech-training;garbage_collection_threshold:0.7,{ES}']"
    assert autoalloc_warnings(result.stderr) == []


@pytest.mark.slow  # a multi-process end-to-end run: the full run
def test_torchrun_every_rank_applies_and_one_message_per_job(sandbox: Sandbox) -> None:
    sandbox.user_policy(
        '[[rules]]\nname = "speech-training"\ntraining = true\nimports = ["soundfile"]\n'
        "allocator = { garbage_collection_threshold = 0.8 }\n"
    )
    body = SPEECH_FINETUNE + "import os\nprint('RANK', os.environ['RANK'])\n"
    speech_script(sandbox, "finetune.py", body)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6", "OMP_NUM_THREADS": "1"}
    result = sandbox.run([torchrun, "--standalone", "--nproc_per_node", "2", "finetune.py"], env=env, python="")
    assert result.returncode == 0, result.stderr
    probes = [line for line in result.stdout.splitlines() if line.startswith("AUTOALLOC_PROBE ")]
    assert len(probes) == 2
    for line in probes:
        probe = json.loads(line.split(" ", 1)[1])
        assert probe["getter"] == f"garbage_collection_threshold:0.6,{ES}"
        assert probe["applied"] == f"speech-training;garbage_collection_threshold:0.6,{ES}"
    # the conflict (0.6 kept over the rule's 0.8) is said once for the job, by rank 0
    (warning,) = [w for w in result.stderr.splitlines() if "garbage_collection_threshold" in w
                  and "autoalloc" in w]
    assert "0.6" in warning


def test_explain_trains(sandbox: Sandbox) -> None:
    sandbox.script("finetune.py", "")

    def explain(*flags: str) -> dict:
        result = sandbox.run(["-m", "autoalloc", "explain", "--json", *flags, "--", "python", "finetune.py"])
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    plain = explain("--import", "soundfile", "--import", "jiwer")
    assert plain["decision"]["action"] == "none"
    assert plain["training_rules"] == ["asr-toolkit-imports", "speech-training"]
    assert [item["rule"] for item in plain["late"]] == ["asr-toolkit-imports", "speech-training"]
    trained = explain("--import", "soundfile", "--import", "jiwer", "--trains")
    assert (trained["decision"]["action"], trained["decision"]["rule"]) == ("apply", "speech-training")
    assert trained["decision"]["setter_value"] == ES and trained["trains"] is True
    assert explain("--trains")["decision"]["action"] == "none"
    assert explain("--import", "soundfile", "--trains")["decision"]["action"] == "none"  # no text
    assert explain("--import", "soundfile", "--import", "vllm", "--trains")["decision"]["action"] == "skip"
    assert trained["adaptive"] == {"value": "off", "from": "default"}


def test_a_warning_at_the_first_optimizer_names_the_programs_line(sandbox: Sandbox) -> None:
    sandbox.user_policy(
        '[[rules]]\nname = "mine"\ntraining = true\nimports = ["json"]\n'
        "allocator = { garbage_collection_threshold = 0.8 }\n"
    )
    trainer = sandbox.write("trainer.py", TRAINER)  # the script alone shows no optimizer
    sandbox.script("train.py", """
        import json
        import torch
        import trainer
        opt = trainer.optimizer(torch.nn.Linear(4, 2))
    """)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    result = sandbox.run(["train.py"], env=env)
    assert_applied(result, expected=f"garbage_collection_threshold:0.6,{ES}")
    (warning,) = autoalloc_warnings(result.stderr)
    assert "keeping garbage_collection_threshold:0.6" in warning
    assert f"{trainer}:5: AutoallocWarning" in result.stderr, result.stderr


def test_a_library_that_wraps_optimizer_init_after_torch_keeps_training_rules_on(
    sandbox: Sandbox,
) -> None:
    """A library wraps ``torch.optim.Optimizer.__init__`` after ``import torch`` (over
    autoalloc's wrapper): the first optimizer still decides, and the library's wrapper stays."""
    sandbox.write("jiwer/__init__.py", "")
    body = """
        import functools, soundfile, jiwer, torch
        inner = torch.optim.Optimizer.__init__
        @functools.wraps(inner)
        def wrapped(self, *args, **kwargs):
            inner(self, *args, **kwargs)
        torch.optim.Optimizer.__init__ = wrapped
    """
    sandbox.script("own.py", textwrap.dedent(body) + SPEECH_FINETUNE.replace(STACK_LINE, "")
                   + "assert torch.optim.Optimizer.__init__ is wrapped\n")
    assert_applied(sandbox.run(["own.py"]), "speech-training")
