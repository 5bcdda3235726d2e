"""Speaker identification with SpeechBrain: written for autoalloc's real-library tests in the
shape of SpeechBrain's templates/speaker_id/train.py (that template is not on the package index
and is not ours to copy). The same library calls run: hyperpyyaml builds the modules, an
sb.Brain subclass computes Fbank features, an x-vector embedding and speaker log-probabilities,
sb.dataio reads a JSON manifest and a CategoricalEncoder encodes the speaker labels, and
Brain.fit builds the optimizer from the yaml's opt_class. No text target: speaker
classification is not speech-to-text training.

Usage: python train.py train.yaml [--overrides]; data from make_tiny_data.py --sb.
"""

import os
import sys

import speechbrain as sb
import torch
from hyperpyyaml import load_hyperpyyaml


class SpeakerBrain(sb.Brain):
    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        wavs, lens = batch.sig
        feats = self.modules.compute_features(wavs)
        feats = self.modules.mean_var_norm(feats, lens)
        embeddings = self.modules.embedding_model(feats)
        return self.modules.classifier(embeddings)

    def compute_objectives(self, predictions, batch, stage):
        _, lens = batch.sig
        spk_id, _ = batch.spk_id_encoded
        loss = self.hparams.compute_cost(predictions, spk_id, lens)
        if stage != sb.Stage.TRAIN:
            self.error_metrics.append(batch.id, predictions, spk_id, lens)
        return loss

    def on_stage_start(self, stage, epoch=None):
        if stage != sb.Stage.TRAIN:
            self.error_metrics = self.hparams.error_stats()

    def on_stage_end(self, stage, stage_loss, epoch=None):
        if stage == sb.Stage.TRAIN:
            self.train_loss = stage_loss
        else:
            stats = {"loss": stage_loss, "error": self.error_metrics.summarize("average")}
            self.hparams.train_logger.log_stats(
                {"Epoch": epoch}, train_stats={"loss": self.train_loss}, valid_stats=stats
            )
            self.checkpointer.save_and_keep_only(meta=stats, min_keys=["error"])


def dataio_prep(hparams):
    label_encoder = sb.dataio.encoder.CategoricalEncoder()

    @sb.utils.data_pipeline.takes("wav")
    @sb.utils.data_pipeline.provides("sig")
    def audio_pipeline(wav):
        return sb.dataio.dataio.read_audio(wav)

    @sb.utils.data_pipeline.takes("spk_id")
    @sb.utils.data_pipeline.provides("spk_id", "spk_id_encoded")
    def label_pipeline(spk_id):
        yield spk_id
        yield torch.LongTensor([label_encoder.encode_label(spk_id)])

    datasets = {}
    for split in ("train", "valid"):
        datasets[split] = sb.dataio.dataset.DynamicItemDataset.from_json(
            json_path=hparams[f"{split}_annotation"],
            replacements={"data_root": hparams["data_folder"]},
            dynamic_items=[audio_pipeline, label_pipeline],
            output_keys=["id", "sig", "spk_id_encoded"],
        )
    label_encoder.expect_len(hparams["n_classes"])
    label_encoder.load_or_create(
        path=os.path.join(hparams["save_folder"], "label_encoder.txt"),
        from_didatasets=[datasets["train"]],
        output_key="spk_id",
    )
    return datasets


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
    brain = SpeakerBrain(
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
