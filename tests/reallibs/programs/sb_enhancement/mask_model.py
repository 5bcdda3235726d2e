"""A tiny spectral-mask model of our own for the sb_enhancement program: a GRU over log
magnitudes and a sigmoid mask per frequency bin (the role custom_model.py plays in
SpeechBrain's enhancement template)."""

import torch


class MaskNet(torch.nn.Module):
    def __init__(self, n_freq=201, hidden=32):
        super().__init__()
        self.rnn = torch.nn.GRU(n_freq, hidden, batch_first=True)
        self.out = torch.nn.Linear(hidden, n_freq)

    def forward(self, feats):
        return torch.sigmoid(self.out(self.rnn(feats)[0]))
