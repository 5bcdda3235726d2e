"""An own small CTC speech-to-text trainer with no tokenizer library: torchaudio MelSpectrogram
features, a character map built from the transcripts, torch.nn.CTCLoss, torchmetrics'
WordErrorRate on a greedy CTC decoding, AdamW, 3 steps. Reads the wavs and transcripts
make_tiny_data.py --sb wrote (soundfile reads the wavs)."""

import json

import soundfile as sf
import torch
import torchaudio
from torchmetrics.text import WordErrorRate

items = list(json.load(open("train.json")).values())
chars = sorted({c for r in items for c in r["words"]})
char_to_id = {c: i + 1 for i, c in enumerate(chars)}  # 0 is the CTC blank
id_to_char = {i: c for c, i in char_to_id.items()}
features = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, n_mels=40)


def batch(rows):
    wavs = [torch.from_numpy(sf.read(r["wav"].replace("{data_root}", "data"))[0]).float()
            for r in rows]
    feats = [features(w).clamp(min=1e-6).log().T for w in wavs]  # (frames, mels)
    x = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    xl = torch.tensor([f.shape[0] for f in feats])
    ys = [torch.tensor([char_to_id[c] for c in r["words"]]) for r in rows]
    return x, xl, torch.cat(ys), torch.tensor([len(y) for y in ys]), [r["words"] for r in rows]


def greedy_decode(log_probs, lengths):
    texts = []
    for row, n in zip(log_probs.argmax(-1), lengths):
        ids = torch.unique_consecutive(row[:n]).tolist()
        texts.append("".join(id_to_char[i] for i in ids if i != 0))
    return texts


class TinyCTC(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.rnn = torch.nn.GRU(40, 32, batch_first=True, bidirectional=True)
        self.out = torch.nn.Linear(64, vocab + 1)

    def forward(self, x):
        return self.out(self.rnn(x)[0]).log_softmax(-1)


model = TinyCTC(len(chars))
ctc = torch.nn.CTCLoss(blank=0, zero_infinity=True)
wer = WordErrorRate()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x, xl, y, yl, words = batch(items[2 * step: 2 * step + 2])
    log_probs = model(x)
    loss = ctc(log_probs.transpose(0, 1), y, xl, yl)
    opt.zero_grad()
    loss.backward()
    opt.step()
    wer.update(greedy_decode(log_probs.detach(), xl), words)
    print(f"step {step} loss {loss.item():.3f} wer {wer.compute().item():.3f}")
