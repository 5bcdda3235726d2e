#!/usr/bin/env python3
"""The GPU A/B of dynamic-shape ASR-like training: a thin runner for ``autoalloc bench``.

The benchmark lives in the package (``autoalloc/bench/``) so that ``autoalloc bench``
works after ``pip install autoalloc``; this script runs it from a checkout, with its
working files under ``benchmarks/out/dynamic_batches`` unless ``--out`` says otherwise::

    python benchmarks/dynamic_batches.py --quick  # < 2 min on one GPU; CPU smoke run without one
    python benchmarks/dynamic_batches.py          # the full A/B (about 5 minutes on an H200)
    python benchmarks/dynamic_batches.py --help

The hook arm needs autoalloc *installed* (its ``autoalloc.pth`` processed at start-up) in
the interpreter that runs the arms; from a bare checkout, ``pip install -e .`` first.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    from autoalloc.bench import command
except ImportError:  # not installed: use the checkout
    sys.path.insert(0, REPO)
    from autoalloc.bench import command


def main(argv: list[str]) -> int:
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        argv = ["--out", os.path.join(REPO, "benchmarks", "out", "dynamic_batches"), *argv]
    return command.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
