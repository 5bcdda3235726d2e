"""An own small CTC speech-to-text trainer: torchaudio features, a SentencePiece tokenizer,
torch.nn.CTCLoss, AdamW, 3 steps. Reads the wavs and transcripts make_tiny_data.py wrote."""

import json

import sentencepiece as spm
import soundfile as sf
import torch
import torchaudio

sp = spm.SentencePieceProcessor(model_file="tokenizer.model")
blank = sp.get_piece_size()  # CTC blank after the tokenizer's pieces
features = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, n_mels=40)
items = list(json.load(open("train.json")).values())


def batch(rows):
    wavs = [torch.from_numpy(sf.read(r["wav"].replace("{data_root}", "data"))[0]).float()
            for r in rows]
    feats = [features(w).clamp(min=1e-6).log().T for w in wavs]  # (frames, mels)
    x = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    xl = torch.tensor([f.shape[0] for f in feats])
    ys = [torch.tensor(sp.encode(r["words"])) for r in rows]
    return x, xl, torch.cat(ys), torch.tensor([len(y) for y in ys])


class TinyCTC(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.rnn = torch.nn.GRU(40, 32, batch_first=True, bidirectional=True)
        self.out = torch.nn.Linear(64, vocab + 1)

    def forward(self, x):
        return self.out(self.rnn(x)[0]).log_softmax(-1)


model = TinyCTC(sp.get_piece_size())
ctc = torch.nn.CTCLoss(blank=blank, zero_infinity=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x, xl, y, yl = batch(items[2 * step: 2 * step + 2])
    loss = ctc(model(x).transpose(0, 1), y, xl, yl)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.3f}")
