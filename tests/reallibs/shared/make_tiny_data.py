"""Tiny synthetic speech data for the real-library cases (a setup step; no network).

Writes short wavs (16 kHz unless --sr; a sine per speaker plus noise) with soundfile, tiny
transcripts, and the manifests each trainer reads:
  --sb        SpeechBrain json manifests train.json, valid.json, test.json in the cwd
              ({"utt": {"wav": "{data_root}/...", "length": s, "spk_id": ..., "words": ...}})
  --nemo      NeMo jsonl manifests train_manifest.json, valid_manifest.json
  --noise     data/noise/ and data/rir/ with a few wavs and a placeholder data.zip, so that
              SpeechBrain's prepare_dataset_from_URL finds them and downloads nothing
  --spm N     a SentencePiece model tokenizer.model (vocabulary N) trained on the transcripts
  --text      transcripts.txt (one line per train utterance)
  --ljspeech  metadata.csv (LJSpeech's "id|text|normalized text") next to the --out folder
This file is identical in every program directory that uses it.
"""

import argparse
import json
import os
import zipfile

import numpy as np
import soundfile as sf

WORDS = ("yes no up down left right on off stop go one two three four five six seven eight "
         "nine zero hello world speech model train test").split()
SR = 16000


def wav(path, seconds, freq, rng, sr=SR):
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(t.size)
    sf.write(path, x.astype("float32"), sr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data")
    ap.add_argument("--speakers", type=int, default=4)
    ap.add_argument("--train-per-speaker", type=int, default=2)
    ap.add_argument("--valid", type=int, default=2)
    ap.add_argument("--test", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--sr", type=int, default=16000)
    ap.add_argument("--sb", action="store_true")
    ap.add_argument("--nemo", action="store_true")
    ap.add_argument("--noise", action="store_true")
    ap.add_argument("--spm", type=int, default=0)
    ap.add_argument("--text", action="store_true")
    ap.add_argument("--ljspeech", action="store_true")
    a = ap.parse_args()

    rng = np.random.default_rng(0)
    os.makedirs(a.out, exist_ok=True)
    splits = {"train": [], "valid": [], "test": []}
    n = 0
    for spk in range(a.speakers):
        for _ in range(a.train_per_speaker):
            splits["train"].append(spk)
    for i in range(a.valid):
        splits["valid"].append(i % a.speakers)
    for i in range(a.test):
        splits["test"].append(i % a.speakers)

    rows = {}
    for split, spks in splits.items():
        rows[split] = []
        for spk in spks:
            uid = f"spk{spk:02d}_utt{n:03d}"
            n += 1
            secs = a.seconds + 0.1 * (n % 4)
            path = os.path.join(a.out, uid + ".wav")
            wav(path, secs, 150 + 20 * spk, rng, a.sr)
            words = " ".join(rng.choice(WORDS, size=3))
            rows[split].append((uid, os.path.abspath(path), secs, f"spk{spk:02d}", words))

    if a.sb:
        for split, items in rows.items():
            manifest = {
                uid: {"wav": "{data_root}/" + os.path.basename(p), "length": secs,
                      "spk_id": spk, "words": words.upper()}
                for uid, p, secs, spk, words in items
            }
            with open(f"{split}.json", "w") as fh:
                json.dump(manifest, fh, indent=1)
    if a.nemo:
        for split in ("train", "valid"):
            with open(f"{split}_manifest.json", "w") as fh:
                for _uid, p, secs, _spk, words in rows[split]:
                    row = {"audio_filepath": p, "duration": secs, "text": words}
                    fh.write(json.dumps(row) + "\n")
    if a.noise:
        for sub, count, secs in (("noise", 3, 2.0), ("rir", 2, 0.2)):
            d = os.path.join(a.out, sub)
            os.makedirs(d, exist_ok=True)
            for i in range(count):
                if sub == "rir":
                    size = int(secs * SR)
                    x = np.exp(-np.arange(size) / 400.0) * rng.standard_normal(size)
                    sf.write(os.path.join(d, f"rir{i}.wav"), (0.5 * x).astype("float32"), SR)
                else:
                    sf.write(os.path.join(d, f"noise{i}.wav"),
                             (0.1 * rng.standard_normal(int(secs * SR))).astype("float32"), SR)
            with zipfile.ZipFile(os.path.join(d, "data.zip"), "w"):
                pass
    if a.ljspeech:
        meta = os.path.join(os.path.dirname(os.path.abspath(a.out)), "metadata.csv")
        with open(meta, "w") as fh:
            for items in rows.values():
                for uid, _p, _secs, _spk, words in items:
                    fh.write(f"{uid}|{words}|{words}\n")
    text = [words for items in rows.values() for *_x, words in items]
    if a.text or a.spm:
        with open("transcripts.txt", "w") as fh:
            fh.write("\n".join(t.upper() for t in text) + "\n")
    if a.spm:
        import sentencepiece as spm

        spm.SentencePieceTrainer.train(
            input="transcripts.txt", model_prefix="tokenizer", vocab_size=a.spm,
            model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
            bos_id=-1, eos_id=-1, unk_id=0, minloglevel=2,
        )


if __name__ == "__main__":
    main()
