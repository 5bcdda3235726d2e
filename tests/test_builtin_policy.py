"""The built-in policy (autoalloc/builtin.toml) against realistic toolkit layouts, in process.

Every case goes through the same functions the hook uses: ``entrypoint.parse`` of a full
interpreter command line, ``sources.load`` of every layer (user/site/project isolated
in a temporary directory) and ``decide``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from autoalloc import entrypoint, layercache, sources
from autoalloc.decide import decide
from autoalloc.explain import explain, render
from autoalloc.policy import PolicyError, Source
from autoalloc.torchinfo import TorchInfo
from tests.helpers import NEMO, REPO, Sandbox, validate

pytestmark = pytest.mark.hook

PY = "/venv/bin/python"
TORCH = TorchInfo("2.13.0", cuda="12.8")
BUILTIN_TEXT = Path(sources.BUILTIN_PATH).read_text(encoding="utf-8")
BUILTIN = validate(
    sources.parse_toml(BUILTIN_TEXT.encode()), Source("builtin", sources.BUILTIN_PATH)
)


@pytest.fixture
def world(isolated_home: Sandbox) -> Path:
    """The source root of an isolated world (its own, empty, user and site config dirs)."""
    src = isolated_home.root / "src"
    src.mkdir()
    return src


def user_policy(world: Path, text: str) -> Path:
    path = world.parent / "xdg-config" / "autoalloc" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def decision_for(argv: list[str], cwd: Path, imported: set[str] = frozenset(), trains=False):
    """What the hook would decide for ``python *argv`` run in ``cwd`` with ``imported`` loaded
    (``trains``: once it has built its first optimizer)."""
    entry = entrypoint.parse([PY, *argv], str(cwd))
    policy = sources.load(entry, dict(os.environ), str(cwd))
    return decide(policy, entry, dict(os.environ), TORCH, imported, trains=trains)


def rule_for(
    argv: list[str], cwd: Path, imported: set[str] = frozenset(), trains: bool = False
) -> tuple[str, str | None]:
    d = decision_for(argv, cwd, imported, trains)
    return d.action, d.rule


# (path of a script inside a checkout, the built-in rule that must decide, its action)
SCRIPTS = [
    # NeMo ASR trainers
    ("NeMo/examples/asr/asr_ctc/speech_to_text_ctc.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/asr/asr_transducer/speech_to_text_rnnt_bpe.py", "nemo-asr-train", "apply"),
    (
        "NeMo/examples/asr/asr_hybrid_transducer_ctc/speech_to_text_hybrid_rnnt_ctc_bpe.py",
        "nemo-asr-train",
        "apply",
    ),
    ("NeMo/examples/asr/speech_multitask/speech_to_text_aed.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/asr/speech_to_text_finetune.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/asr/asr_with_tts/speech_to_text_bpe_with_text.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/asr/asr_adapters/train_asr_adapter.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/asr/speech_pretraining/speech_pre_training.py", "nemo-asr-train", "apply"),
    (
        "NeMo/examples/asr/speech_pretraining/masked_token_pred_pretrain.py",
        "nemo-asr-train",
        "apply",
    ),
    ("NeMo/examples/asr/asr_eou/speech_to_text_rnnt_eou_train.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/asr/distillation/distill.py", "nemo-asr-train", "apply"),
    ("Speech/examples/speechlm2/salm_train.py", "nemo-speechlm2-train", "apply"),
    ("Speech/examples/speechlm2/s2s_duplex_train.py", "nemo-speechlm2-train", "apply"),
    # NeMo inference and evaluation: the deny rule wins over the speech_to_text_*.py glob
    ("NeMo/examples/asr/transcribe_speech.py", "asr-inference", "skip"),
    ("NeMo/examples/asr/transcribe_speech_parallel.py", "asr-inference", "skip"),
    ("NeMo/examples/asr/speech_to_text_eval.py", "asr-inference", "skip"),
    ("NeMo/examples/asr/asr_eou/speech_to_text_rnnt_eou_eval.py", "asr-inference", "skip"),
    ("NeMo/examples/asr/asr_ctc/inference.py", "asr-inference", "skip"),
    ("NeMo/examples/asr/asr_streaming/speech_to_text_streaming_infer.py", "asr-inference", "skip"),
    (
        "NeMo/examples/asr/speech_multitask/speech_to_text_aed_chunked_infer.py",
        "asr-inference",
        "skip",
    ),
    (
        "NeMo/examples/asr/asr_chunked_inference/rnnt/speech_to_text_buffered_infer_rnnt.py",
        "asr-inference",
        "skip",
    ),
    (
        "NeMo/examples/asr/asr_cache_aware_streaming/speech_to_text_with_streaming_sortformer.py",
        "asr-inference",
        "skip",
    ),
    ("NeMo/examples/asr/asr_vad/speech_to_text_with_vad.py", "asr-inference", "skip"),
    ("Speech/examples/speechlm2/salm_generate.py", "asr-inference", "skip"),
    ("Speech/examples/speechlm2/salm_eval.py", "asr-inference", "skip"),
    # NeMo tools that are neither: no rule
    ("NeMo/examples/asr/speech_pretraining/extract_embeddings.py", None, "none"),
    ("NeMo/examples/asr/speech_pretraining/load_wav2vec_weights.py", None, "none"),
    # NeMo speech translation, SLU and speech-LLM trainers; calibration is not training
    (
        "NeMo/examples/asr/speech_translation/speech_to_text_transformer.py",
        "nemo-asr-train",
        "apply",
    ),
    ("NeMo/examples/slu/speech_intent_slot/speech_intent_slot_train.py", "nemo-asr-train", "apply"),
    ("NeMo/examples/speechlm/speech_to_text_llm_train.py", "nemo-speechlm2-train", "apply"),
    ("NeMo/examples/speechlm/sft/hf.py", "nemo-speechlm2-train", "apply"),
    ("NeMo/examples/asr/quantization/speech_to_text_calibrate.py", "asr-inference", "skip"),
    ("NeMo/examples/asr/experimental/sclite/speech_to_text_sclite.py", "asr-inference", "skip"),
    ("NeMo/examples/tts/fastpitch.py", None, "none"),  # audio-training is off until enabled
    # icefall
    ("icefall/egs/librispeech/ASR/zipformer/train.py", "icefall-train", "apply"),
    ("icefall/egs/librispeech/ASR/zipformer/finetune.py", "icefall-train", "apply"),
    ("icefall/egs/librispeech/ASR/pruned_transducer_stateless7/train.py", "icefall-train", "apply"),
    ("icefall/egs/aishell/ASR/conformer_ctc/train.py", "icefall-train", "apply"),
    ("icefall/egs/librispeech/ASR/zipformer/decode.py", "asr-inference", "skip"),
    ("icefall/egs/librispeech/ASR/zipformer/streaming_decode.py", "asr-inference", "skip"),
    ("icefall/egs/librispeech/ASR/zipformer/jit_pretrained.py", "asr-inference", "skip"),
    ("icefall/egs/librispeech/ASR/zipformer/export-onnx.py", "asr-inference", "skip"),
    ("icefall/egs/librispeech/ASR/local/train_bpe_model.py", "asr-data-prep", "skip"),
    ("icefall/egs/librispeech/ASR/local/compute_fbank_librispeech.py", "asr-data-prep", "skip"),
    ("icefall/egs/ljspeech/TTS/vits/train.py", None, "none"),
    # icefall speech-to-text tasks beyond ASR/
    ("icefall/egs/librispeech/ASR_v2/zipformer/train.py", "icefall-train", "apply"),
    ("icefall/egs/mls_english/ASR_LLM/whisper_llm_zh/train.py", "icefall-train", "apply"),
    ("icefall/egs/iwslt22_ta/ST/zipformer/train.py", "icefall-train", "apply"),
    ("icefall/egs/slu/SLU/transducer/train.py", "icefall-train", "apply"),
    ("icefall/egs/libricss/SURT/dprnn_zipformer/train_adapt.py", "icefall-train", "apply"),
    ("icefall/egs/librispeech/SSL/hubert/pretrain.py", "icefall-train", "apply"),
    ("icefall/egs/librispeech/SSL/hubert/finetune_ce.py", "icefall-train", "apply"),
    ("icefall/egs/librispeech/WSASR/conformer_ctc2/train_phone.py", "icefall-train", "apply"),
    ("icefall/egs/grid/VSR/visualnet_ctc_vsr/train.py", "icefall-train", "apply"),
    ("icefall/egs/librispeech/ST/zipformer/decode.py", "asr-inference", "skip"),
    ("icefall/egs/librispeech/ASR/rnn_lm/train.py", "asr-data-prep", "skip"),  # a text LM
    ("icefall/egs/librispeech/ASR/transformer_lm/train.py", "asr-data-prep", "skip"),
    ("icefall/egs/wenetspeech/KWS/zipformer/train.py", None, "none"),
    # ESPnet1: espnet/bin/*_train.py, put on PATH by a recipe's path.sh
    ("espnet/espnet/bin/asr_train.py", "espnet1-asr-train", "apply"),
    ("espnet/espnet/bin/asr_rnnt_train.py", "espnet1-asr-train", "apply"),
    ("espnet/espnet/bin/st_train.py", "espnet1-asr-train", "apply"),
    ("espnet/espnet/bin/lm_train.py", None, "none"),  # a text language model
    ("espnet/espnet/bin/mt_train.py", None, "none"),  # text translation
    ("espnet/espnet/bin/asr_recog.py", None, "none"),  # decoding
    # WeNet
    ("wenet/wenet/bin/train.py", "wenet-train", "apply"),
    ("wenet/wenet/bin/average_model.py", None, "none"),
    # SpeechBrain
    ("speechbrain/recipes/LibriSpeech/ASR/transformer/train.py", "speechbrain-asr-train", "apply"),
    (
        "speechbrain/recipes/LibriSpeech/ASR/CTC/train_with_wav2vec.py",
        "speechbrain-asr-train",
        "apply",
    ),
    (
        "speechbrain/recipes/CommonVoice/ASR/seq2seq/train_with_whisper.py",
        "speechbrain-asr-train",
        "apply",
    ),
    ("speechbrain/recipes/LibriSpeech/Tokenizer/train.py", None, "none"),
    ("speechbrain/recipes/SLURP/direct/train_with_wav2vec2.py", "speechbrain-asr-train", "apply"),
    ("speechbrain/recipes/timers-and-such/multistage/train.py", "speechbrain-asr-train", "apply"),
    ("speechbrain/recipes/MEDIA/SLU/CTC/train_hf_wav2vec.py", "speechbrain-asr-train", "apply"),
    ("speechbrain/recipes/CoVoST/AST/train.py", "speechbrain-asr-train", "apply"),
    (
        "speechbrain/recipes/Fisher-Callhome-Spanish/ST/transformer/train.py",
        "speechbrain-asr-train",
        "apply",
    ),
    (
        "speechbrain/recipes/LibriSpeech/self-supervised-learning/BEST-RQ/train.py",
        "speechbrain-asr-train",
        "apply",
    ),
    ("speechbrain/recipes/Voicebank/MTL/ASR_enhance/train.py", "speechbrain-asr-train", "apply"),
    ("speechbrain/templates/speech_recognition/ASR/train.py", "speechbrain-asr-train", "apply"),
    ("speechbrain/recipes/SLURP/NLU/train.py", None, "none"),  # text NLU
    ("speechbrain/recipes/LibriMix/separation/train.py", None, "none"),  # audio-training is off
    # Hugging Face transformers examples
    (
        "transformers/examples/pytorch/speech-recognition/run_speech_recognition_ctc.py",
        "hf-asr-examples",
        "apply",
    ),
    (
        "transformers/examples/pytorch/speech-recognition/run_speech_recognition_ctc_adapter.py",
        "hf-asr-examples",
        "apply",
    ),
    (
        "transformers/examples/pytorch/speech-recognition/run_speech_recognition_seq2seq.py",
        "hf-asr-examples",
        "apply",
    ),
    (
        "transformers/examples/pytorch/speech-recognition/run_speech_recognition_ctc_streaming.py",
        "hf-asr-examples",
        "apply",
    ),
    (
        "transformers/examples/pytorch/speech-pretraining/run_wav2vec2_pretraining_no_trainer.py",
        "hf-asr-examples",
        "apply",
    ),
    ("transformers/examples/pytorch/text-classification/run_glue.py", None, "none"),
    (
        "transformers/examples/pytorch/audio-classification/run_audio_classification.py",
        None,
        "none",
    ),
    # torchaudio recipes
    ("audio/examples/asr/librispeech_conformer_rnnt/train.py", "torchaudio-asr-recipes", "apply"),
    (
        "audio/examples/asr/librispeech_conformer_rnnt_biasing/train.py",
        "torchaudio-asr-recipes",
        "apply",
    ),
    ("audio/examples/asr/emformer_rnnt/train.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/hubert/train.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/hubert/finetune.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/asr/librispeech_conformer_rnnt/eval.py", None, "none"),
    ("audio/examples/asr/avsr_rnnt/train.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/asr/librispeech_conformer_ctc/train.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/avsr/train.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/self_supervised_learning/train_hubert.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/pipeline_wav2letter/main.py", "torchaudio-asr-recipes", "apply"),
    ("audio/examples/asr/avsr_rnnt/train_spm.py", None, "none"),
    ("audio/examples/source_separation/train.py", None, "none"),
    # not ASR at all
    ("project/train.py", None, "none"),
]


@pytest.mark.parametrize(("script", "rule", "action"), SCRIPTS, ids=[s for s, _, _ in SCRIPTS])
def test_script_layouts(world: Path, script: str, rule: str | None, action: str) -> None:
    # absolute path
    assert rule_for([str(world / script)], world) == (action, rule)
    # relative to a working directory two levels up the script, with -u in front
    cwd = world / Path(script).parent.parent
    relative = os.path.relpath(world / script, cwd)
    assert rule_for(["-u", f"./{relative}"], cwd) == (action, rule)


def test_icefall_relative_launch_resolves_against_cwd(world: Path) -> None:
    recipe = world / "icefall/egs/librispeech/ASR"
    assert rule_for(
        ["./zipformer/train.py", "--world-size", "4", "--max-duration", "1000"], recipe
    ) == (
        "apply",
        "icefall-train",
    )
    # the same relative path from somewhere else is just "zipformer/train.py" there
    assert rule_for(["./zipformer/train.py"], world) == ("none", None)


def test_symlinked_checkouts(world: Path) -> None:
    real = world / "icefall/egs/librispeech/ASR/zipformer"
    real.mkdir(parents=True)
    (real / "train.py").write_text("")
    # a recipe dir symlinked from another corpus: the path as given matches
    other = world / "icefall/egs/aishell/ASR"
    other.mkdir(parents=True)
    (other / "zipformer").symlink_to(real)
    assert rule_for(["./zipformer/train.py"], other) == ("apply", "icefall-train")
    # an experiment dir holding a symlink to the recipe's script: the resolved path matches
    exp = world / "exp/run7"
    exp.mkdir(parents=True)
    (exp / "train.py").symlink_to(real / "train.py")
    assert rule_for(["train.py"], exp) == ("apply", "icefall-train")
    # a whole checkout reached through a symlink with an unrelated name
    (world / "current").symlink_to(world / "icefall")
    assert rule_for([str(world / "current/egs/librispeech/ASR/zipformer/train.py")], world) == (
        "apply",
        "icefall-train",
    )


MODULES = [
    (
        ["-m", "espnet2.bin.asr_train", "--ngpu", "1", "--batch_type", "numel"],
        "espnet2-asr-train",
        "apply",
    ),
    (["-m", "espnet2.bin.asr_transducer_train"], "espnet2-asr-train", "apply"),
    (["-m", "espnet2.bin.s2t_train"], "espnet2-asr-train", "apply"),
    (["-m", "espnet2.bin.hubert_train"], "espnet2-asr-train", "apply"),
    (["-m", "espnet2.bin.lightning_train"], "espnet2-asr-train", "apply"),
    (["-m", "espnet2.bin.asr_inference", "--ngpu", "1"], "asr-inference", "skip"),
    (["-m", "espnet2.bin.asr_inference_streaming"], "asr-inference", "skip"),
    (["-m", "espnet2.bin.s2t_inference"], "asr-inference", "skip"),
    (["-m", "espnet2.bin.tts_train"], None, "none"),
    (["-m", "espnet2.bin.s2t_train_ctc"], "espnet2-asr-train", "apply"),
    (["-m", "espnet2.bin.ssl_train"], "espnet2-asr-train", "apply"),
    (["-m", "espnet2.bin.avsr_train"], "espnet2-asr-train", "apply"),
    (
        ["-m", "espnet2.bin.asr_train", "--collect_stats", "true", "--config", "conf/train.yaml"],
        "espnet2-collect-stats",
        "skip",
    ),
    (["-m", "espnet2.bin.s2t_train", "--collect_stats=true"], "espnet2-collect-stats", "skip"),
    (["-m", "espnet2.bin.lm_train"], None, "none"),
    (
        [
            "-m",
            "espnet2.bin.launch",
            "--cmd",
            "run.pl",
            "--",
            "python3",
            "-m",
            "espnet2.bin.asr_train",
        ],
        None,
        "none",
    ),
    (["-m", "wenet.bin.train", "--config", "conf/train_conformer.yaml"], "wenet-train", "apply"),
    (["-m", "wenet.bin.recognize"], "asr-inference", "skip"),
    (["-m", "vllm.entrypoints.openai.api_server", "--model", "x"], "llm-serving", "skip"),
    (["-m", "vllm"], "llm-serving", "skip"),
    (["-m", "sglang.launch_server"], "llm-serving", "skip"),
    (["-m", "vllm_asr_tools.train"], None, "none"),
    (
        ["-m", "fairseq_cli.hydra_train", "--config-dir", "examples/wav2vec/config/pretraining"],
        "fairseq-audio-train",
        "apply",
    ),
    (["-m", "fairseq_cli.train", "data-bin/iwslt14", "--arch", "transformer"], None, "none"),
    (
        [
            "-m",
            "fairseq_cli.hydra_train",
            "--config-dir",
            "examples/data2vec/config/audio/pretraining",
        ],
        "fairseq-audio-train",
        "apply",
    ),
    (
        [
            "-m",
            "fairseq_cli.hydra_train",
            "--config-dir",
            "examples/data2vec/config/text/pretraining",
        ],
        None,
        "none",
    ),
    (
        [
            "-m",
            "fairseq_cli.hydra_train",
            "--config-dir",
            "examples/data2vec/config/vision/finetuning",
        ],
        None,
        "none",
    ),
    # fairseq launched as a script from its checkout
    (
        [
            "fairseq/fairseq_cli/hydra_train.py",
            "-m",
            "--config-dir",
            "examples/hubert/config/pretrain",
        ],
        "fairseq-audio-train",
        "apply",
    ),
    (
        ["fairseq/train.py", "/manifest", "--arch", "wav2vec2", "--task", "audio_pretraining"],
        "fairseq-audio-train",
        "apply",
    ),
    (["fairseq/train.py", "data-bin/wmt", "--task", "translation"], None, "none"),
]


@pytest.mark.parametrize(
    ("argv", "rule", "action"), MODULES, ids=[" ".join(a[:3]) for a, _, _ in MODULES]
)
def test_modules(world: Path, argv: list[str], rule: str | None, action: str) -> None:
    argv = [str(world / a) if a.endswith(".py") else a for a in argv]
    assert rule_for(argv, world) == (action, rule)


def _command(world: Path, name: str) -> str:
    path = world / "venv/bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{PY}\n")
    return str(path)


COMMANDS = [
    (
        [
            "fairseq-hydra-train",
            "task.data=/data/librispeech",
            "--config-dir",
            "/src/fairseq/examples/wav2vec/config/pretraining",
            "--config-name",
            "wav2vec2_base_librispeech",
        ],
        "fairseq-audio-train",
        "apply",
    ),
    (
        [
            "fairseq-hydra-train",
            "--config-dir",
            "examples/hubert/config/pretrain",
            "--config-name",
            "hubert_base_librispeech",
        ],
        "fairseq-audio-train",
        "apply",
    ),
    (
        [
            "fairseq-hydra-train",
            "--config-dir",
            "examples/data2vec/config/audio/pretraining",
            "--config-name",
            "base_librispeech",
        ],
        "fairseq-audio-train",
        "apply",
    ),
    (
        [
            "fairseq-train",
            "/data/mustc/en-de",
            "--config-yaml",
            "config_st.yaml",
            "--task",
            "speech_to_text",
        ],
        "fairseq-audio-train",
        "apply",
    ),
    (
        ["fairseq-train", "/data", "--task", "Audio_Pretraining"],
        "fairseq-audio-train",
        "apply",
    ),  # argv is case-insensitive
    (
        [
            "fairseq-train",
            "data-bin/wmt16_en_de",
            "--arch",
            "transformer_wmt_en_de",
            "--task",
            "translation",
        ],
        None,
        "none",
    ),
    (
        [
            "fairseq-hydra-train",
            "--config-dir",
            "examples/roberta/config/pretraining",
            "--config-name",
            "base",
        ],
        None,
        "none",
    ),
    (
        ["fairseq-train", "/data/mustc/en-de", "--task", "speech_to_text_head_selection"],
        "fairseq-audio-train",
        "apply",
    ),
    # text and TTS tasks that merely mention speech in an argument
    (
        ["fairseq-train", "data-bin/tts", "--task", "text_to_speech", "--arch", "tts_transformer"],
        None,
        "none",
    ),
    (
        ["fairseq-train", "data-bin/wmt", "--task", "translation", "--save-dir", "ckpt/speech_mt"],
        None,
        "none",
    ),
    (
        [
            "fairseq-hydra-train",
            "--config-dir",
            "examples/data2vec/config/v2",
            "--config-name",
            "base_text_only_task",
        ],
        None,
        "none",
    ),
    (
        [
            "fairseq-hydra-train",
            "--config-dir",
            "examples/data2vec/config/v2",
            "--config-name",
            "base_audio_only_task",
        ],
        "fairseq-audio-train",
        "apply",
    ),
    (["vllm", "serve", "nvidia/canary-qwen-2.5b"], "llm-serving", "skip"),
    (["sglang-router"], "llm-serving", "skip"),
]


@pytest.mark.parametrize(
    ("argv", "rule", "action"), COMMANDS, ids=[" ".join(a[:3]) for a, _, _ in COMMANDS]
)
def test_console_scripts(world: Path, argv: list[str], rule: str | None, action: str) -> None:
    assert rule_for([_command(world, argv[0]), *argv[1:]], world) == (action, rule)


IMPORTS = [
    # (entry point argv, modules imported when the decision is made, rule, action)
    # a toolkit import alone is not training: export, transcription, evaluation import it too
    (["-c", "import nemo.collections.asr"], {"nemo", "nemo.collections.asr"}, None, "none"),
    (["-c", "..."], {"icefall", "icefall.utils"}, None, "none"),
    (["-c", "..."], {"espnet2.train.trainer"}, None, "none"),
    (["-c", "..."], {"lhotse", "lhotse.dataset"}, None, "none"),  # lhotse alone is data prep too
    (["-c", "..."], {"nemo.collections.asr", "torch_memory_saver"}, "torch-memory-saver", "skip"),
    (["-c", "..."], {"nemo.collections.asr", "vllm"}, "llm-serving", "skip"),
    # deny by import wins over a built-in allow by script
    (
        ["NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py"],
        {"torch_memory_saver"},
        "torch-memory-saver",
        "skip",
    ),
    (["icefall/egs/librispeech/ASR/zipformer/train.py"], {"sglang"}, "llm-serving", "skip"),
    # deny by script wins over the import fallback
    (["NeMo/examples/asr/transcribe_speech.py"], {"nemo.collections.asr"}, "asr-inference", "skip"),
    (["icefall/egs/librispeech/ASR/zipformer/decode.py"], {"icefall"}, "asr-inference", "skip"),
    (
        ["icefall/egs/librispeech/ASR/local/compute_fbank_librispeech.py"],
        {"icefall", "lhotse"},
        "asr-data-prep",
        "skip",
    ),
    (["-m", "espnet2.bin.asr_inference"], {"espnet2.train.trainer"}, "asr-inference", "skip"),
    # an allow by script decides before the import fallback is looked at
    (
        ["NeMo/examples/asr/asr_ctc/speech_to_text_ctc.py"],
        {"nemo.collections.asr"},
        "nemo-asr-train",
        "apply",
    ),
]


STACK = {"torchaudio", "torchaudio.functional"}
# Once the program has built its first optimizer: (argv, modules imported by then, rule, action)
TRAINS = [
    (["-c", "..."], {"nemo", "nemo.collections.asr"}, "asr-toolkit-imports", "apply"),
    (["-c", "..."], {"icefall", "icefall.utils"}, "asr-toolkit-imports", "apply"),
    (["-c", "..."], {"espnet2.train.trainer"}, "asr-toolkit-imports", "apply"),
    (["my_export.py"], {"json"}, None, "none"),  # no audio stack, no toolkit
    (["finetune.py"], {*STACK}, None, "none"),  # nothing that handles text targets
    (["finetune.py"], {*STACK, "transformers"}, "speech-training", "apply"),  # a text model
    (["finetune.py"], {"soundfile", "jiwer"}, "speech-training", "apply"),  # WER scoring
    (["finetune.py"], {"jiwer"}, None, "none"),  # no audio stack: OCR, text
    # what it trains with: its loss, its metric, its toolkit's text side
    (["train.py"], {"soundfile", "torch.nn.CTCLoss"}, "speech-training", "apply"),
    (["train.py"], {*STACK, "torchmetrics.text.WordErrorRate"}, "speech-training", "apply"),
    (["train.py"], {*STACK, "torchaudio.functional.rnnt_loss"}, "speech-training", "apply"),
    (["train.py"], {"speechbrain", "speechbrain.dataio.encoder.CTCTextEncoder"},
     "speech-training", "apply"),
    (["train.py"], {"librosa", "evaluate.load:wer"}, "speech-training", "apply"),
    (["train_ocr.py"], {"torch.nn.CTCLoss"}, None, "none"),  # CTC on images: no audio
    (["train_kws.py"], {"soundfile", "torch.nn.CrossEntropyLoss"}, None, "none"),
    # a TTS aligner's CTC loss is no speech-to-text library: it does not outweigh phonemizer
    (["train_tts.py"], {*STACK, "phonemizer", "torch.nn.functional.ctc_loss"}, None, "none"),
    (["train.py"], {*STACK, "pypinyin", "torchmetrics.text.CharErrorRate"}, "speech-training",
     "apply"),
    (["train_tts.py"], {*STACK, "phonemizer"}, None, "none"),  # TTS front-end: audio-training
    (["train_tts.py"], {*STACK, "transformers", "phonemizer"}, None, "none"),
    (["train_vocoder.py"], {"librosa", "auraloss"}, None, "none"),
    (["train_sep.py"], {*STACK, "asteroid", "pesq"}, None, "none"),
    (["train_spk.py"], {*STACK, "pyannote", "pyannote.audio"}, None, "none"),
    (["train_tts.py"], {"phonemizer"}, None, "none"),  # no audio stack: audio-training only
    # a speech-to-text library outweighs a library of other audio work a toolkit pulls in
    (["train.py"], {*STACK, "pyopenjtalk", "sentencepiece"}, "speech-training", "apply"),
    (["train.py"], {*STACK, "pypinyin", "k2"}, "speech-training", "apply"),
    (["train.py"], {"transformers.models.whisper", "encodec"}, "speech-training", "apply"),
    (["train.py"], {"librosa", "vllm"}, "llm-serving", "skip"),
    # NeMo's ASR collection holds speaker and VAD models too: the same exclusion
    (["train_spk.py"], {"nemo.collections.asr", "pyannote"}, None, "none"),
    (
        ["train.py"],
        {"nemo.collections.asr", "pyannote", "sentencepiece"},
        "asr-toolkit-imports",
        "apply",
    ),
]


SIGNALS = [(*case, False) for case in IMPORTS] + [(*case, True) for case in TRAINS]


@pytest.mark.parametrize(
    ("argv", "imported", "rule", "action", "trains"),
    SIGNALS,
    ids=[f"{a[0]}+{'+'.join(sorted(i))}{'+optimizer' * t}" for a, i, _, _, t in SIGNALS],
)
def test_import_and_training_signals(
    world: Path, argv: list[str], imported: set[str], rule: str | None, action: str, trains: bool
) -> None:
    argv = [str(world / a) if a.endswith(".py") else a for a in argv]
    if trains and action != "skip":  # a deny by import holds at once
        assert rule_for(argv, world, imported) == ("none", None)  # nothing before the optimizer
    assert rule_for(argv, world, imported, trains) == (action, rule)


@pytest.mark.parametrize("name", ["audio-training", "tts-train", "classification-train"])
def test_other_audio_trainers_once_enabled_under_either_name(world: Path, name: str) -> None:
    argv = [str(world / "train_tts.py")]
    user_policy(world, f'enable = ["{name}"]\n')
    for imported in ({*STACK, "phonemizer"}, {"phonemizer"}, {"librosa", "auraloss"}):
        assert rule_for(argv, world, imported, trains=True) == ("apply", "audio-training")
    # speech-to-text trainers keep their rule; nothing applies before the optimizer
    assert rule_for(argv, world, {*STACK, "jiwer"}, trains=True) == ("apply", "speech-training")
    assert rule_for(argv, world, STACK, trains=True) == ("apply", "audio-training")
    assert rule_for(argv, world, {*STACK, "phonemizer"}) == ("none", None)
    # and the toolkits' trainers by their command lines, at import torch
    assert rule_for(["-m", "espnet2.bin.gan_tts_train"], world) == ("apply", "audio-training")


def test_not_imports_of_speech_training_and_audio_training_agree() -> None:
    """The run-time part of audio-training catches what speech-training leaves: its imports
    are speech-training's audio stack and its not_imports."""
    speech = next(r for r in BUILTIN.rules if r.name == "speech-training")
    audio = [r for r in BUILTIN.rules if r.name == "audio-training" and r.training]
    assert len(audio) == 1 and audio[0].outside == speech.outside
    assert set(audio[0].imports) == {*speech.imports, *speech.not_imports}
    assert not set(speech.not_imports) & set(speech.not_imports_unless)
    # a speech-to-text library handles text targets; the toolkit trigger excludes the same
    assert set(speech.not_imports_unless) <= set(speech.also_imports)
    toolkit = next(r for r in BUILTIN.rules if r.name == "asr-toolkit-imports")
    assert (toolkit.not_imports, toolkit.not_imports_unless) == (
        speech.not_imports,
        speech.not_imports_unless,
    )


# Rules that are off until a layer lists them in `enable`: (argv, the rule once enabled)
OFF_CASES = [
    (["NeMo/examples/tts/fastpitch.py"], "audio-training"),
    (["espnet/espnet/bin/tts_train.py"], "audio-training"),
    (["icefall/egs/ljspeech/TTS/vits/train.py"], "audio-training"),
    (["speechbrain/recipes/LJSpeech/TTS/vocoder/hifigan/train.py"], "audio-training"),
    (["audio/examples/pipeline_tacotron2/train.py"], "audio-training"),
    (["-m", "espnet2.bin.gan_tts_train"], "audio-training"),
    (["NeMo/examples/audio/audio_to_audio_train.py"], "audio-training"),
    (["speechbrain/recipes/LibriMix/separation/train.py"], "audio-training"),
    (["audio/examples/source_separation/lightning_train.py"], "audio-training"),
    (["-m", "espnet2.bin.enh_train"], "audio-training"),
    (
        ["NeMo/examples/speaker_tasks/diarization/neural_diarizer/sortformer_diar_train.py"],
        "audio-training",
    ),
    (["NeMo/examples/asr/speech_classification/speech_to_label.py"], "audio-training"),
    (["icefall/egs/wenetspeech/KWS/zipformer/train.py"], "audio-training"),
    (
        ["speechbrain/recipes/VoxCeleb/SpeakerRec/train_speaker_embeddings.py"],
        "audio-training",
    ),
    (
        ["transformers/examples/pytorch/audio-classification/run_audio_classification.py"],
        "audio-training",
    ),
    (["-m", "espnet2.bin.spk_train"], "audio-training"),
]


@pytest.mark.parametrize(("argv", "rule"), OFF_CASES, ids=[a[-1] for a, _ in OFF_CASES])
def test_off_rules_apply_only_once_enabled(world: Path, argv: list[str], rule: str) -> None:
    argv = [str(world / a) if a.endswith(".py") else a for a in argv]
    assert rule_for(argv, world) == ("none", None)
    user_policy(world, f'enable = ["{rule}"]\n')
    assert rule_for(argv, world) == ("apply", rule)


def test_every_builtin_rule_is_proven_by_a_case() -> None:
    proven = {r for _, r, _ in SCRIPTS + MODULES + COMMANDS}
    proven |= {r for _, _, r, _ in IMPORTS + TRAINS}
    proven |= {r for _, r in OFF_CASES}
    assert {rule.name for rule in BUILTIN.rules} <= proven
    off = {rule.name for rule in BUILTIN.rules if not rule.enabled}
    assert off == {"audio-training"}


def test_builtin_file_shape() -> None:
    rules = BUILTIN.rules
    names = [r.name for r in rules]
    # one name per rule, but audio-training, in two parts: command lines, and imports at run time
    assert [n for n in names if names.count(n) > 1] == ["audio-training"] * 2
    # every deny rule comes before every allow rule: deny always wins over a built-in allow
    actions = [r.action for r in rules]
    assert actions == sorted(actions, key=lambda a: a != "skip"), names
    assert actions.count("skip") >= 3
    for rule in rules:
        assert rule.description, rule.name
        assert not rule.allocator, f"{rule.name}: built-in rules use the [allocator] defaults"
    # and each [[rules]] table has a one-line comment right above it saying why
    lines = BUILTIN_TEXT.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "[[rules]]":
            assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 20, (
                f"no comment above the rule at line {i + 1}"
            )
    assert sum(1 for line in lines if line.strip() == "[[rules]]") == len(rules)


# ---------------------------------------------------------------- composition with higher layers

EVAL = "NeMo/examples/asr/speech_to_text_eval.py"


def test_disable_in_user_layer_switches_a_builtin_rule_off(world: Path) -> None:
    path = user_policy(world, 'disable = ["nemo-asr-train"]\n')
    d = decision_for([str(world / NEMO)], world)
    assert (d.action, d.rule) == ("none", None)
    # a NeMo trainer imports nemo.collections.asr, so the import fallback still catches it ...
    d = decision_for([str(world / NEMO)], world, {"nemo.collections.asr"}, trains=True)
    assert (d.action, d.rule) == ("apply", "asr-toolkit-imports")
    # ... unless that one is switched off too
    path.write_text('disable = ["nemo-asr-train", "asr-toolkit-imports"]\n')
    d = decision_for([str(world / NEMO)], world, {"nemo.collections.asr"}, trains=True)
    assert (d.action, d.rule) == ("none", None)
    # other built-in rules are untouched
    assert rule_for([str(world / "wenet/wenet/bin/train.py")], world) == ("apply", "wenet-train")


def test_disable_in_project_layer(world: Path) -> None:
    (world / "NeMo").mkdir()
    (world / "NeMo/pyproject.toml").write_text(
        '[project]\nname = "nemo"\n\n[tool.autoalloc]\ndisable = ["nemo-asr-train"]\n'
    )
    assert rule_for([str(world / NEMO)], world) == ("none", None)
    # the project file only governs scripts below it
    assert rule_for([str(world / "other" / NEMO)], world) == ("apply", "nemo-asr-train")


def test_disabling_a_deny_rule_lets_the_builtin_allow_through(world: Path) -> None:
    assert rule_for([str(world / EVAL)], world) == ("skip", "asr-inference")
    user_policy(world, 'disable = ["asr-inference"]\n')
    assert rule_for([str(world / EVAL)], world) == ("apply", "nemo-asr-train")


def test_same_named_rule_in_a_higher_layer_replaces_the_builtin(world: Path) -> None:
    user_policy(
        world,
        '[[rules]]\nname = "nemo-asr-train"\ndescription = "ours"\n'
        'scripts = ["**/our-nemo/**/speech_to_text_*.py"]\n'
        "allocator = { garbage_collection_threshold = 0.8 }\n",
    )
    assert rule_for([str(world / NEMO)], world) == ("none", None)
    d = decision_for([str(world / "our-nemo/asr/speech_to_text_ctc.py")], world)
    assert (d.action, d.rule) == ("apply", "nemo-asr-train")
    assert d.rule_source is not None and d.rule_source.startswith("user ")
    assert re.fullmatch(
        r"expandable_segments:True,garbage_collection_threshold:0\.8", d.value or ""
    )
    # replacing a deny rule: the user's version no longer covers speech_to_text_eval.py
    user_policy(
        world, '[[rules]]\nname = "asr-inference"\naction = "skip"\nscripts = ["my_infer.py"]\n'
    )
    assert rule_for([str(world / EVAL)], world) == ("apply", "nemo-asr-train")
    assert rule_for([str(world / "x/my_infer.py")], world) == ("skip", "asr-inference")


def test_explain_lists_active_and_inactive_builtin_rules(world: Path) -> None:
    report = explain(["python", str(world / NEMO)], env=dict(os.environ), cwd=str(world))
    builtin = [r["name"] for r in report["rules"] if r["layer"] == "builtin"]
    assert builtin == [r.name for r in BUILTIN.rules if r.enabled]
    off = {
        f"{r.name}@builtin": f'off until enabled (enable = ["{r.name}"])'
        for r in BUILTIN.rules
        if not r.enabled
    }
    assert report["inactive_rules"] == off
    assert report["decision"]["rule"] == "nemo-asr-train"

    path = user_policy(
        world,
        'disable = ["nemo-asr-train", "hf-asr-examples"]\n'
        '[[rules]]\nname = "wenet-train"\nscripts = ["**/wenet/bin/train*.py"]\n',
    )
    report = explain(["python", str(world / NEMO)], env=dict(os.environ), cwd=str(world))
    active = [(r["name"], r["layer"]) for r in report["rules"]]
    assert active[0] == ("wenet-train", "user")  # higher layers first
    assert ("nemo-asr-train", "builtin") not in active and (
        "hf-asr-examples",
        "builtin",
    ) not in active
    assert ("wenet-train", "builtin") not in active and ("icefall-train", "builtin") in active
    inactive = report["inactive_rules"]
    assert set(inactive) == {
        "nemo-asr-train@builtin",
        "hf-asr-examples@builtin",
        "wenet-train@builtin",
        *off,
    }
    assert inactive["nemo-asr-train@builtin"] == f"disabled by user ({path})"
    assert inactive["wenet-train@builtin"].startswith(
        "replaced by the rule of the same name in user"
    )
    assert report["decision"]["action"] == "none"


def test_explain_torchrun_shows_the_workers_decision(world: Path) -> None:
    wenet = world / "wenet"
    report = explain(
        [
            "torchrun",
            "--standalone",
            "--nproc_per_node",
            "8",
            "wenet/bin/train.py",
            "--config",
            "x.yaml",
        ],
        env=dict(os.environ),
        cwd=str(wenet),
    )
    assert report["launcher"]["target"] == "torchrun"
    assert report["entry_point"]["target"] == str(wenet / "wenet/bin/train.py")
    assert report["decision"]["rule"] == "wenet-train"


# ---------------------------------------------------------------- enable, the mirror of disable

TTS = "icefall/egs/ljspeech/TTS/vits/train.py"


def test_enable_and_disable_the_highest_layer_that_names_the_rule_wins(world: Path) -> None:
    (world / "proj").mkdir()
    user_policy(world, 'enable = ["audio-training"]\n')
    assert rule_for([str(world / "proj" / TTS)], world) == ("apply", "audio-training")
    # a project below the user layer's enable turns it off again for its own scripts ...
    (world / "proj/autoalloc.toml").write_text('disable = ["audio-training"]\n')
    assert rule_for([str(world / "proj" / TTS)], world) == ("none", None)
    # ... and a project can turn on what the user layer switched off
    user_policy(world, 'disable = ["audio-training"]\n')
    (world / "proj/autoalloc.toml").write_text('enable = ["audio-training"]\n')
    assert rule_for([str(world / "proj" / TTS)], world) == ("apply", "audio-training")
    # within one layer, disable wins; an unknown name in enable does nothing
    user_policy(
        world, 'enable = ["audio-training", "no-such-rule"]\ndisable = ["audio-training"]\n'
    )
    (world / "proj/autoalloc.toml").unlink()
    assert rule_for([str(world / "proj" / TTS)], world) == ("none", None)


def test_enable_keeps_rules_that_are_on_and_a_users_off_rule_works_the_same(world: Path) -> None:
    user_policy(
        world,
        'enable = ["wenet-train"]\n'
        '[[rules]]\nname = "my-tts"\nenabled = false\nscripts = ["**/my_tts/train.py"]\n',
    )
    assert rule_for([str(world / "wenet/wenet/bin/train.py")], world) == ("apply", "wenet-train")
    assert rule_for([str(world / "my_tts/train.py")], world) == ("none", None)
    (world / "proj").mkdir()
    (world / "proj/autoalloc.toml").write_text('enable = ["my-tts"]\n')
    assert rule_for([str(world / "proj/my_tts/train.py")], world) == ("apply", "my-tts")


def test_explain_shows_off_and_enabled_rules(world: Path) -> None:
    report = explain(["python", str(world / TTS)], env=dict(os.environ), cwd=str(world))
    assert (
        report["inactive_rules"]["audio-training@builtin"]
        == 'off until enabled (enable = ["audio-training"])'
    )
    assert "off   audio-training@builtin" in render(report)
    path = user_policy(world, 'enable = ["audio-training"]\n')
    report = explain(["python", str(world / TTS)], env=dict(os.environ), cwd=str(world))
    shown = {r["name"]: r for r in report["rules"]}
    assert shown["audio-training"]["enabled_by"] == f"user ({path})"
    assert "audio-training@builtin" not in report["inactive_rules"]
    assert report["decision"]["rule"] == "audio-training"
    assert f"enabled by user ({path})" in render(report)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('enable = "tts-train"\n', "enable must be a list of strings"),
        (
            '[[rules]]\nname = "x"\ntraining = true\nalso_imports = ["jiwer"]\n',
            'rule 1 ("x"): also_imports needs imports',
        ),
        (
            '[[rules]]\nname = "x"\ntraining = true\nnot_imports = ["phonemizer"]\n',
            'rule 1 ("x"): not_imports needs imports',
        ),
        (
            '[[rules]]\nname = "x"\nimports = ["m"]\nnot_imports_unless = ["jiwer"]\n',
            'rule 1 ("x"): not_imports_unless needs not_imports',
        ),
        ('[[rules]]\nname = "x"\nimports = ["m"]\nnot_imports = "n"\n', "must be a list"),
        (
            '[[rules]]\nname = "x"\nenabled = "no"\nscripts = ["a.py"]\n',
            'rule 1 ("x"): enabled must be true or false',
        ),
        (
            '[[rules]]\nname = "x"\nimports = ["m"]\noutside = ["/abs/marker.py"]\n',
            "must be a relative path",
        ),
        (
            '[[rules]]\nname = "x"\nimports = ["m"]\noutside = ["../up/marker.py"]\n',
            "must be a relative path",
        ),
    ],
)
def test_enable_enabled_and_outside_are_validated(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        validate(sources.parse_toml(text.encode()), Source("user", "u.toml"))


# ------------------------------------------------------------ the import fallback outside checkouts

CHECKOUT_MARKERS = {
    "NeMo": "nemo/package_info.py",
    "icefall": "icefall/__init__.py",
    "espnet": "espnet2/__init__.py",
}


def _checkout(world: Path, folder: str, marker: str) -> Path:
    root = world / folder
    (root / marker).parent.mkdir(parents=True, exist_ok=True)
    (root / marker).write_text("")
    return root


@pytest.mark.parametrize(
    ("folder", "marker", "script", "imported"),
    [
        (
            "NeMo",
            "nemo/package_info.py",
            "scripts/speech_recognition/estimate_duration_bins.py",
            {"nemo.collections.asr"},
        ),
        (
            "my-nemo-fork",
            "nemo/package_info.py",
            "tools/nemo_forced_aligner/align.py",
            {"nemo.collections.asr"},
        ),
        (
            "icefall",
            "icefall/__init__.py",
            "egs/librispeech/ASR/zipformer/ctc_align.py",
            {"icefall"},
        ),
        ("k2-recipes", "icefall/__init__.py", "egs/gigaspeech/KWS/zipformer/train.py", {"icefall"}),
        (
            "espnet",
            "espnet2/__init__.py",
            "egs2/TEMPLATE/asr1/pyscripts/utils/score_intent.py",
            {"espnet2.train.trainer"},
        ),
    ],
)
def test_import_fallback_does_not_fire_inside_a_toolkit_checkout(
    world: Path, folder: str, marker: str, script: str, imported: set[str]
) -> None:
    root = _checkout(world, folder, marker)
    assert rule_for([str(root / script)], world, imported, trains=True) == ("none", None)
    cwd = root / Path(script).parent
    assert rule_for([f"./{Path(script).name}"], cwd, imported, trains=True) == (
        "none",
        None,
    )  # relative launch, same
    # the same file copied into the user's own project: the fallback is for exactly that
    mine = str(world / "my_project" / Path(script).name)
    assert rule_for([mine], world, imported) == ("none", None)  # until it builds an optimizer
    assert rule_for([mine], world, imported, trains=True) == (
        "apply",
        "asr-toolkit-imports",
    )


def test_import_fallback_inside_checkouts_modules_and_notebooks(world: Path) -> None:
    espnet = _checkout(world, "espnet", "espnet2/__init__.py")
    trainer = {"espnet2.train.trainer"}
    # a -m module of a toolkit package is inside its checkout (or installed copy)
    assert rule_for(["-m", "espnet2.bin.asr_align"], espnet, trainer, trains=True) == ("none", None)
    assert rule_for(["-m", "espnet2.bin.enh_train"], espnet, trainer, trains=True) == ("none", None)
    # -c code and notebooks get the fallback wherever they run
    assert rule_for(["-c", "import espnet2.train.trainer"], espnet, trainer, trains=True) == (
        "apply",
        "asr-toolkit-imports",
    )
    assert rule_for(["-m", "ipykernel_launcher", "-f", "k.json"], espnet, trainer, trains=True) == (
        "apply",
        "asr-toolkit-imports",
    )
    # a marker-less folder named like a toolkit is just a folder
    assert rule_for(
        [str(world / "nemo/examples/my_train.py")], world, {"nemo.collections.asr"}, trains=True
    ) == ("apply", "asr-toolkit-imports")
    # a script reached through a symlink into a checkout is inside it too
    nemo = _checkout(world, "NeMo", "nemo/package_info.py")
    (nemo / "scripts").mkdir()
    (nemo / "scripts/tool.py").write_text("")
    (world / "exp").mkdir()
    (world / "exp/tool.py").symlink_to(nemo / "scripts/tool.py")
    assert rule_for([str(world / "exp/tool.py")], world, {"nemo.collections.asr"}, trains=True) == (
        "none",
        None,
    )


def test_builtin_json_is_what_validating_builtin_toml_keeps() -> None:
    """The first process builds the built-in rules from builtin.json: it must be made from
    builtin.toml's current bytes by the current schema (after an edit of either:
    ``python scripts/builtin_json.py``) and give the very records validation gives; bytes it
    was not made from are parsed and validated instead."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("builtin_json", REPO / "scripts/builtin_json.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    data = Path(sources.BUILTIN_PATH).read_bytes()
    released = (Path(sources.BUILTIN_PATH).parent / "builtin.json").read_text(encoding="utf-8")
    assert released == script.released(data), "run: python scripts/builtin_json.py"
    sources._LAYERS.clear()  # built here, not remembered from an earlier test
    layer = sources._layer("builtin", sources.BUILTIN_PATH, data, False)
    assert layercache.released(data, dict) is not None and layer is not None
    assert repr(layer.config) == repr(BUILTIN) and layer.config == BUILTIN and not layer.notes
    assert layercache.released(data + b"\n", dict) is None  # an edited builtin.toml: parsed


def test_a_builtin_json_of_another_shape_is_passed_over_for_the_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # builtin.json made before the walk kept another field: the TOML is parsed, never a raise
    data = Path(sources.BUILTIN_PATH).read_bytes()
    twin = json.loads((Path(sources.BUILTIN_PATH).parent / "builtin.json").read_text("utf-8"))
    twin["walked"]["extra"] = 1
    (tmp_path / "builtin.json").write_text(json.dumps(twin), encoding="utf-8")
    monkeypatch.setattr(layercache, "_HERE", str(tmp_path))
    parsed: list[bytes] = []
    real = sources.parse_toml

    def parse_toml(text: bytes) -> dict:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(sources, "parse_toml", parse_toml)
    monkeypatch.setattr(sources, "_LAYERS", {})
    layer = sources._layer("builtin", sources.BUILTIN_PATH, data, False)
    assert layer is not None and layer.config == BUILTIN and parsed == [data]
