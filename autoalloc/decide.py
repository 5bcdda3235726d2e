"""Decide what to do: policy + entry point + environment + installed torch in, a ``Decision`` out.

Pure: it computes the environment writes (or the runtime-setter string), the warnings
and the notes, but performs none of them; ``hook`` carries them out, ``explain`` and
``doctor`` only show them. Every allocator string it produces comes from
``allocconf.serialize`` of validated values merged into a string that ``allocconf.parse``
accepted, so it is never malformed.
"""

from __future__ import annotations

import sys
from collections.abc import Container, Mapping
from dataclasses import dataclass, field

from autoalloc import allocconf
from autoalloc.allocconf import ALL_VARS, ALLOC_VAR, CUDA_VAR, HIP_VAR
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import first_match
from autoalloc.policy import Policy, Valued
from autoalloc.torchinfo import TorchInfo

APPLIED_VAR = "AUTOALLOC_APPLIED"
ISSUE_119452 = "https://github.com/pytorch/pytorch/issues/119452"
ISSUE_123548 = "https://github.com/pytorch/pytorch/issues/123548"


@dataclass(frozen=True)
class Decision:
    """What autoalloc decided for this process, and everything needed to explain it.

    ``action``: ``apply`` (a rule asked for options), ``skip`` (a deny rule matched),
    ``none`` (no rule matched), ``disabled`` (``enabled = false`` or ``AUTOALLOC_DISABLE``),
    ``inherited`` (a parent process applied them already; nothing to do, nothing to say).
    """

    action: str
    entry: EntryPoint
    torch: TorchInfo | None = None
    rule: str | None = None
    rule_source: str | None = None
    reason: str = ""
    trigger: str | None = None
    requested: Mapping[str, str] = field(default_factory=dict)  # options the policy asks for, after gating
    env_before: Mapping[str, str] = field(default_factory=dict)  # allocator variables already set
    read_var: str | None = None  # the variable torch reads, after the writes
    value: str | None = None  # the allocator string torch will read
    writes: Mapping[str, str] = field(default_factory=dict)  # environment assignments to make
    setter_value: str | None = None  # for a late trigger: the full string for the runtime setter
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def via(self) -> str:
        if self.setter_value is not None:
            return "setter"
        return "env" if self.writes.keys() - {APPLIED_VAR} else ""

    def summary(self) -> str:
        parts = [f"{self.entry.describe()}: {self.action}"]
        if self.rule:
            parts.append(f"rule {self.rule} from {self.rule_source}")
        if self.reason:
            parts.append(f"({self.reason})")
        if self.value is not None and self.action == "apply":
            via = " via the runtime setter" if self.setter_value is not None else ""
            parts.append(f"-> {self.read_var}={self.value!r}{via}")
        return " ".join(parts)


def layer_warnings(policy: Policy) -> list[str]:
    """One warning per layer file that could not be used."""
    out = []
    for layer in policy.layers:
        if layer.status in ("error", "untrusted"):
            out.append(f"autoalloc: ignoring the {layer.layer} policy {layer.path}: {layer.message}")
    return out


def _platform_notes(torch: TorchInfo | None, platform: str) -> tuple[list[str], bool]:
    """Notes on why the options may have no effect, and whether expandable segments must not be written."""
    if torch is None:
        return ["torch is not installed here: the decision assumes a recent CUDA build"], False
    if platform.startswith("win"):
        return ["expandable segments are not supported on Windows: not written"], True
    if torch.flavour == "rocm":
        major = int(torch.hip.split(".")[0]) if torch.hip and torch.hip.split(".")[0].isdigit() else 0
        if torch.release < (2, 12) or major < 7:
            note = f"expandable segments need torch >= 2.12 with ROCm >= 7.0 ({torch.describe()}): not written"
            return [note], True
    if torch.flavour == "cpu":
        return [f"{torch.describe()}: allocator options have no effect without a GPU build (written anyway)"], False
    return [], False


def _gate(
    options: Mapping[str, Valued], torch: TorchInfo | None, platform: str, late: bool
) -> tuple[dict[str, str], list[str], list[str]]:
    """Drop options the installed torch (or platform, or a late application) cannot take."""
    notes, no_segments = _platform_notes(torch, platform)
    warnings: list[str] = []
    kept: dict[str, str] = {}
    for key, valued in options.items():
        spec = allocconf.KEYS[key]
        origin = valued.source.describe() if valued.source else "autoalloc's default"
        if torch is not None and torch.release < spec.since:
            warnings.append(
                f"autoalloc: {key} needs torch >= {spec.since[0]}.{spec.since[1]}, but {torch.describe()} is installed: "
                f"not set (asked for by {origin})"
            )
        elif key == "expandable_segments" and no_segments:
            continue
        elif key == "backend" and late:
            notes.append("backend cannot change after torch is loaded: not set by the runtime setter")
        else:
            kept[key] = str(valued.value)
    return kept, warnings, notes


def decide(
    policy: Policy,
    entry: EntryPoint,
    env: Mapping[str, str],
    torch: TorchInfo | None,
    imported: Container[str] = (),
    late: bool = False,
    platform: str = sys.platform,
) -> Decision:
    """The decision for this process. ``late``: torch is already loaded (a later import trigger)."""
    env_before = {name: env[name] for name in ALL_VARS if name in env}
    read_var = allocconf.effective_var(env, torch)
    current = env.get(read_var, "") if read_var else ""
    base = {"entry": entry, "torch": torch, "env_before": env_before, "read_var": read_var, "value": current}

    applied = env.get(APPLIED_VAR)
    if applied is not None:
        _, _, applied_value = applied.partition(";")
        if applied_value == current:
            return Decision("inherited", reason=f"a parent process applied {applied.partition(';')[0]}", **base)

    warnings = layer_warnings(policy)
    if not policy.enabled.value:
        where = policy.enabled.source.describe() if policy.enabled.source else "?"
        return Decision("disabled", reason=f"enabled = false in {where}", warnings=tuple(warnings), **base)

    match = first_match(policy.rules, entry, imported)
    rule = match.rule
    if rule is None:
        return Decision("none", reason="no rule matches", warnings=tuple(warnings), **base)
    described = {"rule": rule.name, "rule_source": rule.source.describe(), "reason": match.reason, "trigger": match.trigger}
    if rule.action == "skip":
        return Decision("skip", warnings=tuple(warnings), **described, **base)

    ours, gate_warnings, notes = _gate(policy.options_for(rule), torch, platform, late)
    warnings += gate_warnings
    override = policy.on_conflict.value == "override"

    # Several variables set: torch silently uses one of them.
    set_vars = [name for name in (CUDA_VAR, HIP_VAR, ALLOC_VAR) if name in env_before]
    source_var = read_var or (set_vars[0] if set_vars else None)
    if len({env_before[name] for name in set_vars}) > 1:
        shown = ", ".join(f"{name}={env_before[name]!r}" for name in set_vars)
        used = f"uses {read_var}" if read_var else "reads none of them"
        warnings.append(
            f"autoalloc: several allocator variables are set to different values ({shown}); "
            f"{torch.describe() if torch else 'torch'} {used} and ignores the others. autoalloc merges into {source_var}."
        )
    existing_text = env_before.get(source_var, "") if source_var else ""

    def finish(value: str, writes: dict[str, str]) -> Decision:
        writes[APPLIED_VAR] = f"{rule.name};{value}"
        after_var = allocconf.effective_var({**env, **writes}, torch)
        setter = value if late and value != current else None
        return Decision(
            "apply", requested=ours, read_var=after_var, value=value, writes=writes, setter_value=setter,
            warnings=tuple(warnings), notes=tuple(notes), **described,
            **{k: v for k, v in base.items() if k not in ("read_var", "value")},
        )

    try:
        pairs = allocconf.parse(existing_text)
    except allocconf.ConfError as exc:
        warnings.append(
            f"autoalloc: cannot parse {source_var}={existing_text!r} ({exc}); it is left exactly as it is and "
            f"rule {rule.name} is not applied"
        )
        return finish(existing_text, {})

    merged, conflicts = allocconf.merge(pairs, ours, override)
    if allocconf.last_value(merged, "backend") == "cudaMallocAsync" and "expandable_segments" in ours:
        ours = {k: v for k, v in ours.items() if k != "expandable_segments"}
        origin = source_var if allocconf.last_value(pairs, "backend") == "cudaMallocAsync" else "the policy"
        warnings.append(
            f"autoalloc: {origin} selects backend:cudaMallocAsync, where expandable_segments has no effect; "
            "autoalloc does not add it"
        )
        merged, conflicts = allocconf.merge(pairs, ours, override)
    for key in conflicts:
        env_value = allocconf.last_value(pairs, key)
        if override:
            notes.append(f"{source_var} had {key}:{env_value}; replaced by {key}:{ours[key]} (on_conflict = override)")
        else:
            warnings.append(
                f"autoalloc: {source_var} sets {key}:{env_value}, rule {rule.name} wants {key}:{ours[key]}; "
                f'keeping {key}:{env_value} (set on_conflict = "override" to replace it)'
            )
    if allocconf.last_value(merged, "expandable_segments") == "True" and allocconf.last_value(merged, "max_split_size_mb"):
        old = torch is not None and torch.release < (2, 3)
        effect = f"hits an internal assert near out-of-memory before torch 2.3 ({ISSUE_119452})" if old else (
            f"is ignored inside expandable segments and can grow reserved memory ({ISSUE_123548})"
        )
        warnings.append(
            f"autoalloc: max_split_size_mb together with expandable_segments:True {effect}; "
            "consider dropping max_split_size_mb"
        )
    value = allocconf.serialize(merged)
    if not ours or (value == existing_text and source_var == read_var):
        return finish(existing_text if source_var else current, {})
    writes = {}
    for name in (source_var, CUDA_VAR, ALLOC_VAR):
        if name and (name == source_var or name not in env_before or env_before[name] == existing_text):
            writes[name] = value
    return finish(value, writes)
