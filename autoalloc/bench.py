"""``autoalloc bench``: the GPU A/B of the caching allocator on dynamic-shape ASR-like training.

A self-contained reproduction of the scenario autoalloc exists for (NeMo#9061): a
Conformer-style CTC encoder trained on duration-bucketed batches whose shapes change on
nearly every step, close to the memory limit. Every arm runs the same pre-generated
batch schedule in its own process (the allocator option must be in place before CUDA
starts), and reports per-step allocator counters, reserved memory and step time:

- ``default``         the caching allocator as shipped;
- ``env``             ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` set by hand;
- ``setter``          the runtime setter after the model is on the GPU (NeMo's approach);
- ``hook``            autoalloc's startup hook, on a script that matches a rule of a policy
                      file the bench writes (``AUTOALLOC_CONFIG``); the arm checks it fired;
- ``static-default``, ``static-env``: one fixed batch shape, without and with the option.

Memory pressure comes from ``torch.cuda.set_per_process_memory_fraction``, calibrated by
a short probe so that peak allocated memory sits near ``--fill`` (0.88) of the cap. Every
arm asserts from ``torch.cuda.memory._snapshot()["allocator_settings"]`` that the option is
what it intended. Output: a table, JSON and (with matplotlib) a PNG of step time and
reserved memory per step.

Without a GPU (or with ``--smoke``) it says so and runs the CPU smoke path instead: the
schedule, every arm in its own process with a tiny model for a few steps on the CPU
(allocator settings read back through torch's getter), the report, JSON and PNG.

Nothing here imports torch at module level: the parent process never does, the arm
processes import it inside ``worker_main`` (which is what fires the hook in the hook arm).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence

FRAMES_PER_SECOND = 100  # 10 ms feature hop
TOKENS_PER_SECOND = 4.0
MIN_DURATION, MAX_DURATION = 1.0, 35.0
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
ES_ON = "expandable_segments:True"
HOOK_RULE = "autoalloc-bench-hook-arm"
HOOK_SCRIPT = "autoalloc_bench_hook_arm.py"
ARM_SCRIPT = "autoalloc_bench_arm.py"
COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms", "num_sync_all_streams")
GIB = 1024**3

# name -> (environment, runtime setter, hook, intended expandable_segments, schedule)
ARMS = {
    "default": ({}, False, False, False, "dynamic"),
    "env": ({"PYTORCH_CUDA_ALLOC_CONF": ES_ON, "PYTORCH_ALLOC_CONF": ES_ON}, False, False, True, "dynamic"),
    "setter": ({}, True, False, True, "dynamic"),
    "hook": ({}, False, True, True, "dynamic"),
    "static-default": ({}, False, False, False, "static"),
    "static-env": ({"PYTORCH_CUDA_ALLOC_CONF": ES_ON, "PYTORCH_ALLOC_CONF": ES_ON}, False, False, True, "static"),
}

MODEL_KEYS = ("d_model", "layers", "heads", "ffn", "conv_kernel", "subsampling_channels", "vocab", "n_mels", "dropout")
PRESETS = {
    # the recommended design (asr-ecosystem.md): 12 x d512 Conformer, 30 buckets, 300 steps
    "full": dict(
        d_model=512,
        layers=12,
        heads=8,
        ffn=2048,
        conv_kernel=31,
        subsampling_channels=256,
        vocab=1024,
        n_mels=80,
        dropout=0.1,
        steps=300,
        warmup=20,
        max_duration=600.0,
        buckets=30,
        repeats=2,
        arm_timeout=600,
    ),
    # under 2 minutes on one GPU, process start-ups included
    "quick": dict(
        d_model=256,
        layers=6,
        heads=4,
        ffn=1024,
        conv_kernel=31,
        subsampling_channels=128,
        vocab=256,
        n_mels=80,
        dropout=0.1,
        steps=60,
        warmup=10,
        max_duration=300.0,
        buckets=10,
        repeats=1,
        arm_timeout=300,
    ),
    # the CPU smoke path: plumbing only
    "smoke": dict(
        d_model=32,
        layers=1,
        heads=2,
        ffn=64,
        conv_kernel=31,
        subsampling_channels=8,
        vocab=16,
        n_mels=80,
        dropout=0.0,
        steps=3,
        warmup=1,
        max_duration=40.0,
        buckets=4,
        repeats=1,
        arm_timeout=180,
    ),
}


class BenchError(Exception):
    """An arm that could not do what it set out to (the option not as intended, the hook silent)."""


# ============================================================================ the schedule


def draw_duration(rng: random.Random) -> float:
    """A LibriSpeech-like utterance duration in seconds: log-normal, clipped to 1-35 s."""
    return min(MAX_DURATION, max(MIN_DURATION, rng.lognormvariate(math.log(12.0), 0.5)))


def effective(duration: float, quadratic: float | None) -> float:
    """Lhotse's ``quadratic_duration``: long utterances count for more (attention is quadratic)."""
    return duration + duration * duration / quadratic if quadratic else duration


def bucket_bounds(num_buckets: int, seed: int) -> list[float]:
    """Upper duration bound of each bucket: quantiles of a sample (Lhotse's estimate_duration_bins)."""
    rng = random.Random(seed + 1)
    sample = sorted(draw_duration(rng) for _ in range(20000))
    bounds = [sample[min(len(sample) - 1, (len(sample) * (i + 1)) // num_buckets)] for i in range(num_buckets)]
    bounds[-1] = MAX_DURATION
    return bounds


def make_schedule(
    steps: int, max_duration: float, num_buckets: int, seed: int, quadratic: float | None = None, static: bool = False
) -> dict:
    """The batch schedule every arm replays: one list of utterance durations per step.

    Dynamic: utterances arrive in random order (fixed seed), go to their duration bucket,
    and a bucket emits a batch as soon as it holds ``floor(max_duration / bucket max)``
    utterances (Lhotse's DynamicBucketingSampler with fixed per-bucket batch sizes), so
    the bucket order is random and shapes change on nearly every step. Static: one
    bucket's full batch, every utterance at the bucket's maximum, on every step.
    """
    bounds = bucket_bounds(num_buckets, seed)
    sizes = [max(1, int(max_duration // effective(b, quadratic))) for b in bounds]
    batches: list[dict] = []
    if static:
        b = num_buckets // 2
        batches = [{"bucket": b, "durations": [bounds[b]] * sizes[b]} for _ in range(steps)]
    else:
        rng = random.Random(seed)
        queues: list[list[float]] = [[] for _ in bounds]
        while len(batches) < steps:
            d = draw_duration(rng)
            b = next(i for i, bound in enumerate(bounds) if d <= bound)
            queues[b].append(round(d, 2))
            if len(queues[b]) >= sizes[b]:
                batches.append({"bucket": b, "durations": queues[b]})
                queues[b] = []
    return {
        "kind": "static" if static else "dynamic",
        "seed": seed,
        "max_duration": max_duration,
        "quadratic_duration": quadratic,
        "bucket_bounds": [round(b, 2) for b in bounds],
        "batch_sizes": sizes,
        "batches": batches,
    }


def batch_shape(durations: Sequence[float]) -> tuple[list[int], list[int]]:
    """Feature frames and label tokens of each utterance of a batch."""
    frames = [max(8, round(d * FRAMES_PER_SECOND)) for d in durations]
    tokens = [max(1, round(d * TOKENS_PER_SECOND)) for d in durations]
    return frames, tokens


def schedule_summary(schedule: dict) -> dict:
    shapes = set()
    audio = 0.0
    for batch in schedule["batches"]:
        frames, _ = batch_shape(batch["durations"])
        shapes.add((len(frames), max(frames)))
        audio += sum(batch["durations"])
    sizes = [len(b["durations"]) for b in schedule["batches"]]
    return {
        "kind": schedule["kind"],
        "steps": len(schedule["batches"]),
        "distinct_shapes": len(shapes),
        "batch_size_range": [min(sizes), max(sizes)] if sizes else [],
        "max_frames_range": [min(s[1] for s in shapes), max(s[1] for s in shapes)] if shapes else [],
        "audio_hours": round(audio / 3600, 3),
        "buckets": len(schedule["bucket_bounds"]),
        "batch_sizes": schedule["batch_sizes"],
    }


def probe_schedule(schedule: dict) -> dict:
    """The calibration probe's batches: each bucket's worst case (full batch at the bucket maximum)."""
    batches = [
        {"bucket": i, "durations": [bound] * size}
        for i, (bound, size) in enumerate(zip(schedule["bucket_bounds"], schedule["batch_sizes"]))
    ]
    return {**schedule, "kind": "probe", "batches": [*batches, batches[0]]}


# ============================================================================ the model (torch inside)


def build_model(cfg: dict):
    """A Conformer-style CTC encoder in plain PyTorch: conv subsampling, macaron FFN, MHSA, conv module.

    Simplifications that do not change the allocator's workload: absolute positions (no
    relative positional encoding) and no attention padding mask (plain SDPA).
    """
    import torch
    from torch import nn
    from torch.nn import functional as F

    d, heads, p = cfg["d_model"], cfg["heads"], cfg["dropout"]

    class Subsampling(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = cfg["subsampling_channels"]
            self.conv = nn.Sequential(nn.Conv2d(1, c, 3, 2, 1), nn.ReLU(), nn.Conv2d(c, c, 3, 2, 1), nn.ReLU())
            freq = ((cfg["n_mels"] - 1) // 2 + 1 - 1) // 2 + 1
            self.out = nn.Linear(c * freq, d)

        def forward(self, x, lengths):
            x = self.conv(x.unsqueeze(1))  # (B, C, T/4, F/4)
            b, c, t, f = x.shape
            x = self.out(x.transpose(1, 2).reshape(b, t, c * f))
            for _ in range(2):
                lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
            return x, lengths

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.LayerNorm(d), nn.Linear(d, cfg["ffn"]), nn.SiLU(), nn.Dropout(p), nn.Linear(cfg["ffn"], d), nn.Dropout(p)
            )

        def forward(self, x):
            return self.net(x)

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

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ff1, self.attn, self.conv, self.ff2 = FeedForward(), SelfAttention(), ConvModule(), FeedForward()
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


def train_step(torch, model, optimizer, frames: list[int], tokens: list[int], cfg: dict, device, generator) -> float:
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


# ============================================================================ one arm (its own process)


def runtime_setter(torch, value: str) -> str:
    """Apply allocator settings at run time the way NeMo does; the function used."""
    import warnings

    setter = getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)
    name = "torch.cuda.memory._set_allocator_settings"
    if setter is None:
        setter, name = torch._C._accelerator_setAllocatorSettings, "torch._C._accelerator_setAllocatorSettings"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated on 2.10+, still what NeMo calls
        setter(value)
    return name


def parse_es(raw: str) -> bool:
    """``expandable_segments`` in a raw allocator string (the last one wins, like torch's parser)."""
    value = False
    for item in raw.replace(" ", "").split(","):
        key, _, val = item.partition(":")
        if key == "expandable_segments":
            value = val == "True"
    return value


def allocator_settings(torch, cuda: bool) -> dict:
    """What torch says the allocator uses: the parsed snapshot on CUDA, else the raw getter string."""
    if cuda:
        settings = torch.cuda.memory._snapshot()["allocator_settings"]
        return {
            "expandable_segments": bool(settings["expandable_segments"]),
            "source": 'torch.cuda.memory._snapshot()["allocator_settings"]',
            "raw": settings.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        }
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is None:
        return {"expandable_segments": None, "source": None, "raw": None}
    raw = getter()
    return {"expandable_segments": parse_es(raw), "source": "torch._C._accelerator_getAllocatorSettings()", "raw": raw}


def hook_report() -> dict:
    """Whether autoalloc's startup hook fired in this process, and what it decided."""
    hook = sys.modules.get("autoalloc.hook")
    decision = getattr(getattr(hook, "STATE", None), "decision", None)
    return {
        "AUTOALLOC_APPLIED": os.environ.get("AUTOALLOC_APPLIED"),
        "env": {k: os.environ[k] for k in ALLOC_VARS if k in os.environ},
        "decision": getattr(decision, "action", None),
        "rule": getattr(decision, "rule", None),
        "watcher_armed_at_start": "autoalloc._startup" in sys.modules,
    }


def check_hook(report: dict) -> None:
    applied = report["AUTOALLOC_APPLIED"] or ""
    if not report["watcher_armed_at_start"]:
        raise BenchError(
            f"autoalloc's startup hook is not installed for {sys.executable} (autoalloc.pth was not processed): "
            "install autoalloc into this environment (pip install autoalloc) and run `autoalloc doctor`"
        )
    if not applied.startswith(HOOK_RULE + ";") or report["decision"] != "apply" or report["rule"] != HOOK_RULE:
        raise BenchError(f"autoalloc's hook did not apply rule {HOOK_RULE!r} at import torch: {report}")
    if not any(parse_es(v) for v in report["env"].values()):
        raise BenchError(f"autoalloc's hook fired but the environment has no {ES_ON}: {report}")


def verify(cfg: dict, settings: dict) -> None:
    if settings["expandable_segments"] is not None and settings["expandable_segments"] != cfg["intent"]:
        raise BenchError(
            f"arm {cfg['arm']} intended expandable_segments={cfg['intent']}, but torch reports "
            f"{settings['expandable_segments']} ({settings['source']}: {settings['raw']!r})"
        )


def check_settings(torch, cfg: dict, result: dict) -> dict:
    """``--check-settings``: set the arm up as for training, without a model or a GPU, and read back.

    On a CUDA build the snapshot's parsed settings answer even without a GPU, so this
    checks every arm's mechanism (env, runtime setter, hook) on a machine without one.
    """
    if cfg["setter"]:
        result["setter"] = runtime_setter(torch, ES_ON)
    settings = allocator_settings(torch, torch.version.cuda is not None)
    result["allocator_settings"] = settings
    verify(cfg, settings)
    result["verified"] = settings["expandable_segments"] is not None
    result["steps"] = []
    return result


def worker_main(argv: Sequence[str]) -> int:
    """Entry point of an arm's process: ``CONFIG.json RESULT.json``."""
    config_path, result_path = argv[0], argv[1]
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    started = time.perf_counter()
    try:
        result = run_arm(cfg)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    result["process_s"] = time.perf_counter() - started
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 1 if "error" in result else 0


def run_arm(cfg: dict) -> dict:
    import torch  # in the hook arm, this line is where autoalloc decides

    result: dict = {"arm": cfg["arm"], "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if cfg["arm"] == "hook":
        result["hook"] = hook_report()
        check_hook(result["hook"])
    if cfg["mode"] == "settings":
        return check_settings(torch, cfg, result)
    cuda = cfg["device"] == "cuda"
    if cuda and not torch.cuda.is_available():
        if cfg["mode"] == "probe":
            return {**result, "cuda_available": False}
        raise BenchError("CUDA is not available")
    result["cuda_available"] = bool(cuda)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = False
        props = torch.cuda.get_device_properties(device)
        result.update(device_name=props.name, total_memory=props.total_memory)
        if cfg.get("fraction"):
            torch.cuda.set_per_process_memory_fraction(cfg["fraction"], device)
    else:
        torch.set_num_threads(1)  # the smoke run: do not fight other processes for cores
        result.update(device_name="cpu", total_memory=None)
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"]).to(device)
    model.train()
    if cfg["setter"]:
        result["setter"] = runtime_setter(torch, ES_ON)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    result["parameters"] = sum(p.numel() for p in model.parameters())

    settings = allocator_settings(torch, cuda)
    result["allocator_settings"] = settings
    verify(cfg, settings)
    result["verified"] = settings["expandable_segments"] is not None

    model_cfg = {**cfg["model"], "amp": cuda}
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg["seed"])
    oom_error = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError

    def stats() -> dict:
        return torch.cuda.memory_stats(device) if cuda else {}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    steps = []
    for index, batch in enumerate(cfg["schedule"]["batches"]):
        frames, tokens = batch_shape(batch["durations"])
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        before = stats()
        sync()
        t0 = time.perf_counter()
        oom = False
        loss = None
        try:
            loss = train_step(torch, model, optimizer, frames, tokens, model_cfg, device, generator)
        except oom_error:
            oom = True
            optimizer.zero_grad(set_to_none=True)
        sync()
        elapsed = time.perf_counter() - t0
        after = stats()
        record = {
            "step": index,
            "bucket": batch["bucket"],
            "batch": len(frames),
            "max_frames": max(frames),
            "frames": sum(frames),
            "time_s": elapsed,
            "oom": oom,
            "loss": loss,
        }
        if cuda:
            for key in COUNTERS:
                record[key] = after.get(key, 0) - before.get(key, 0)
            record["reserved_peak"] = after.get("reserved_bytes.all.peak", 0)
            record["reserved"] = after.get("reserved_bytes.all.current", 0)
            record["allocated_peak"] = after.get("allocated_bytes.all.peak", 0)
        steps.append(record)
    result["steps"] = steps
    if cuda:
        final = torch.cuda.memory_stats(device)
        result["totals"] = {key: final.get(key, 0) for key in COUNTERS}
        result["allocator_settings_end"] = allocator_settings(torch, cuda)
    return result


# ============================================================================ the parent: arms, calibration, report

WORKER_SOURCE = """\
# Written by `autoalloc bench`: one arm of the A/B, run in its own process.
import sys

try:
    from autoalloc import bench
except ImportError:  # running from a source checkout
    sys.path.insert(0, {package_parent!r})
    from autoalloc import bench

sys.exit(bench.worker_main(sys.argv[1:]))
"""

HOOK_POLICY = f"""\
# Written by `autoalloc bench` for its hook arm (AUTOALLOC_CONFIG: the highest layer).
enabled = true

[allocator]
expandable_segments = true

[[rules]]
name = "{HOOK_RULE}"
description = "the hook arm of autoalloc bench"
scripts = ["{HOOK_SCRIPT}"]
action = "apply"
"""


class Runner:
    """Starts the arm processes from a working directory of scripts, configs and logs."""

    def __init__(self, workdir: str, python: str, timeout: float) -> None:
        self.workdir = os.path.abspath(workdir)
        self.python = python
        self.timeout = timeout
        for sub in ("scripts", "runs"):
            os.makedirs(os.path.join(self.workdir, sub), exist_ok=True)
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for name in (ARM_SCRIPT, HOOK_SCRIPT):
            self._write(os.path.join("scripts", name), WORKER_SOURCE.format(package_parent=package_parent))
        self.policy = self._write(os.path.join("scripts", "policy.toml"), HOOK_POLICY)
        self.stripped = {k: os.environ[k] for k in ALLOC_VARS if k in os.environ}

    def _write(self, rel: str, text: str) -> str:
        path = os.path.join(self.workdir, rel)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def env(self, arm: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOALLOC_") and k not in ALLOC_VARS}
        arm_env, _, hook, _, _ = ARMS.get(arm, ARMS["default"])
        env.update(arm_env)
        env["PYTHONUNBUFFERED"] = "1"
        if hook:
            env["AUTOALLOC_CONFIG"] = self.policy
        else:
            env["AUTOALLOC_DISABLE"] = "1"  # no policy of this machine may touch the other arms
        return env

    def run(self, tag: str, cfg: dict) -> tuple[dict, float]:
        """Run one arm process; its result (with ``error`` on failure) and wall time."""
        config_path = self._write(os.path.join("runs", f"{tag}.config.json"), json.dumps(cfg))
        result_path = os.path.join(self.workdir, "runs", f"{tag}.result.json")
        log_path = os.path.join(self.workdir, "runs", f"{tag}.log")
        if os.path.exists(result_path):
            os.remove(result_path)
        script = os.path.join(self.workdir, "scripts", HOOK_SCRIPT if cfg["arm"] == "hook" else ARM_SCRIPT)
        t0 = time.perf_counter()
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                code = subprocess.run(
                    [self.python, script, config_path, result_path],
                    env=self.env(cfg["arm"]),
                    cwd=self.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self.timeout,
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
        wall = time.perf_counter() - t0
        try:
            with open(result_path, encoding="utf-8") as f:
                result = json.load(f)
        except (OSError, ValueError):
            with open(log_path, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-3000:]
            why = f"timed out after {self.timeout:.0f} s" if code is None else f"exited {code} without a result"
            result = {"error": f"the {cfg['arm']} process {why}; log {log_path}:\n{tail}"}
        return result, wall


def check_all_settings(runner: Runner, arms: list[str], json_path: str) -> int:
    """Each arm in its own process, set up but not trained: does torch report what the arm intends?"""
    results = {}
    for arm in arms:
        cfg = {"arm": arm, "mode": "settings", "device": "cpu", "setter": ARMS[arm][1], "intent": ARMS[arm][3]}
        result, _ = runner.run(f"settings-{arm}", cfg)
        results[arm] = result
        if "error" in result:
            line = f"FAILED: {result['error']}"
        else:
            settings = result["allocator_settings"]
            line = f"expandable_segments={settings['expandable_segments']} (intended {ARMS[arm][3]}) from {settings['source']}"
        print(f"{arm:<15}{line}")
    if os.path.dirname(json_path):
        os.makedirs(os.path.dirname(json_path), exist_ok=True)
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    return 1 if any("error" in r for r in results.values()) else 0


def quantile(values: Sequence[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(arm: str, runs: list[dict], warmup: int, cap: float | None) -> dict:
    """One arm over its repeats: steps after warm-up, OOM steps counted but not timed."""
    good = [r for r in runs if "error" not in r]
    steps = [s for r in good for s in r["steps"][warmup:]]
    timed = [s for s in steps if not s["oom"]]
    times = [s["time_s"] * 1000 for s in timed]
    out: dict = {
        "arm": arm,
        "runs": len(runs),
        "failed_runs": len(runs) - len(good),
        "steps_measured": len(timed),
        "oom_steps": sum(1 for s in steps if s["oom"]),
        "intended_expandable_segments": ARMS[arm][3],
        "expandable_segments": sorted({r["allocator_settings"]["expandable_segments"] for r in good}, key=str),
        "settings_source": sorted({str(r["allocator_settings"]["source"]) for r in good}),
        "verified": bool(good) and all(r.get("verified") for r in good),
        "errors": [r["error"] for r in runs if "error" in r],
    }
    if times:
        out["step_ms"] = {"median": statistics.median(times), "p95": quantile(times, 0.95), "mean": statistics.fmean(times)}
        out["frames_per_s"] = {
            "median": statistics.median(s["frames"] / s["time_s"] for s in timed),
            "overall": sum(s["frames"] for s in timed) / sum(s["time_s"] for s in timed),
        }
    if steps and "num_device_alloc" in steps[0]:
        per_step = {}
        for key in COUNTERS:
            values = [s[key] for s in steps]
            per_step[key] = {"mean": statistics.fmean(values), "median": statistics.median(values), "total": sum(values)}
        out["per_step"] = per_step
        out["warmup_totals"] = {key: sum(s[key] for r in good for s in r["steps"][:warmup]) for key in COUNTERS}
        out["reserved_peak_gib"] = max(s["reserved_peak"] for s in steps) / GIB
        peak_alloc = max(s["allocated_peak"] for r in good for s in r["steps"])
        out["allocated_peak_gib"] = peak_alloc / GIB
        if cap:
            out["allocated_peak_of_cap"] = peak_alloc / cap
    return out


def compare_arms(arms: dict) -> dict:
    def ratio(a: str, b: str) -> float | None:
        try:
            return arms[a]["step_ms"]["median"] / arms[b]["step_ms"]["median"]
        except (KeyError, ZeroDivisionError):
            return None

    out = {f"{a}_vs_default": ratio(a, "default") for a in ("env", "setter", "hook")}
    out["static-env_vs_static-default"] = ratio("static-env", "static-default")
    return out


def checks(arms: dict, comparisons: dict, gpu: bool) -> list[dict]:
    """The GPU budgets, as pass/miss lines (informational: they never fail the run)."""
    if not gpu:
        return []
    out = []
    r = comparisons.get("hook_vs_default")
    if r is not None:
        out.append({"check": "hook: median step time <= 0.8 x default", "value": r, "ok": r <= 0.8})
    hook = arms.get("hook", {}).get("per_step")
    if hook:
        mean = hook["num_device_alloc"]["mean"]
        out.append(
            {"check": "hook: device allocations per step after warm-up ~0 (mean <= 0.05)", "value": mean, "ok": mean <= 0.05}
        )
    r = comparisons.get("static-env_vs_static-default")
    if r is not None:
        out.append({"check": "static shapes: env within +-2% of default", "value": r, "ok": abs(r - 1) <= 0.02})
    return out


def fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def render(report: dict) -> str:
    meta = report["meta"]
    cal = report.get("calibration") or {}
    lines = [
        f"autoalloc bench ({meta['mode']}): {meta.get('device_name', '?')}, torch {meta.get('torch', '?')}, "
        f"model {meta['parameters_m']} M parameters, {report['config']['steps']} steps "
        f"({report['config']['warmup']} warm-up), {report['config']['repeats']} repeat(s)",
    ]
    dyn = report["schedule"]["dynamic"]
    lines.append(
        f"schedule: {dyn['buckets']} buckets, max_duration {report['config']['max_duration']:.0f} s, batch sizes "
        f"{dyn['batch_size_range']}, {dyn['distinct_shapes']} distinct shapes in {dyn['steps']} steps"
    )
    if cal.get("cap_bytes"):
        lines.append(
            f"memory cap: {cal['cap_bytes'] / GIB:.2f} GiB "
            f"(fraction {cal['fraction']:.4f} of {cal['total_memory'] / GIB:.1f} GiB); "
            f"probe peak allocated {cal['probe_peak_allocated'] / GIB:.2f} GiB, target fill {cal['fill']:.2f}"
        )
    lines.append("")
    head = (
        f"{'arm':<15}{'ES':>6}{'step ms':>9}{'p95':>8}{'frames/s':>11}{'allocs/st':>10}{'frees/st':>9}"
        f"{'retries':>8}{'OOMs':>6}{'resv GiB':>9}{'alloc/cap':>10}{'vs def':>8}"
    )
    lines += [head, "-" * len(head)]
    comparisons = report["comparisons"]
    for name, arm in report["arms"].items():
        es = "/".join(str(v) for v in arm["expandable_segments"]) or "?"
        es = {"True": "on", "False": "off"}.get(es, es)
        if arm["errors"]:
            lines.append(f"{name:<15}{'FAILED: ' + arm['errors'][0].splitlines()[0][:100]}")
            continue
        step, fps, per = arm.get("step_ms", {}), arm.get("frames_per_s", {}), arm.get("per_step")
        vs = (
            comparisons.get(f"{name}_vs_default")
            if name in ("env", "setter", "hook")
            else (comparisons.get("static-env_vs_static-default") if name == "static-env" else None)
        )
        lines.append(
            f"{name:<15}{es:>6}{fmt(step.get('median')):>9}{fmt(step.get('p95')):>8}{fmt(fps.get('median'), '.0f'):>11}"
            f"{fmt(per and per['num_device_alloc']['mean'], '.2f'):>10}{fmt(per and per['num_device_free']['mean'], '.2f'):>9}"
            f"{fmt(per and per['num_alloc_retries']['total'], 'd'):>8}{fmt(per and per['num_ooms']['total'], 'd'):>6}"
            f"{fmt(arm.get('reserved_peak_gib'), '.2f'):>9}{fmt(arm.get('allocated_peak_of_cap'), '.3f'):>10}"
            f"{fmt(vs, '.3f'):>8}"
        )
    lines.append("")
    lines.append(
        "ES: expandable_segments as torch reports it in the arm; allocs/frees per step: num_device_alloc/free deltas "
        "after warm-up (mean); retries, OOMs: totals after warm-up; vs def: median step time / default's."
    )
    for check in report["checks"]:
        lines.append(f"check: {check['check']}: {check['value']:.3f} -> {'ok' if check['ok'] else 'MISS'}")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def plot(report: dict, runs: list[dict], path: str) -> str | None:
    """Step time, reserved memory and device allocations per step, one line per arm (first repeat).

    None when matplotlib is not installed (``pip install "autoalloc[bench]"``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return None
    fig, (ax_time, ax_mem, ax_alloc) = plt.subplots(
        3, 1, figsize=(11, 9.5), sharex=True, gridspec_kw={"height_ratios": [3, 2, 2]}
    )
    seen = set()
    for run in runs:
        result = run["result"]
        if run["arm"] in seen or "error" in result:
            continue
        seen.add(run["arm"])
        steps = result["steps"]
        x = [s["step"] for s in steps]
        style = "--" if run["arm"].startswith("static") else "-"
        ax_time.plot(x, [s["time_s"] * 1000 for s in steps], style, label=run["arm"], linewidth=1)
        if steps and "reserved_peak" in steps[0]:
            ax_mem.plot(x, [s["reserved_peak"] / GIB for s in steps], style, label=run["arm"], linewidth=1)
            total, cumulative = 0, []
            for s in steps:
                total += s["num_device_alloc"]
                cumulative.append(total)
            ax_alloc.plot(x, cumulative, style, label=run["arm"], linewidth=1)
    warmup = report["config"]["warmup"]
    for ax in (ax_time, ax_mem, ax_alloc):
        ax.axvspan(-0.5, warmup - 0.5, color="0.9", zorder=0)
        ax.grid(alpha=0.3)
    ax_time.set_ylabel("step time (ms)")
    ax_time.set_yscale("log")
    ax_time.legend(fontsize=8, ncol=3)
    meta = report["meta"]
    ax_time.set_title(f"autoalloc bench ({meta['mode']}): {meta.get('device_name', '?')}, torch {meta.get('torch', '?')}")
    ax_mem.set_ylabel("reserved, peak of step (GiB)")
    ax_alloc.set_ylabel("device allocations\n(cumulative)")
    ax_alloc.set_xlabel("step (shaded: warm-up)")
    cap = (report.get("calibration") or {}).get("cap_bytes")
    if cap:
        ax_mem.axhline(cap / GIB, color="k", linewidth=0.8, linestyle=":", label="cap")
        ax_mem.legend(fontsize=8, ncol=4)
    for ax in (ax_mem, ax_alloc):
        if not ax.lines:
            ax.text(0.5, 0.5, "no CUDA memory statistics (CPU smoke run)", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autoalloc bench",
        description="GPU A/B of PyTorch's caching allocator on a dynamic-shape ASR-like training loop near the "
        "memory cap: default vs expandable_segments set by env, by the runtime setter (NeMo), and by autoalloc's "
        "hook, plus a static-shape control. Without a GPU, runs the CPU smoke path and exits 0.",
    )
    p.add_argument("--quick", action="store_true", help="small model and 60 steps: under 2 minutes on one GPU")
    p.add_argument("--smoke", action="store_true", help="the CPU smoke path even when a GPU is present")
    p.add_argument(
        "--check-settings",
        action="store_true",
        help="only check that each arm gets the allocator setting it intends (its own process, no training); "
        "exact on CUDA builds even without a GPU",
    )
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default: all: {','.join(ARMS)})")
    p.add_argument("--repeats", type=int, help="run the arm sequence this many times, interleaved (full: 2)")
    p.add_argument("--steps", type=int, help="steps per arm (full: 300, quick: 60)")
    p.add_argument("--warmup", type=int, help="warm-up steps left out of the statistics (full: 20, quick: 10)")
    p.add_argument("--max-duration", type=float, help="seconds of audio per batch (full: 600, quick: 300)")
    p.add_argument("--buckets", type=int, help="duration buckets (full: 30, quick: 10)")
    p.add_argument("--quadratic-duration", type=float, help="Lhotse's quadratic_duration (default: off)")
    p.add_argument("--seed", type=int, default=1234)
    for key, what in (
        ("d-model", "model width"),
        ("layers", "Conformer blocks"),
        ("heads", "attention heads"),
        ("ffn", "feed-forward width"),
        ("vocab", "CTC vocabulary (without blank)"),
        ("subsampling-channels", "channels of the Conv2d subsampling"),
        ("conv-kernel", "depthwise convolution kernel"),
    ):
        p.add_argument(f"--{key}", type=int, help=what)
    p.add_argument("--fill", type=float, default=0.88, help="target peak allocated / cap for the calibration (default 0.88)")
    p.add_argument("--cap-gb", type=float, help="memory cap in GiB instead of calibrating it")
    p.add_argument("--no-cap", action="store_true", help="no memory cap (no pressure)")
    p.add_argument("--out", default="autoalloc-bench", help="working directory for scripts, logs and results")
    p.add_argument("--json", help="results JSON (default OUT/bench.json)")
    p.add_argument("--png", help="plot (default OUT/bench.png; needs matplotlib)")
    p.add_argument("--deadline", type=float, help="seconds: start no arm process that would end after this")
    p.add_argument("--arm-timeout", type=float, help="seconds one arm process may take")
    p.add_argument("--python", default=sys.executable, help="interpreter for the arm processes (default: this one)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(argv) if argv is not None else None)
    t_start = time.perf_counter()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        print(f"autoalloc bench: unknown arm(s) {unknown}; known: {list(ARMS)}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    notes: list[str] = []

    def settings_for(preset: str) -> dict:
        base = dict(PRESETS[preset])
        for key in ("repeats", "steps", "warmup", "max_duration", "buckets", "arm_timeout"):
            if getattr(args, key, None) is not None:
                base[key] = getattr(args, key)
        for key in ("d_model", "layers", "heads", "ffn", "vocab", "subsampling_channels", "conv_kernel"):
            if getattr(args, key) is not None and preset != "smoke":
                base[key] = getattr(args, key)
        return base

    # A short probe: is there a GPU (in an arm-like process, never in this one), and how much
    # memory does the worst batch of each bucket take?
    mode = "smoke" if args.smoke else ("quick" if args.quick else "full")
    conf = settings_for(mode)
    runner = Runner(args.out, args.python, conf["arm_timeout"])
    if args.check_settings:
        return check_all_settings(runner, arms, args.json or os.path.join(args.out, "settings.json"))
    if runner.stripped:
        notes.append(f"ignored for the arms (each sets its own): {runner.stripped}")

    def arm_config(arm: str, schedule: dict, device: str, fraction: float | None, run_mode: str = "run") -> dict:
        return {
            "arm": arm,
            "mode": run_mode,
            "device": device,
            "setter": ARMS[arm][1],
            "intent": ARMS[arm][3],
            "seed": args.seed,
            "fraction": fraction,
            "model": {k: conf[k] for k in MODEL_KEYS},
            "schedule": schedule,
        }

    def schedules() -> dict:
        return {
            kind: make_schedule(
                conf["steps"], conf["max_duration"], conf["buckets"], args.seed, args.quadratic_duration, kind == "static"
            )
            for kind in ("dynamic", "static")
        }

    device = "cpu"
    calibration: dict = {}
    probe_result: dict = {}
    if mode != "smoke":
        scheds = schedules()
        probe_cfg = arm_config("default", probe_schedule(scheds["dynamic"]), "cuda", None, "probe")
        print(
            "autoalloc bench: probing the GPU and calibrating the memory cap "
            f"({len(probe_cfg['schedule']['batches'])} batches) ...",
            flush=True,
        )
        probe_result, probe_wall = runner.run("probe", probe_cfg)
        if probe_result.get("cuda_available") is False or (
            "error" in probe_result and "CUDA is not available" in probe_result["error"]
        ):
            print(
                "autoalloc bench: no CUDA GPU available here: running the CPU smoke path instead "
                "(schedule, every arm for a few steps of a tiny model, report). Allocator figures need a GPU."
            )
            notes.append("no CUDA GPU: CPU smoke path; the figures are plumbing checks, not measurements")
            mode = "smoke"
        elif "error" in probe_result:
            print(f"autoalloc bench: the calibration probe failed: {probe_result['error']}", file=sys.stderr)
            return 1
        else:
            device = "cuda"
            peak = max(s["allocated_peak"] for s in probe_result["steps"])
            total = probe_result["total_memory"]
            calibration = {"probe_peak_allocated": peak, "total_memory": total, "fill": args.fill, "probe_s": probe_wall}
            if args.no_cap:
                calibration.update(cap_bytes=None, fraction=None)
            else:
                cap = args.cap_gb * GIB if args.cap_gb else peak / args.fill
                fraction = min(0.95, cap / total)
                calibration.update(cap_bytes=fraction * total, fraction=fraction)
                if fraction < cap / total:
                    notes.append("the calibrated cap exceeds 95% of the GPU: capped at 95%; lower --max-duration")
            probe_ooms = sum(1 for s in probe_result["steps"] if s["oom"])
            if probe_ooms:
                notes.append(f"the probe ran out of memory on {probe_ooms} batches: lower --max-duration")
    if mode == "smoke":
        conf = settings_for("smoke")
        runner.timeout = conf["arm_timeout"]
        scheds = schedules()

    fraction = calibration.get("fraction")
    runs: list[dict] = []
    last_wall = 0.0
    for repeat in range(conf["repeats"]):
        for arm in arms:
            elapsed = time.perf_counter() - t_start
            if args.deadline and elapsed + last_wall > args.deadline:
                notes.append(f"deadline: skipped {arm} (repeat {repeat + 1}) at {elapsed:.0f} s")
                continue
            sched = scheds[ARMS[arm][4]]
            cfg = arm_config(arm, sched, device, fraction)
            print(f"autoalloc bench: arm {arm} (repeat {repeat + 1}/{conf['repeats']}) ...", flush=True)
            result, wall = runner.run(f"{arm}-{repeat + 1}", cfg)
            last_wall = wall
            runs.append({"arm": arm, "repeat": repeat + 1, "wall_s": wall, "result": result})
            if "error" in result:
                print(f"autoalloc bench: arm {arm} FAILED: {result['error'].splitlines()[0]}", file=sys.stderr)

    cap = calibration.get("cap_bytes")
    summaries = {
        arm: summarize(arm, [r["result"] for r in runs if r["arm"] == arm], conf["warmup"], cap)
        for arm in arms
        if any(r["arm"] == arm for r in runs)
    }
    comparisons = compare_arms(summaries)
    good = next((r["result"] for r in runs if "error" not in r["result"]), probe_result)
    report = {
        "meta": {
            "mode": mode,
            "gpu": device == "cuda",
            "device_name": good.get("device_name"),
            "torch": good.get("torch"),
            "torch_cuda": good.get("torch_cuda"),
            "parameters_m": round((good.get("parameters") or 0) / 1e6, 2),
            "python": sys.version.split()[0],
            "command": "autoalloc bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "total_s": None,
        },
        "config": {
            **{k: conf[k] for k in (*MODEL_KEYS, "steps", "warmup", "max_duration", "buckets", "repeats")},
            "arms": arms,
            "seed": args.seed,
            "quadratic_duration": args.quadratic_duration,
            "fill": args.fill,
        },
        "calibration": calibration,
        "schedule": {kind: schedule_summary(s) for kind, s in scheds.items()},
        "arms": summaries,
        "comparisons": comparisons,
        "checks": checks(summaries, comparisons, device == "cuda"),
        "notes": notes,
        "runs": runs,
    }
    report["meta"]["total_s"] = round(time.perf_counter() - t_start, 1)
    json_path = args.json or os.path.join(args.out, "bench.json")
    png_path = args.png or os.path.join(args.out, "bench.png")
    for path in (json_path, png_path):
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    written = plot(report, runs, png_path)
    report["meta"]["png"] = written
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print()
    print(render(report))
    print(f"\nwrote {json_path}" + (f" and {written}" if written else " (no PNG: matplotlib is not installed)"))
    failed = [r for r in runs if "error" in r["result"]]
    return 1 if failed else 0
