"""Glow-TTS training with coqui-tts: written for autoalloc's real-library tests against the
coqui-tts 0.28 API, in the shape of a user's LJSpeech recipe (the toolkit's own recipes are not
on the package index and are not ours to copy). The same library calls run: a GlowTTSConfig
with an LJSpeech dataset config, load_tts_samples, GlowTTS built from the config (its audio
processor and tokenizer from the config too), and trainer.Trainer, which builds the optimizer.
Text in, mel spectrogram out: speech synthesis, not speech-to-text training.

Tiny: LJSpeech-tiny/ from make_tiny_data.py --ljspeech, a small model, one epoch, CPU.
"""

import os

from trainer import Trainer, TrainerArgs
from TTS.config.shared_configs import BaseAudioConfig, BaseDatasetConfig
from TTS.tts.configs.glow_tts_config import GlowTTSConfig
from TTS.tts.datasets import load_tts_samples
from TTS.tts.models.glow_tts import GlowTTS

here = os.path.dirname(os.path.abspath(__file__))
output_path = os.path.join(here, "runs")

dataset_config = BaseDatasetConfig(
    formatter="ljspeech", meta_file_train="metadata.csv", path=os.path.join(here, "LJSpeech-tiny")
)
config = GlowTTSConfig(
    run_name="glowtts_tiny",
    audio=BaseAudioConfig(sample_rate=22050),
    batch_size=2,
    eval_batch_size=2,
    num_loader_workers=0,
    num_eval_loader_workers=0,
    run_eval=True,
    epochs=1,
    text_cleaner="basic_cleaners",
    use_phonemes=False,  # no espeak here
    print_step=1,
    print_eval=True,
    mixed_precision=False,
    output_path=output_path,
    datasets=[dataset_config],
    eval_split_size=2,
    test_sentences=[],
    # a tiny model
    hidden_channels_enc=32,
    hidden_channels_dec=32,
    hidden_channels_dp=32,
    num_flow_blocks_dec=2,
    encoder_params={
        "kernel_size": 3, "dropout_p": 0.1, "num_layers": 1, "num_heads": 2,
        "hidden_channels_ffn": 64,
    },
    # Glow-TTS's first data_dep_init_steps only initialise ActNorm and step no optimizer
    data_dep_init_steps=0,
)

train_samples, eval_samples = load_tts_samples(
    config, eval_split=True, eval_split_size=config.eval_split_size
)
model = GlowTTS(config)
trainer = Trainer(
    TrainerArgs(), config, output_path, model=model,
    train_samples=train_samples, eval_samples=eval_samples,
)
trainer.fit()
