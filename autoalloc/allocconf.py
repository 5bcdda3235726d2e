"""The ``PYTORCH_*ALLOC_CONF`` grammar: validate, serialize, parse, merge, and which variable torch reads.

Everything here is pure. The rule this module exists to keep: no string it produces is
malformed or semantically invalid for torch's own parser, because on torch 2.10+ CUDA
builds a malformed value aborts ``import torch`` with SIGABRT.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from autoalloc.torchinfo import TorchInfo

CUDA_VAR = "PYTORCH_CUDA_ALLOC_CONF"
HIP_VAR = "PYTORCH_HIP_ALLOC_CONF"
ALLOC_VAR = "PYTORCH_ALLOC_CONF"
ALL_VARS = (CUDA_VAR, HIP_VAR, ALLOC_VAR)



class ConfError(ValueError):
    """A value or string that torch's allocator-config parser would reject."""


def _bool(v: object) -> str:
    if not isinstance(v, bool):
        raise ConfError("must be true or false")
    return "True" if v else "False"


def _int(low: int | None = None, high: int | None = None, pow2: bool = False) -> Callable[[object], str]:
    def check(v: object) -> str:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfError("must be an integer")
        if low is not None and v < low:
            raise ConfError(f"must be >= {low}")
        if high is not None and v > high:
            raise ConfError(f"must be <= {high}")
        if pow2 and (v <= 0 or v & (v - 1)):
            raise ConfError("must be a power of 2")
        return str(v)

    return check


def _fraction(closed: bool) -> Callable[[object], str]:
    def check(v: object) -> str:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfError("must be a number")
        ok = 0.0 <= v <= 1.0 if closed else 0.0 < v < 1.0
        if not ok:
            raise ConfError("must be in [0, 1]" if closed else "must be between 0 and 1 (exclusive)")
        text = repr(float(v))
        if "e" in text:  # keep torch's number parser on plain decimals
            text = f"{float(v):.17f}".rstrip("0")
        return text

    return check


def _choice(*choices: str) -> Callable[[object], str]:
    def check(v: object) -> str:
        if v not in choices:
            raise ConfError("must be one of " + ", ".join(repr(c) for c in choices))
        return str(v)

    return check


def _roundup(v: object) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        if v == 0 or (v > 0 and not v & (v - 1)):
            return str(v)
        raise ConfError("must be a power of 2 (or 0)")
    if not isinstance(v, Mapping) or not v:
        raise ConfError('must be a power of 2 or a table such as { "64" = 8, ">" = 1 }')
    parts = []
    last = 0
    items = list(v.items())
    for i, (boundary, divisions) in enumerate(items):
        if isinstance(divisions, bool) or not isinstance(divisions, int):
            raise ConfError(f"divisions for {boundary!r} must be an integer")
        if divisions != 0 and (divisions < 0 or divisions & (divisions - 1)):
            raise ConfError(f"divisions for {boundary!r} must be a power of 2 (or 0)")
        if boundary == ">":
            if i != len(items) - 1:
                raise ConfError('">" must be the last boundary')
        else:
            if not boundary.isdigit() or not boundary.isascii():
                raise ConfError(f'boundary {boundary!r} must be a size in MiB or ">"')
            size = int(boundary)
            if size <= 0 or size & (size - 1) or size <= last:
                raise ConfError(f"boundary {boundary!r} must be an increasing power of 2")
            last = size
            boundary = str(size)
        parts.append(f"{boundary}:{divisions}")
    return "[" + ",".join(parts) + "]"


@dataclass(frozen=True)
class Key:
    """One allocator option: the first torch release that knows it and its value check."""

    name: str
    since: tuple[int, int]
    check: Callable[[object], str]
    cuda_only: bool = False


KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("expandable_segments", (2, 1), _bool),
        Key("max_split_size_mb", (1, 13), _int(low=20)),
        Key("garbage_collection_threshold", (1, 13), _fraction(closed=False)),
        Key("roundup_power2_divisions", (1, 13), _roundup),
        Key("backend", (2, 0), _choice("native", "cudaMallocAsync"), cuda_only=True),
        Key("release_lock_on_cudamalloc", (2, 2), _bool, cuda_only=True),
        Key("pinned_use_cuda_host_register", (2, 2), _bool, cuda_only=True),
        Key("pinned_num_register_threads", (2, 2), _int(low=1, high=128, pow2=True), cuda_only=True),
        Key("max_non_split_rounding_mb", (2, 6), _int(low=20)),
        Key("pinned_use_background_threads", (2, 6), _bool),
        Key("graph_capture_record_stream_reuse", (2, 9), _bool, cuda_only=True),
        Key("per_process_memory_fraction", (2, 10), _fraction(closed=True), cuda_only=True),
        Key("pinned_reserve_segment_size_mb", (2, 10), _int(low=1), cuda_only=True),
        Key("large_segment_size_mb", (2, 11), _int(low=11)),
        Key("pinned_free_catch_all", (2, 12), _bool, cuda_only=True),
        Key("throw_on_cudamalloc_oom", (2, 12), _bool, cuda_only=True),
        Key("pinned_max_round_threshold_mb", (2, 13), _int(low=1)),
        Key("pinned_max_cached_size_mb", (2, 13), _int(low=1)),
    )
}


def serialize_value(key: str, value: object) -> str:
    """Torch's text for one policy value (TOML-typed); raises ConfError for anything invalid."""
    spec = KEYS.get(key)
    if spec is None:
        raise ConfError(f"unknown allocator option {key!r}")
    return spec.check(value)


def check_options(options: Mapping[str, str]) -> None:
    """Cross-key constraints on serialized options; raises ConfError."""
    split = options.get("max_split_size_mb")
    large = options.get("large_segment_size_mb")
    if split is not None and large is not None and int(split) < int(large):
        raise ConfError("max_split_size_mb must be >= large_segment_size_mb")


def serialize(pairs: Sequence[tuple[str, str]] | Mapping[str, str]) -> str:
    """``key:value,key:value`` from already-serialized values."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return ",".join(f"{k}:{v}" for k, v in items)


_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ATOM_RE = re.compile(r"[^\s,:\[\]]+\Z")


def parse(text: str) -> list[tuple[str, str]]:
    """Split an allocator string into ``(key, value)`` pairs, whitespace removed.

    Raises ConfError for anything torch's tokenizer could choke on (a key without a
    value, unbalanced brackets, stray separators). Values are not checked: an option
    the user set is theirs to keep.
    """
    compact = "".join(text.split())
    if not compact:
        return []
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(compact):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfError("nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfError("unmatched ']'")
        elif ch == "," and depth == 0:
            items.append(compact[start:i])
            start = i + 1
    if depth:
        raise ConfError("unclosed '['")
    items.append(compact[start:])
    pairs = []
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not _KEY_RE.match(key) or not value:
            raise ConfError(f"{item!r} is not key:value")
        if value.startswith("["):
            if not value.endswith("]"):
                raise ConfError(f"{item!r} has text after ']'")
            for entry in value[1:-1].split(","):
                left, sep, right = entry.partition(":")
                if not (sep and _ATOM_RE.match(left) and _ATOM_RE.match(right)):
                    raise ConfError(f"{item!r} has a malformed list")
        elif not _ATOM_RE.match(value):
            raise ConfError(f"{item!r} has a malformed value")
        pairs.append((key, value))
    return pairs


def merge(
    existing: Sequence[tuple[str, str]], ours: Mapping[str, str], override: bool
) -> tuple[list[tuple[str, str]], list[str]]:
    """Merge our options into the environment's pairs, keeping the environment's order.

    On a key both set to different values the environment wins unless ``override``.
    Returns the merged pairs and the conflicting keys.
    """
    merged: list[tuple[str, str]] = []
    conflicts: list[str] = []
    seen: set[str] = set()
    for key, value in existing:
        if key in ours and ours[key] != value:
            conflicts.append(key)
            if override:
                value = ours[key]
        seen.add(key)
        merged.append((key, value))
    merged.extend((k, v) for k, v in ours.items() if k not in seen)
    return merged, conflicts


def last_value(pairs: Sequence[tuple[str, str]], key: str) -> str | None:
    """The value torch ends up with for ``key`` (the last occurrence wins)."""
    found = None
    for k, v in pairs:
        if k == key:
            found = v
    return found


def read_order(torch: TorchInfo | None) -> tuple[str, ...]:
    """The variables the installed torch's allocator reads, first one set wins (see reference §1)."""
    if torch is None:
        return ALL_VARS
    release, rocm = torch.release, torch.flavour == "rocm"
    if release >= (2, 10):
        return (CUDA_VAR, HIP_VAR, ALLOC_VAR)
    if release >= (2, 8) and rocm:
        return (CUDA_VAR, HIP_VAR)
    # <= 2.9 CUDA builds: the CUDA caching allocator reads only the legacy name.
    return (CUDA_VAR,)


def effective_var(env: Mapping[str, str], torch: TorchInfo | None) -> str | None:
    """The variable whose value the installed torch uses; a set-but-empty variable counts."""
    for name in read_order(torch):
        if name in env:
            return name
    return None
