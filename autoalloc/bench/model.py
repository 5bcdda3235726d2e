"""The synthetic workload's model: a Conformer-style CTC encoder in plain PyTorch, and one step.

torch is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any


def _block_parts(cfg: dict) -> tuple[Any, Any, Any]:
    """The parts of a Conformer block: feed-forward, self-attention, convolution module."""
    from torch import nn
    from torch.nn import functional as F

    d, heads, p = cfg["d_model"], cfg["heads"], cfg["dropout"]

    def FeedForward() -> nn.Module:  # a function, called as the classes below are
        return nn.Sequential(
            nn.LayerNorm(d),
            nn.Linear(d, cfg["ffn"]),
            nn.SiLU(),
            nn.Dropout(p),
            nn.Linear(cfg["ffn"], d),
            nn.Dropout(p),
        )

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.drop = nn.Dropout(p)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p if self.training else 0.0)
            return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))

    class ConvModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            k = cfg["conv_kernel"]
            self.norm = nn.LayerNorm(d)
            self.pointwise1 = nn.Linear(d, 2 * d)
            self.depthwise = nn.Conv1d(d, d, k, padding=k // 2, groups=d)
            self.bn = nn.BatchNorm1d(d)
            self.pointwise2 = nn.Linear(d, d)
            self.drop = nn.Dropout(p)

        def forward(self, x):
            y = F.glu(self.pointwise1(self.norm(x)), dim=-1).transpose(1, 2)
            y = F.silu(self.bn(self.depthwise(y))).transpose(1, 2)
            return self.drop(self.pointwise2(y))

    return FeedForward, SelfAttention, ConvModule


def build_model(cfg: dict):
    """A Conformer-style CTC encoder: conv subsampling, macaron FFN, MHSA, conv module.

    Simplifications that do not change the allocator's workload: absolute positions (no
    relative positional encoding) and no attention padding mask (plain SDPA).
    """
    import torch
    from torch import nn

    d = cfg["d_model"]

    class Subsampling(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = cfg["subsampling_channels"]
            self.conv = nn.Sequential(
                nn.Conv2d(1, c, 3, 2, 1), nn.ReLU(), nn.Conv2d(c, c, 3, 2, 1), nn.ReLU()
            )
            freq = ((cfg["n_mels"] - 1) // 2 + 1 - 1) // 2 + 1
            self.out = nn.Linear(c * freq, d)

        def forward(self, x, lengths):
            x = self.conv(x.unsqueeze(1))  # (B, C, T/4, F/4)
            b, c, t, f = x.shape
            x = self.out(x.transpose(1, 2).reshape(b, t, c * f))
            for _ in range(2):
                lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
            return x, lengths

    FeedForward, SelfAttention, ConvModule = _block_parts(cfg)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ff1, self.ff2 = FeedForward(), FeedForward()
            self.attn, self.conv = SelfAttention(), ConvModule()
            self.norm = nn.LayerNorm(d)

        def forward(self, x):
            x = x + 0.5 * self.ff1(x)
            x = x + self.attn(x)
            x = x + self.conv(x)
            x = x + 0.5 * self.ff2(x)
            return self.norm(x)

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.subsampling = Subsampling()
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.head = nn.Linear(d, cfg["vocab"] + 1)  # + CTC blank (index 0)

        def forward(self, x, lengths):
            x, lengths = self.subsampling(x, lengths)
            for block in self.blocks:
                x = block(x)
            return self.head(x), lengths

    return Encoder()


def train_step(
    torch, model, optimizer, frames: list[int], tokens: list[int], cfg: dict, device, generator
) -> float:
    """One optimizer step on a synthetic batch; the loss."""
    from torch.nn import functional as F

    b, t = len(frames), max(frames)
    x = torch.randn(b, t, cfg["n_mels"], device=device, generator=generator)
    lengths = torch.tensor(frames, device=device)
    targets = torch.randint(1, cfg["vocab"] + 1, (sum(tokens),), device=device, generator=generator)
    target_lengths = torch.tensor(tokens, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["amp"]):
        logits, out_lengths = model(x, lengths)
    log_probs = logits.float().log_softmax(-1).transpose(0, 1)
    loss = F.ctc_loss(log_probs, targets, out_lengths, target_lengths, blank=0, zero_infinity=True)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())
