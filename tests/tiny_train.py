"""A tiny CPU trainer for the AUTOALLOC_REPORT and ``autoalloc ab`` tests (not a test module).

    python tiny_train.py STEPS [--workers N] [--wait-after N] [--no-optimizer] [--fail-when TEXT]

Prints ``READY`` once ``--wait-after`` steps are done and then waits to be signalled;
prints ``SETTINGS <raw allocator string>`` (torch's getter) and ``FINISHED`` at the end.
Under torchrun every rank trains its own copy (no process group: nothing to wait for).
"""

import argparse
import os
import sys
import time

import torch


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((8,), float(index % 7))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--wait-after", type=int)
    p.add_argument("--no-optimizer", action="store_true")
    p.add_argument("--fail-when", help="exit 3 when PYTORCH_CUDA_ALLOC_CONF contains this")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.fail_when is not None and args.fail_when in os.environ.get(
        "PYTORCH_CUDA_ALLOC_CONF", ""
    ):
        print("tiny_train: failing on purpose", file=sys.stderr)
        return 3
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Numbers(), batch_size=4, num_workers=args.workers)
    batches = iter(loader)
    step = 0
    while args.no_optimizer or step < args.steps:
        loss = model(next(batches)).pow(2).mean()
        loss.backward()
        if args.no_optimizer:
            time.sleep(0.05)
            continue
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step == args.wait_after:
            print("READY", flush=True)
            time.sleep(120)
    print("SETTINGS " + torch._C._accelerator_getAllocatorSettings(), flush=True)
    print("FINISHED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
