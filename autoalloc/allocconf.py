"""``PYTORCH_*ALLOC_CONF``: validate, serialize, parse, merge, and which variable torch reads.

Everything here is pure. The rule this module exists to keep: no string it produces is
malformed or semantically invalid for torch's own parser, because on torch 2.10+ CUDA
builds a malformed value aborts ``import torch`` with SIGABRT.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Literal

from autoalloc.messages import did_you_mean, shortened
from autoalloc.records import record
from autoalloc.torchinfo import TorchInfo

CUDA_VAR = "PYTORCH_CUDA_ALLOC_CONF"
HIP_VAR = "PYTORCH_HIP_ALLOC_CONF"
ALLOC_VAR = "PYTORCH_ALLOC_CONF"
ALL_VARS = (CUDA_VAR, HIP_VAR, ALLOC_VAR)
SEGMENTS = "expandable_segments"
# What a policy's [allocator] holds before any file sets it: a rule that applies gets it.
DEFAULT_ALLOCATOR = {SEGMENTS: "True"}


class ConfError(ValueError):
    """A value or string that torch's allocator-config parser would reject."""


def _bool(v: object) -> str:
    if not isinstance(v, bool):
        raise ConfError("must be true or false")
    return "True" if v else "False"


# Torch 2.10+ reads integers with ``stoull``, but up to 2.9 most of them went through ``stoi``
# (a 32-bit int: a larger number raises std::out_of_range): no integer option may exceed this.
MAX_INT = (1 << 31) - 1


def _int(
    low: int | None = None, high: int | None = MAX_INT, pow2: bool = False
) -> Callable[[object], str]:
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
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (isinstance(v, float) and not math.isfinite(v))
        ):
            raise ConfError("must be a number")
        ok = 0.0 <= v <= 1.0 if closed else 0.0 < v < 1.0
        if not ok:
            raise ConfError(
                "must be in [0, 1]" if closed else "must be between 0 and 1 (exclusive)"
            )
        if 0 < v < sys.float_info.min:  # a subnormal number: torch's stod raises out_of_range
            raise ConfError("is too small")
        text = repr(float(v))
        # keep torch's number parser on plain decimals, exactly (1e-20 must not become "0.")
        if "e" in text:
            from decimal import Decimal

            text = format(Decimal(text), "f")
        return text

    return check


def _choice(*choices: str) -> Callable[[object], str]:
    def check(v: object) -> str:
        if v not in choices:
            hint = did_you_mean(v, choices)
            raise ConfError("must be one of " + ", ".join(repr(c) for c in choices) + hint)
        return str(v)

    return check


def _roundup(v: object) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        # torch accepts 0 (no rounding) only inside the list form
        if 0 < v <= MAX_INT and not v & (v - 1):
            return str(v)
        raise ConfError(f"must be a power of 2 (at most {MAX_INT})")
    if not isinstance(v, Mapping) or not v:
        raise ConfError('must be a power of 2 or a table such as { "64" = 8, ">" = 1 }')
    parts = []
    last = 0
    items = list(v.items())
    for i, (boundary, divisions) in enumerate(items):
        if isinstance(divisions, bool) or not isinstance(divisions, int):
            raise ConfError(f"divisions for {boundary!r} must be an integer")
        if divisions != 0 and (divisions < 0 or divisions > MAX_INT or divisions & (divisions - 1)):
            raise ConfError(f"divisions for {boundary!r} must be a power of 2 (or 0)")
        if boundary == ">":
            if i != len(items) - 1:
                raise ConfError('">" must be the last boundary')
        else:
            if not boundary.isdigit() or not boundary.isascii():
                raise ConfError(f'boundary {boundary!r} must be a size in MiB or ">"')
            # int() refuses more than 4300 digits
            size = int(boundary) if len(boundary) <= 20 else MAX_INT + 1
            if size <= 0 or size > MAX_INT or size & (size - 1) or size <= last:
                raise ConfError(f"boundary {boundary!r} must be an increasing power of 2")
            last = size
            boundary = str(size)
        parts.append(f"{boundary}:{divisions}")
    return "[" + ",".join(parts) + "]"


SnapshotKind = Literal["bool", "int", "float", "mib"]


@record(frozen=True)
class Key:
    """One allocator option: the first torch release that knows it, its value check, and how
    ``torch.cuda.memory._snapshot()["allocator_settings"]`` reports it (under the option's
    name, less the ``_mb`` of a size, which it reports in bytes), if it does."""

    name: str
    since: tuple[int, int]
    check: Callable[[object], str]
    snapshot: SnapshotKind | None = None


KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("expandable_segments", (2, 1), _bool, "bool"),
        Key("max_split_size_mb", (1, 13), _int(low=20), "mib"),
        Key("garbage_collection_threshold", (1, 13), _fraction(closed=False), "float"),
        Key("roundup_power2_divisions", (1, 13), _roundup),
        Key("backend", (2, 0), _choice("native", "cudaMallocAsync")),
        Key("release_lock_on_cudamalloc", (2, 2), _bool, "bool"),
        Key("pinned_use_cuda_host_register", (2, 2), _bool, "bool"),
        Key("pinned_num_register_threads", (2, 2), _int(low=1, high=128, pow2=True), "int"),
        Key("max_non_split_rounding_mb", (2, 6), _int(low=20)),
        Key("pinned_use_background_threads", (2, 6), _bool),
        Key("graph_capture_record_stream_reuse", (2, 9), _bool, "bool"),
        Key("per_process_memory_fraction", (2, 10), _fraction(closed=True)),
        Key("pinned_reserve_segment_size_mb", (2, 10), _int(low=1)),
        Key("large_segment_size_mb", (2, 11), _int(low=11)),
        Key("pinned_free_catch_all", (2, 12), _bool),
        Key("throw_on_cudamalloc_oom", (2, 12), _bool),
        Key("pinned_max_round_threshold_mb", (2, 13), _int(low=1)),
        Key("pinned_max_cached_size_mb", (2, 13), _int(low=1)),
    )
}


def version_error(key: str, value: str, release: tuple[int, int]) -> str | None:
    """Why a valid ``value`` is still refused by an older torch ``release``, or None.

    Up to 2.9 torch checked ``max_split_size_mb`` and ``max_non_split_rounding_mb`` with
    ``> 20`` ("must be > 20"); 2.10 relaxed it to ``>= 20``.
    """
    split_keys = ("max_split_size_mb", "max_non_split_rounding_mb")
    if key in split_keys and release < (2, 10) and value == "20":
        return "must be > 20 before torch 2.10"
    return None


def serialize_value(key: str, value: object) -> str:
    """Torch's text for one policy value (TOML-typed); raises ConfError for anything invalid."""
    spec = KEYS.get(key)
    if spec is None:
        raise ConfError(f"unknown allocator option {shortened(key)}")
    return spec.check(value)


def is_serialized(key: str, text: object) -> bool:
    """Whether ``text`` is what ``serialize_value`` makes of some policy value for ``key``:
    the check a validated layer restored from the layer cache gets where its options are
    used, so that no stored text reaches torch without passing what a parsed file's value
    passes."""
    if not isinstance(text, str) or len(text) > 4096:
        return False
    candidates: list[object] = [text, text == "True"] if text in ("True", "False") else [text]
    try:
        candidates.append(int(text) if text.isdigit() and len(text) <= 20 else float(text))
    except ValueError:
        pass
    if text.startswith("[") and text.endswith("]"):
        table = dict(item.partition(":")[::2] for item in text[1:-1].split(","))
        if all(v.isascii() and v.isdigit() for v in table.values()):
            candidates.append({k: int(v) for k, v in table.items()})
    for value in candidates:
        try:
            if serialize_value(key, value) == text:
                return True
        except ConfError:
            pass
    return False


def check_options(options: Mapping[str, str] | Sequence[tuple[str, str]]) -> None:
    """Cross-key constraints on serialized options; raises ConfError.

    The last occurrence of a key counts.

    From 2.11 ``max_split_size_mb`` and ``max_non_split_rounding_mb`` must be at least
    ``large_segment_size_mb`` (torch: "max_split_size_mb too small, must be >= 40").
    """
    pairs = list(options.items()) if isinstance(options, Mapping) else list(options)
    large = _as_torch_reads_int(last_value(pairs, "large_segment_size_mb"))
    if large is None:
        return
    for key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        value = _as_torch_reads_int(last_value(pairs, key))
        if value is not None and value < large:
            raise ConfError(f"{key} must be >= large_segment_size_mb ({value} < {large})")


# Regex sources, compiled on first use by re's own cache: compiled at import, each would cost
# every process that imports torch about 0.5 M instructions, used or not.
_LEADING_INT = r"\+?([0-9]{1,20})"


def _as_torch_reads_int(text: str | None) -> int | None:
    """The number torch's ``stoull`` reads from ``text``: its leading digits (``100abc`` is 100)."""
    m = re.match(_LEADING_INT, text) if text is not None else None
    return int(m.group(1)) if m else None


def serialize(pairs: Sequence[tuple[str, str]] | Mapping[str, str]) -> str:
    """``key:value,key:value`` from already-serialized values."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return ",".join(f"{k}:{v}" for k, v in items)


_KEY_RE = r"[A-Za-z_][A-Za-z0-9_]*\Z"
# torch's tokenizer drops the characters C's isspace() knows (ASCII only) and splits on , : [ ]
_C_SPACE = " \t\n\v\f\r"
_DROP_SPACE = str.maketrans("", "", _C_SPACE)
_ATOM_RE = r"[^ \t\n\v\f\r,:\[\]]+\Z"
ASYNC_BACKENDS = ("cudaMallocAsync", "hipMallocAsync")


def parse(text: str) -> list[tuple[str, str]]:
    """Split an allocator string into ``(key, value)`` pairs, whitespace removed.

    Raises ConfError for anything torch's tokenizer could choke on (a key without a
    value, unbalanced brackets, stray or doubled separators). One trailing comma is
    allowed: every torch accepts it. Values are not checked: an option the user set is
    theirs to keep.
    """
    compact = text.translate(_DROP_SPACE)
    if compact.endswith(",") and not compact.endswith(",,"):
        compact = compact[:-1]
    if not compact:
        if text.translate(_DROP_SPACE):
            raise ConfError("',' without an option")
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
        if not sep or not re.match(_KEY_RE, key) or not value:
            raise ConfError(f"{shortened(item)} is not key:value")
        if value.startswith("["):
            if not value.endswith("]"):
                raise ConfError(f"{shortened(item)} has text after ']'")
            for entry in value[1:-1].split(","):
                left, sep, right = entry.partition(":")
                if not (sep and re.match(_ATOM_RE, left) and re.match(_ATOM_RE, right)):
                    raise ConfError(f"{shortened(item)} has a malformed list")
        elif not re.match(_ATOM_RE, value):
            raise ConfError(f"{shortened(item)} has a malformed value")
        pairs.append((key, value))
    return pairs


def merge(
    existing: Sequence[tuple[str, str]], ours: Mapping[str, str], override: bool
) -> tuple[list[tuple[str, str]], list[str]]:
    """Merge our options into the environment's pairs, keeping the environment's order.

    On a key both set to different values the environment wins unless ``override``.
    Returns the merged pairs and the conflicting keys.
    """
    seen = {key for key, _ in existing}
    conflicts = [k for k in ours if k in seen and last_value(existing, k) != ours[k]]
    merged = [
        (key, ours[key] if override and key in conflicts else value) for key, value in existing
    ]
    merged.extend((k, v) for k, v in ours.items() if k not in seen)
    return merged, conflicts


def tokens(text: str) -> list[str]:
    """torch's ``ConfigTokenizer``: ASCII whitespace dropped, ``, : [ ]`` each a token alone."""
    out: list[str] = []
    buffer = ""
    for ch in text:
        if ch in ",:[]":
            if buffer:
                out.append(buffer)
                buffer = ""
            out.append(ch)
        elif ch not in _C_SPACE:
            buffer += ch
    if buffer:
        out.append(buffer)
    return out


def aborts_import(text: str) -> bool:
    """Whether this value makes ``import torch`` abort (SIGABRT) on torch 2.10+ CUDA/ROCm builds.

    Models the load-time scan of ``PYTORCH_CUDA_ALLOC_CONF`` (else ``PYTORCH_ALLOC_CONF``):
    it walks ``key : value`` triples (a value may be a ``[...]`` list) and skips one
    separator after each, without checking what the separators are, and stops after the
    value of a ``backend`` key; reading a token past the end is an uncaught ``c10::Error``
    in a static initializer. Checked against torch 2.14.1 by
    tests/test_serializer_property.py. Up to 2.9 the scan was a regex and never aborted.
    """
    toks = tokens(text)
    n = len(toks)
    i = 0
    while i < n:
        if toks[i] == "backend":
            return i + 2 >= n  # reads the two tokens after it, then stops
        i += 2  # the ':' after the key, then the value
        if i >= n:
            return True
        if toks[i] == "[":
            while i < n and toks[i] != "]":
                i += 1
            if i >= n:
                return True
        if i + 1 < n:
            i += 1  # the separator
        i += 1
    return False


def last_value(pairs: Sequence[tuple[str, str]], key: str) -> str | None:
    """The value torch ends up with for ``key`` (the last occurrence wins)."""
    found = None
    for k, v in pairs:
        if k == key:
            found = v
    return found


def value_in(text: str | None, key: str) -> str | None:
    """The value torch ends up with for ``key`` in an allocator string (last one wins).

    The one reader of a raw string's effective values (a getter's, an environment
    variable's, a setter call's): a string ``parse`` refuses is read token by token, as far
    as torch's own parser gets before it raises.
    """
    if not text:
        return None
    try:
        return last_value(parse(text), key)
    except ConfError:
        pass
    pairs: list[tuple[str, str]] = []
    for item in _top_level_items(text):
        try:
            pairs.extend(parse(item))
        except ConfError:
            break  # torch stops at the first option it cannot read
    return last_value(pairs, key)


def _top_level_items(text: str) -> list[str]:
    """``text`` split at the commas outside ``[...]`` (tolerant of unbalanced brackets)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth = depth + 1 if ch == "[" else max(depth - 1, 0) if ch == "]" else depth
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def segments_on(text: str | None) -> bool:
    """Whether an allocator string leaves ``expandable_segments`` on (torch: the last wins;
    ``expandable_segments:True,expandable_segments:False`` is off)."""
    return value_in(text, SEGMENTS) == "True"


def from_snapshot(key: str, settings: Mapping[str, object]) -> str | bool | None:
    """``key``'s value as allocator text from ``_snapshot()["allocator_settings"]``.

    None: torch reports the default (no value); False: the snapshot does not report this key.
    """
    spec = KEYS.get(key)
    kind = spec.snapshot if spec is not None else None
    name = key[: -len("_mb")] if kind == "mib" else key
    if kind is None or name not in settings:
        return False
    raw = settings[name]
    if kind == "bool":
        return "True" if raw else "False"
    if kind == "mib":
        if raw is None or not isinstance(raw, int) or raw < 0:
            return None
        return str(raw // (1 << 20))
    return str(raw)


@record(frozen=True)
class InEffect:
    """What torch's allocator uses now, as far as autoalloc knows, and who set each option.

    ``origin`` names who set a key (an environment variable, ``the call at FILE:LINE``, a
    rule); ``runtime`` holds the keys a runtime setter call of the program (not autoalloc's
    own) set last. A late apply merges the rule's options under these.
    """

    pairs: tuple[tuple[str, str], ...] = ()
    origin: Mapping[str, str] = field(default_factory=dict)
    runtime: frozenset[str] = frozenset()

    def refused(self) -> bool:
        """The program turned expandable segments off at run time: its choice, kept."""
        return SEGMENTS in self.runtime and last_value(self.pairs, SEGMENTS) == "False"


def read_order(torch: TorchInfo | None) -> tuple[str, ...]:
    """The variables the installed torch's allocator reads, first one set wins.

    From c10's ``AllocatorConfig.cpp`` (2.9+; pytorch/pytorch#183387 for 2.9's CUDA gap).
    """
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


# What a runtime setter call resets. Every parse of an allocator string (the environment's at
# first use, then each ``_set_allocator_settings`` / ``_accelerator_setAllocatorSettings`` call)
# first puts these keys back to torch's defaults and then applies the string; every other key
# keeps the value it had (``parseArgs`` in c10/cuda/CUDACachingAllocator.cpp up to 2.1,
# c10/cuda/CUDAAllocatorConfig.cpp from 2.2, c10/core/AllocatorConfig.cpp from 2.9), since 1.13.
# Checked against torch 2.13 and 2.14.1 by tests/test_setter_model.py.
_SETTER_RESETS = frozenset(
    {"max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold"}
)
Pairs = Sequence[tuple[str, str]]


def setter_resets(release: tuple[int, int] | None) -> frozenset[str]:
    """The keys a setter call on torch ``release`` resets unless it names them (None: newest)."""
    return _SETTER_RESETS if release is None or release >= (1, 13) else frozenset()


def _last_values(pairs: Pairs) -> dict[str, str]:
    """Each key once, in order of first appearance, with the value torch ends up with."""
    out: dict[str, str] = {}
    for key, value in pairs:
        out[key] = value
    return out


def dropped_by_setter(
    in_effect: Pairs, call: Pairs, release: tuple[int, int] | None
) -> list[tuple[str, str]]:
    """The options in effect that a setter call with ``call`` puts back to torch's default.

    Pure: ``in_effect`` is what torch uses before the call (the string it read, merged with
    earlier calls), ``call`` the call's parsed string.
    """
    resets = setter_resets(release)
    named = {key for key, _ in call}
    return [(k, v) for k, v in _last_values(in_effect).items() if k in resets and k not in named]


def after_setter(
    in_effect: Pairs, call: Pairs, release: tuple[int, int] | None
) -> list[tuple[str, str]]:
    """The options in effect after a setter call: what it resets is gone, its own keys win."""
    dropped = {k for k, _ in dropped_by_setter(in_effect, call, release)}
    ours = _last_values(call)
    kept = [(k, v) for k, v in _last_values(in_effect).items() if k not in dropped | ours.keys()]
    return kept + list(ours.items())


def merged_for_setter(in_effect: Pairs, call: Pairs) -> list[tuple[str, str]]:
    """The call's options over what is in effect (its keys win, nothing else is lost).

    ``backend`` is fixed when torch loads: only the call's own is passed on.
    """
    base = [(k, v) for k, v in _last_values(in_effect).items() if k != "backend"]
    merged, _ = merge(base, _last_values(call), override=True)
    return merged
