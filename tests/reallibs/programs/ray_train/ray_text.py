"""A Ray Train job (Ray 2.60, TorchTrainer, 2 CPU workers): each worker trains a tiny GRU
language model on characters of a fixed text, cross-entropy, AdamW, 2 steps: text only."""

import os

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

WORKERS = 2
TEXT = "the quick brown fox jumps over the lazy dog. " * 4


def train_loop_per_worker(config):
    import torch

    chars = sorted(set(TEXT))
    ids = torch.tensor([chars.index(c) for c in TEXT])

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(len(chars), 16)
            self.rnn = torch.nn.GRU(16, 32, batch_first=True)
            self.out = torch.nn.Linear(32, len(chars))

        def forward(self, x):
            return self.out(self.rnn(self.embed(x))[0])

    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        logits = model(ids[:-1].unsqueeze(0))
        loss = torch.nn.functional.cross_entropy(logits.squeeze(0), ids[1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"worker step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    # Train V2 runs a controller actor: one CPU beside the workers. What Ray's actors log (a
    # transient timeout's traceback on a loaded machine) stays in its logs, not the driver's.
    ray.init(num_cpus=WORKERS + 1, include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(
        train_loop_per_worker,
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.abspath("ray-results"), name="text"),
    )
    trainer.fit()
    ray.shutdown()
    print("FINISHED")
