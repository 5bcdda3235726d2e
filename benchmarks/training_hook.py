#!/usr/bin/env python3
"""What the ``training`` condition costs on the CPU: the first optimizer built, and later ones.

Each run is a fresh interpreter of the given Python (autoalloc installed with its hook) that
imports soundfile, jiwer (an empty stand-in beside the script: the text-target library
``speech-training`` needs with an audio stack) and torch, builds an AdamW over a small model,
then a second one, and prints both construction times (``time.perf_counter``).
``torch._dynamo``, which torch's first optimizer construction imports anyway (seconds), is
imported before the clock starts, so the figures are autoalloc's share. Arms, interleaved run
by run:

- ``rule``: the built-in policy; the first construction fires ``speech-training`` (the decision
  and the runtime setter run inside it); the second runs torch's own ``__init__`` again.
- ``no rule``: a policy that disables the built-in ``training`` rules (``speech-training``,
  ``asr-toolkit-imports``): no wrapper is installed at all.
- ``disabled``: ``AUTOALLOC_DISABLE=1``: autoalloc does nothing.

Usage::

    python benchmarks/training_hook.py [--python .venv-test/bin/python] [--runs 15] [--json OUT]

Timings never fail the run; it exits 1 only if the ``rule`` arm did not apply the rule.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, os, time
    import soundfile, jiwer, torch
    import torch._dynamo  # what the first optimizer imports anyway: outside the measurement
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    t0 = time.perf_counter()
    first = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t1 = time.perf_counter()
    second = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t2 = time.perf_counter()
    print(json.dumps({"first_ms": (t1 - t0) * 1e3, "second_ms": (t2 - t1) * 1e3,
                      "applied": os.environ.get("AUTOALLOC_APPLIED")}))
    """
)


def run_arm(python: str, script: Path, env: dict[str, str]) -> dict:
    out = subprocess.run([python, str(script)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = root / "finetune.py"
        script.write_text(SCRIPT)
        (root / "jiwer").mkdir()
        (root / "jiwer" / "__init__.py").write_text("")
        off = root / "off.toml"
        off.write_text('disable = ["speech-training", "asr-toolkit-imports"]\n')
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOALLOC_", "PYTORCH_"))}
        base.update(HOME=tmp, XDG_CONFIG_HOME=str(root / "x"), XDG_CONFIG_DIRS=str(root / "s"))
        arms = {
            "rule": base,
            "no rule": {**base, "AUTOALLOC_CONFIG": str(off)},
            "disabled": {**base, "AUTOALLOC_DISABLE": "1"},
        }
        results: dict[str, list[dict]] = {name: [] for name in arms}
        for _ in range(args.runs):
            for name, env in arms.items():
                results[name].append(run_arm(args.python, script, env))
    ok = all(r["applied"] == "speech-training;expandable_segments:True" for r in results["rule"])
    keys = ("first_ms", "second_ms")
    summary = {
        name: {key: round(statistics.median(r[key] for r in rows), 3) for key in keys}
        for name, rows in results.items()
    }
    print(f"{'arm':<10} {'first AdamW (ms)':>17} {'second AdamW (ms)':>18}   "
          f"median of {args.runs} runs")
    for name, row in summary.items():
        print(f"{name:<10} {row['first_ms']:>17.3f} {row['second_ms']:>18.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"runs": args.runs, "median": summary, "raw": results}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    if not ok:
        print("the rule arm did not apply speech-training", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
