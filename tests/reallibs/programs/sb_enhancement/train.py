"""Speech enhancement with SpeechBrain: written for autoalloc's real-library tests in the
shape of SpeechBrain's templates/enhancement/train.py (that template is not on the package
index and is not ours to copy). The same library calls run: hyperpyyaml builds the modules, an
sb.Brain subclass adds noise to clean speech, computes STFT log magnitudes, predicts a mask,
resynthesizes the waveform with the ISTFT, compares spectra with an MSE loss and scores the
waveform with STOI; sb.dataio
reads a JSON manifest and Brain.fit builds the optimizer from the yaml's opt_class. Audio in,
audio out: not speech-to-text training.

Usage: python train.py train.yaml [--overrides]; data from make_tiny_data.py --sb.
"""

import sys

import speechbrain as sb
import torch
from hyperpyyaml import load_hyperpyyaml


class SEBrain(sb.Brain):
    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        clean, lens = batch.sig
        noisy = self.hparams.add_noise(clean, lens)
        noisy_feats = self.compute_feats(noisy)
        mask = self.modules.model(noisy_feats)
        predict_spec = torch.mul(mask, noisy_feats)
        predict_wav = self.hparams.resynth(torch.expm1(predict_spec), noisy)
        return predict_spec, predict_wav

    def compute_feats(self, wavs):
        feats = self.hparams.compute_stft(wavs)
        feats = self.hparams.spectral_magnitude(feats)
        return torch.log1p(feats)

    def compute_objectives(self, predictions, batch, stage):
        predict_spec, predict_wav = predictions
        clean, lens = batch.sig
        clean_spec = self.compute_feats(clean)
        loss = self.hparams.compute_cost(predict_spec, clean_spec, lens)
        self.loss_metric.append(batch.id, predict_spec, clean_spec, lens, reduction="batch")
        if stage != sb.Stage.TRAIN:
            self.stoi_metric.append(batch.id, predict_wav, clean, lens, reduction="batch")
        return loss

    def on_stage_start(self, stage, epoch=None):
        self.loss_metric = self.hparams.loss_stats()
        self.stoi_metric = self.hparams.stoi_stats()

    def on_stage_end(self, stage, stage_loss, epoch=None):
        if stage == sb.Stage.TRAIN:
            self.train_loss = stage_loss
        else:
            stats = {"loss": stage_loss, "stoi": -self.stoi_metric.summarize("average")}
            self.hparams.train_logger.log_stats(
                {"Epoch": epoch}, train_stats={"loss": self.train_loss}, valid_stats=stats
            )
            self.checkpointer.save_and_keep_only(meta=stats, min_keys=["loss"])


def dataio_prep(hparams):
    @sb.utils.data_pipeline.takes("wav")
    @sb.utils.data_pipeline.provides("sig")
    def audio_pipeline(wav):
        return sb.dataio.dataio.read_audio(wav)

    return {
        split: sb.dataio.dataset.DynamicItemDataset.from_json(
            json_path=hparams[f"{split}_annotation"],
            replacements={"data_root": hparams["data_folder"]},
            dynamic_items=[audio_pipeline],
            output_keys=["id", "sig"],
        ).filtered_sorted(sort_key="length")
        for split in ("train", "valid")
    }


if __name__ == "__main__":
    hparams_file, run_opts, overrides = sb.parse_arguments(sys.argv[1:])
    with open(hparams_file, encoding="utf-8") as fin:
        hparams = load_hyperpyyaml(fin, overrides)
    sb.create_experiment_directory(
        experiment_directory=hparams["output_folder"],
        hyperparams_to_save=hparams_file,
        overrides=overrides,
    )
    datasets = dataio_prep(hparams)
    brain = SEBrain(
        modules=hparams["modules"],
        opt_class=hparams["opt_class"],
        hparams=hparams,
        run_opts=run_opts,
        checkpointer=hparams["checkpointer"],
    )
    brain.fit(
        epoch_counter=brain.hparams.epoch_counter,
        train_set=datasets["train"],
        valid_set=datasets["valid"],
        train_loader_kwargs=hparams["dataloader_options"],
        valid_loader_kwargs=hparams["dataloader_options"],
    )
