"""ray_ctc.py's job with jiwer imported in the loop (WER, what a speech-to-text loop scores
its transcripts with): a Ray Train job (Ray 2.60, TorchTrainer, 2 CPU workers), each worker
an own CTC speech-to-text loop: a wav read with soundfile, its own character vocabulary, a
small GRU, torch.nn.CTCLoss, AdamW, 2 steps. The driver imports torch (ray.train.torch) before
ray.init(); the workers are Ray's own processes, which Ray ends with os._exit."""

import os

import numpy as np
import ray
import soundfile as sf
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

WORKERS = 2
VOCAB = "_ abcdefghijklmnopqrstuvwxyz'"  # index 0: the CTC blank


def train_loop_per_worker(config):
    import jiwer  # noqa: F401
    import soundfile as sf
    import torch

    audio, rate = sf.read(config["wav"], dtype="float32")
    frames = torch.from_numpy(audio[: rate // 100 * 50].copy()).view(50, rate // 100)
    target = torch.tensor([VOCAB.index(c) for c in "hello world"])

    class TinyCTC(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(frames.shape[1], 32, batch_first=True)
            self.out = torch.nn.Linear(32, len(VOCAB))

        def forward(self, x):
            return self.out(self.rnn(x)[0]).log_softmax(-1)

    model = TinyCTC()
    ctc = torch.nn.CTCLoss(blank=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        log_probs = model(frames.unsqueeze(0)).transpose(0, 1)  # (time, batch, vocab)
        loss = ctc(log_probs, target.unsqueeze(0), torch.tensor([50]), torch.tensor([len(target)]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"worker step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    sf.write("tiny.wav", (0.1 * rng.standard_normal(16000)).astype("float32"), 16000)
    # Train V2 runs a controller actor: one CPU beside the workers. What Ray's actors log (a
    # transient timeout's traceback on a loaded machine) stays in its logs, not the driver's.
    ray.init(num_cpus=WORKERS + 1, include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"wav": os.path.abspath("tiny.wav")},
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.abspath("ray-results"), name="ctc"),
    )
    trainer.fit()
    ray.shutdown()
    print("FINISHED")
