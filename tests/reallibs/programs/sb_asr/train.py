"""CTC speech recognition with SpeechBrain: written for autoalloc's real-library tests in the
shape of SpeechBrain's templates/speech_recognition/ASR/train.py (that template is not on the
package index and is not ours to copy). The same library calls run: hyperpyyaml builds the
modules and a SentencePiece tokenizer that the yaml's Pretrainer loads, an sb.Brain subclass
computes Fbank features, a CRDNN encoder and CTC log-probabilities, the yaml's
speechbrain.nnet.losses.ctc_loss scores them against the tokenized transcripts, ErrorRateStats
counts word errors of the greedy CTC decoding, and Brain.fit builds the optimizer from the
yaml's opt_class. Speech in, text out: speech-to-text training.

Usage: python train.py train.yaml [--overrides]; data from make_tiny_data.py --sb --spm N.
"""

import sys

import speechbrain as sb
import torch
from hyperpyyaml import load_hyperpyyaml
from speechbrain.utils.distributed import run_on_main


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
            vocab = self.tokenizer.get_piece_size()  # output_neurons may be larger
            predicted = [
                self.tokenizer.decode_ids([i for i in h if i < vocab]).split(" ") for h in hyps
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


def dataio_prepare(hparams, tokenizer):
    @sb.utils.data_pipeline.takes("wav")
    @sb.utils.data_pipeline.provides("sig")
    def audio_pipeline(wav):
        return sb.dataio.dataio.read_audio(wav)

    @sb.utils.data_pipeline.takes("words")
    @sb.utils.data_pipeline.provides("words", "tokens_list", "tokens")
    def text_pipeline(words):
        yield words
        tokens_list = tokenizer.encode_as_ids(words)
        yield tokens_list
        yield torch.LongTensor(tokens_list)

    return {
        split: sb.dataio.dataset.DynamicItemDataset.from_json(
            json_path=hparams[f"{split}_annotation"],
            replacements={"data_root": hparams["data_folder"]},
            dynamic_items=[audio_pipeline, text_pipeline],
            output_keys=["id", "sig", "words", "tokens"],
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
    run_on_main(hparams["pretrainer"].collect_files)
    hparams["pretrainer"].load_collected()
    datasets = dataio_prepare(hparams, hparams["tokenizer"])
    asr_brain = ASR(
        modules=hparams["modules"],
        opt_class=hparams["opt_class"],
        hparams=hparams,
        run_opts=run_opts,
        checkpointer=hparams["checkpointer"],
    )
    asr_brain.tokenizer = hparams["tokenizer"]
    asr_brain.fit(
        asr_brain.hparams.epoch_counter,
        datasets["train"],
        datasets["valid"],
        train_loader_kwargs=hparams["dataloader_options"],
        valid_loader_kwargs=hparams["dataloader_options"],
    )
