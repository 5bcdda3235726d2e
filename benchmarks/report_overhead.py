#!/usr/bin/env python3
"""What ``AUTOALLOC_REPORT`` costs per optimizer step, on a small CPU model.

Runs the same training loop (an MLP, SGD, one CPU thread) with and without
``AUTOALLOC_REPORT`` (a directory: the dearer case, with the interim reports rewritten at
steps 1, 2, 4, ... and every few seconds), interleaved, each in its own process of this
interpreter (autoalloc installed, so its hook installs the recorder), and compares the
loop's median step time.
It also prints the recorder's own account of its time (``recorder.hook_s`` in the report):
the time spent inside its step hook, which is the part of the difference it causes.

    python benchmarks/report_overhead.py [--steps 3000] [--repeat 5] [--json PATH]

On CUDA the recorder also reads ``torch.cuda.memory_stats()`` at each step after the
warm-up; that cost is in every report (``recorder.memory_stats_s`` / ``memory_stats_calls``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

LOOP = """
import json, sys, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
times = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - t)
print("LOOP " + json.dumps(times[len(times) // 10:]))
"""


def one_run(steps: int, report: str | None) -> tuple[float, dict | None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOALLOC_REPORT")}
    env["OMP_NUM_THREADS"] = "1"
    if report:
        env["AUTOALLOC_REPORT"] = report + os.sep
        env["AUTOALLOC_REPORT_WARMUP"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", LOOP, str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("LOOP "))
    median = statistics.median(json.loads(line[5:]))
    recorded = None
    if report:
        [path] = glob.glob(os.path.join(report, "*.json"))
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
    return median, recorded


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args(argv)
    off, on, hook_us = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            off.append(one_run(args.steps, None)[0])
            median, report = one_run(args.steps, os.path.join(tmp, f"r{i}"))
            on.append(median)
            assert report is not None and report["steps"] == args.steps, report
            hook_us.append(1e6 * report["recorder"]["hook_s"] / report["steps"])
    result = {
        "load_average_after": [round(x, 2) for x in os.getloadavg()],  # the machine's load
        "steps": args.steps,
        "repeat": args.repeat,
        "step_us_without": [round(1e6 * t, 2) for t in off],
        "step_us_with": [round(1e6 * t, 2) for t in on],
        "median_step_us_without": round(1e6 * statistics.median(off), 2),
        "median_step_us_with": round(1e6 * statistics.median(on), 2),
        "recorder_hook_us_per_step": round(statistics.median(hook_us), 2),
    }
    result["overhead_us_per_step"] = round(
        result["median_step_us_with"] - result["median_step_us_without"], 2
    )
    result["overhead_ratio"] = round(statistics.median(on) / statistics.median(off), 4)
    print(
        f"small CPU model, {args.steps} steps x {args.repeat} runs each: median step "
        f"{result['median_step_us_without']:.1f} us without AUTOALLOC_REPORT, "
        f"{result['median_step_us_with']:.1f} us with (x{result['overhead_ratio']:.3f}); "
        "the recorder's own time in its step hook: "
        f"{result['recorder_hook_us_per_step']:.2f} us/step"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
