"""Character CTC speech recognition with SpeechBrain and no tokenizer library: written for
autoalloc's real-library tests in the shape of SpeechBrain's LibriSpeech CTC recipes (which are
not on the package index and not ours to copy). An sb.Brain subclass computes Fbank features,
a CRDNN encoder and CTC log-probabilities; SpeechBrain's CTCTextEncoder
(speechbrain.dataio.encoder), built from the training transcripts with load_or_create, maps
characters to labels (blank at 0); the yaml's speechbrain.nnet.losses.ctc_loss scores them,
sb.decoders.ctc_greedy_decode decodes, ErrorRateStats counts word and character errors, and
Brain.fit builds the optimizer from the yaml's opt_class. Speech in, text out: speech-to-text
training, with no SentencePiece model anywhere in the program.

Usage: python train.py train.yaml [--overrides]; data from make_tiny_data.py --sb.
"""

import os
import sys

import speechbrain as sb
import torch
from hyperpyyaml import load_hyperpyyaml


class ASR(sb.Brain):
    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        wavs, wav_lens = batch.sig
        feats = self.modules.compute_features(wavs)
        feats = self.modules.normalize(feats, wav_lens)
        encoded = self.modules.encoder(feats)
        logits = self.modules.ctc_lin(encoded)
        return self.hparams.log_softmax(logits), wav_lens

    def compute_objectives(self, predictions, batch, stage):
        p_ctc, wav_lens = predictions
        tokens, tokens_lens = batch.tokens
        loss = self.hparams.ctc_cost(p_ctc, tokens, wav_lens, tokens_lens)
        if stage != sb.Stage.TRAIN:
            hyps = sb.decoders.ctc_greedy_decode(
                p_ctc, wav_lens, blank_id=self.hparams.blank_index
            )
            labels = len(self.label_encoder)  # output_neurons may be larger
            predicted = [
                "".join(self.label_encoder.decode_ndim([i for i in h if i < labels])).split(" ")
                for h in hyps
            ]
            target = [words.split(" ") for words in batch.words]
            self.wer_metric.append(batch.id, predicted, target)
            self.cer_metric.append(batch.id, predicted, target)
        return loss

    def on_stage_start(self, stage, epoch=None):
        if stage != sb.Stage.TRAIN:
            self.cer_metric = self.hparams.cer_computer()
            self.wer_metric = self.hparams.error_rate_computer()

    def on_stage_end(self, stage, stage_loss, epoch=None):
        if stage == sb.Stage.TRAIN:
            self.train_loss = stage_loss
            return
        stats = {
            "loss": stage_loss,
            "CER": self.cer_metric.summarize("error_rate"),
            "WER": self.wer_metric.summarize("error_rate"),
        }
        self.hparams.train_logger.log_stats(
            {"Epoch": epoch}, train_stats={"loss": self.train_loss}, valid_stats=stats
        )
        self.checkpointer.save_and_keep_only(meta={"WER": stats["WER"]}, min_keys=["WER"])
        with open(self.hparams.wer_file, "w", encoding="utf-8") as w:
            self.wer_metric.write_stats(w)


def dataio_prepare(hparams):
    """The train and valid datasets, and the CTCTextEncoder built from their characters."""
    label_encoder = sb.dataio.encoder.CTCTextEncoder()

    @sb.utils.data_pipeline.takes("wav")
    @sb.utils.data_pipeline.provides("sig")
    def audio_pipeline(wav):
        return sb.dataio.dataio.read_audio(wav)

    @sb.utils.data_pipeline.takes("words")
    @sb.utils.data_pipeline.provides("words", "char_list", "tokens_list", "tokens")
    def text_pipeline(words):
        yield words
        char_list = list(words)
        yield char_list
        tokens_list = label_encoder.encode_sequence(char_list)
        yield tokens_list
        yield torch.LongTensor(tokens_list)

    datasets = {
        split: sb.dataio.dataset.DynamicItemDataset.from_json(
            json_path=hparams[f"{split}_annotation"],
            replacements={"data_root": hparams["data_folder"]},
            dynamic_items=[audio_pipeline, text_pipeline],
            output_keys=["id", "sig", "words", "tokens"],
        ).filtered_sorted(sort_key="length")
        for split in ("train", "valid")
    }
    label_encoder.load_or_create(
        path=os.path.join(hparams["save_folder"], "label_encoder.txt"),
        from_didatasets=[datasets["train"]],
        output_key="char_list",
        special_labels={"blank_label": hparams["blank_index"], "unk_label": "<unk>"},
        sequence_input=True,
    )
    return datasets, label_encoder


if __name__ == "__main__":
    hparams_file, run_opts, overrides = sb.parse_arguments(sys.argv[1:])
    with open(hparams_file, encoding="utf-8") as fin:
        hparams = load_hyperpyyaml(fin, overrides)
    sb.create_experiment_directory(
        experiment_directory=hparams["output_folder"],
        hyperparams_to_save=hparams_file,
        overrides=overrides,
    )
    datasets, label_encoder = dataio_prepare(hparams)
    asr_brain = ASR(
        modules=hparams["modules"],
        opt_class=hparams["opt_class"],
        hparams=hparams,
        run_opts=run_opts,
        checkpointer=hparams["checkpointer"],
    )
    asr_brain.label_encoder = label_encoder
    asr_brain.fit(
        asr_brain.hparams.epoch_counter,
        datasets["train"],
        datasets["valid"],
        train_loader_kwargs=hparams["dataloader_options"],
        valid_loader_kwargs=hparams["dataloader_options"],
    )
