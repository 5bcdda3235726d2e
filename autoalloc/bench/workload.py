"""The synthetic dynamic-shape ASR workload, runnable: ``python -m autoalloc.bench.workload``.

A reproduction of the scenario autoalloc exists for (NeMo#9061): a Conformer-style CTC
encoder trained on duration-bucketed batches whose shapes change on nearly every step,
close to the memory limit (``--cap-gb``: ``torch.cuda.set_per_process_memory_fraction``).
It measures nothing itself: run it under ``AUTOALLOC_REPORT``, or ``autoalloc ab``::

    autoalloc ab --steps 100 -- python -m autoalloc.bench.workload --preset quick --cap-gb 20

``--static`` trains on one fixed batch shape (the control); ``--setter`` applies
``expandable_segments:True`` with the runtime setter after the model is on the GPU, as NeMo
does. Two helper modes for ``autoalloc bench``: ``--probe PATH`` runs each bucket's worst
batch once and writes the peak memory (to calibrate the cap), ``--check-settings`` prints what
torch reports for the allocator and exits.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from autoalloc.bench import model, schedule

ES_ON = "expandable_segments:True"
SETTINGS_TAG = "AUTOALLOC_BENCH_SETTINGS "
GIB = 1024**3
SCHEDULE_CYCLE = 1000  # a long run replays the schedule rather than drawing it all up front

# One row per preset: the model (a Conformer-style CTC encoder; conv_kernel 31 and 80 mel bins in
# all), the batch schedule, and how `autoalloc bench` runs it.
_PRESET_KEYS = (
    "d_model", "layers", "heads", "ffn", "subsampling_channels", "vocab", "dropout",
    "steps", "warmup", "max_duration", "buckets", "repeats", "arm_timeout",
)
_PRESET_ROWS = {
    # a 12 x d512 Conformer (NeMo's Conformer-CTC medium size), 30 buckets, 300 steps
    "full": (512, 12, 8, 2048, 256, 1024, 0.1, 300, 20, 600.0, 30, 2, 600),
    # under 2 minutes on one GPU, process start-ups included
    "quick": (256, 6, 4, 1024, 128, 256, 0.1, 60, 10, 300.0, 10, 1, 300),
    # the CPU smoke path: plumbing only
    "smoke": (32, 1, 2, 64, 8, 16, 0.0, 3, 1, 40.0, 4, 1, 180),
}
PRESETS: dict[str, dict[str, Any]] = {
    name: {**dict(zip(_PRESET_KEYS, row)), "conv_kernel": 31, "n_mels": 80}
    for name, row in _PRESET_ROWS.items()
}


MODEL_OPTIONS = (
    "d_model", "layers", "heads", "ffn", "vocab", "subsampling_channels", "conv_kernel",
)
# The options the workload takes that `autoalloc bench` passes on: (key, type, help).
SHAPE_OPTIONS: tuple[tuple[str, type, str], ...] = (
    ("max_duration", float, "seconds of audio per batch"),
    ("buckets", int, "duration buckets"),
    *((key, int, f"model: {key.replace('_', ' ')}") for key in MODEL_OPTIONS),
)


def presets(key: str) -> str:
    """`` (full: 600, quick: 300)``: a setting's value in the presets a user picks."""
    return " (" + ", ".join(f"{name}: {PRESETS[name][key]:g}" for name in ("full", "quick")) + ")"


def shape_options(p: argparse.ArgumentParser, with_presets: bool = False) -> None:
    """The batch-shape and model options, and ``--seed``: the workload's and bench's."""
    for key, kind, text in SHAPE_OPTIONS:
        text += presets(key) if with_presets else ""
        p.add_argument(f"--{key.replace('_', '-')}", type=kind, help=text)
    p.add_argument("--seed", type=int, default=1234)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autoalloc.bench.workload",
        description="Train a Conformer-style CTC encoder on Lhotse-like duration-bucketed batches "
        "(synthetic data). Measure it with AUTOALLOC_REPORT or `autoalloc ab -- python -m "
        "autoalloc.bench.workload ...`.",
    )
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="full", help="model and schedule size"
    )
    p.add_argument(
        "--steps", type=int, help="optimizer steps to run (default: the preset's steps + warm-up)"
    )
    for flag, text in (
        ("--static", "one fixed batch shape (the control)"),
        ("--setter", "apply expandable_segments:True with the runtime setter"),
        ("--check-settings", "print the allocator settings torch reports"),
    ):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--cap-gb", type=float, help="memory cap in GiB (per-process memory fraction)")
    shape_options(p)
    p.add_argument(
        "--quadratic-duration", type=float, help="Lhotse's quadratic_duration (default: off)"
    )
    p.add_argument(
        "--probe",
        metavar="PATH",
        help="run each bucket's worst batch once; write peak memory to PATH",
    )
    return p


def config(args: argparse.Namespace) -> dict[str, Any]:
    """The preset with the command line's overrides."""
    cfg = dict(PRESETS[args.preset])
    for key, _, _ in SHAPE_OPTIONS:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cfg["run_steps"] = args.steps if args.steps is not None else cfg["steps"] + cfg["warmup"]
    return cfg


def batches(args: argparse.Namespace, cfg: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The run's batches: the schedule (at most SCHEDULE_CYCLE steps of it, then again)."""
    length = max(1, min(cfg["run_steps"], SCHEDULE_CYCLE))
    plan = schedule.make_schedule(
        length, cfg["max_duration"], cfg["buckets"], args.seed, args.quadratic_duration, args.static
    )
    if args.probe:
        return iter(schedule.probe_schedule(plan)["batches"])
    return itertools.islice(itertools.cycle(plan["batches"]), max(0, cfg["run_steps"]))


def runtime_setter(torch: Any, value: str) -> None:
    """Apply allocator settings at run time the way NeMo does."""
    setter = getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)
    if setter is None:
        setter = torch._C._accelerator_setAllocatorSettings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated on 2.10+, still what NeMo calls
        setter(value)


def device_for(torch: Any, args: argparse.Namespace) -> Any:
    """The device, with the memory cap on CUDA; one CPU thread on the CPU (the smoke path)."""
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if not cuda:
        torch.set_num_threads(1)
        return torch.device("cpu")
    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cudnn.benchmark = False  # no per-shape autotuning: the allocator is what varies
    if args.cap_gb:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(0.95, args.cap_gb * GIB / total), device)
    return device


def check_settings(torch: Any, args: argparse.Namespace) -> int:
    from autoalloc.ab.recorder import allocator_settings, decision_info

    if args.setter:
        runtime_setter(torch, ES_ON)
    report = {"allocator_settings": allocator_settings(torch), "decision": decision_info()}
    print(SETTINGS_TAG + json.dumps(report), flush=True)
    return 0


def train(torch: Any, args: argparse.Namespace, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run the schedule; per batch (probe mode) the peak allocated memory and whether it ran out."""
    device = device_for(torch, args)
    cuda = device.type == "cuda"
    if args.probe and not cuda:
        return {"cuda_available": False, "ooms": 0}
    torch.manual_seed(args.seed)
    net = model.build_model(cfg).to(device)
    net.train()
    if args.setter:
        runtime_setter(torch, ES_ON)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    step_cfg = {**cfg, "amp": cuda}
    oom_error = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    peaks, ooms = [], 0
    for batch in batches(args, cfg):
        frames, tokens = schedule.batch_shape(batch["durations"])
        if cuda and args.probe:
            torch.cuda.reset_peak_memory_stats(device)
        try:
            model.train_step(torch, net, optimizer, frames, tokens, step_cfg, device, generator)
        except oom_error:  # num_ooms counts it; the run goes on, as a trainer's would not
            ooms += 1
            optimizer.zero_grad(set_to_none=True)
        if cuda and args.probe:
            peaks.append(torch.cuda.max_memory_allocated(device))
    out = {
        "cuda_available": cuda,
        "ooms": ooms,
        "parameters": sum(p.numel() for p in net.parameters()),
    }
    if cuda:
        props = torch.cuda.get_device_properties(device)
        out.update(
            device_name=props.name,
            total_memory=props.total_memory,
            peak_allocated=max(peaks, default=0),
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch  # here autoalloc's hook decides, in an arm that leaves it on

    if args.check_settings:
        return check_settings(torch, args)
    result = train(torch, args, config(args))
    if args.probe:
        with open(args.probe, "w", encoding="utf-8") as f:
            json.dump(result, f)
    elif result["ooms"]:
        print(f"workload: {result['ooms']} batches ran out of memory", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
