"""HiFi-GAN vocoder training with coqui-tts: written for autoalloc's real-library tests against
the coqui-tts 0.28 API, in the shape of a user's LJSpeech vocoder recipe (the toolkit's own
recipes are not on the package index and are not ours to copy). The same library calls run: a
HifiganConfig, load_wav_data, the GAN model (HiFi-GAN generator and discriminators) built from
the config, and trainer.Trainer, which builds the generator's and discriminator's optimizers.
Mel spectrogram in, waveform out: not speech-to-text training.

Tiny: LJSpeech-tiny/wavs from make_tiny_data.py, a small generator, one epoch, CPU.
"""

import os

from trainer import Trainer, TrainerArgs
from TTS.config.shared_configs import BaseAudioConfig
from TTS.vocoder.configs import HifiganConfig
from TTS.vocoder.datasets.preprocess import load_wav_data
from TTS.vocoder.models.gan import GAN

here = os.path.dirname(os.path.abspath(__file__))
output_path = os.path.join(here, "runs")

config = HifiganConfig(
    run_name="hifigan_tiny",
    audio=BaseAudioConfig(sample_rate=22050),
    batch_size=2,
    eval_batch_size=2,
    num_loader_workers=0,
    num_eval_loader_workers=0,
    run_eval=True,
    epochs=1,
    seq_len=4096,
    pad_short=2000,
    use_noise_augment=False,
    eval_split_size=2,
    print_step=1,
    print_eval=True,
    mixed_precision=False,
    data_path=os.path.join(here, "LJSpeech-tiny", "wavs"),
    output_path=output_path,
    # a small generator (the discriminators keep their sizes)
    generator_model_params={
        "upsample_factors": [8, 8, 2, 2],
        "upsample_kernel_sizes": [16, 16, 4, 4],
        "upsample_initial_channel": 32,
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3, 5]],
        "resblock_type": "1",
    },
)

eval_samples, train_samples = load_wav_data(config.data_path, config.eval_split_size)
model = GAN(config)
trainer = Trainer(
    TrainerArgs(), config, output_path, model=model,
    train_samples=train_samples, eval_samples=eval_samples,
)
trainer.fit()
