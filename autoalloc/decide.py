"""Decide what to do: policy + entry point + environment + installed torch in, a ``Decision`` out.

Pure: it computes the environment writes (or the runtime-setter string), the warnings
and the notes, but performs none of them; ``hook`` carries them out, ``explain`` and
``doctor`` only show them. Every allocator string it produces comes from
``allocconf.serialize`` of validated values merged into a string that ``allocconf.parse``
accepted, so it is never malformed.

Conflict cases (README "Conflicts"), each said in at most one warning per decision; a
child process that finds ``AUTOALLOC_APPLIED`` matching what torch reads is ``inherited``
and says nothing:

- several allocator variables set to different values: name the one the installed torch
  reads (a set-but-empty one included) and merge into that one;
- a key the environment already sets to another value: ``on_conflict = "keep"`` (the
  default) keeps the environment's and warns; ``"override"`` replaces it with a note
  (an explicit choice, shown by ``explain``, ``doctor`` and ``AUTOALLOC_DEBUG``);
- ``backend:cudaMallocAsync``: expandable segments have no effect, so they are not added;
- ``max_split_size_mb`` together with expandable segments: worded per torch version;
- a value that cannot be parsed: left exactly as it is;
- torch < 2.1, Windows, ROCm before 2.12 (or ROCm < 7.0): the key is never written;
  CPU-only builds: written, with a note that it has no effect.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Container, Mapping
from dataclasses import dataclass, field

from autoalloc import allocconf
from autoalloc.allocconf import ALL_VARS, ALLOC_VAR, CUDA_VAR, HIP_VAR
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import first_match
from autoalloc.policy import Policy, Rule, Valued
from autoalloc.torchinfo import TorchInfo

APPLIED_VAR = "AUTOALLOC_APPLIED"
# What the allocator variables held before autoalloc wrote them (JSON; null = unset), so a
# child that a skip rule denies (a vLLM server started by a training job) gets them back.
ORIGINAL_VAR = "AUTOALLOC_ORIGINAL"
ISSUE_119452 = "https://github.com/pytorch/pytorch/issues/119452"
ISSUE_123548 = "https://github.com/pytorch/pytorch/issues/123548"
SEGMENTS = "expandable_segments"


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
    unsets: tuple[str, ...] = ()  # environment variables to remove
    setter_value: str | None = None  # for a late trigger: the full string for the runtime setter
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def via(self) -> str:
        if self.setter_value is not None:
            return "setter"
        return "env" if self.writes.keys() - {APPLIED_VAR, ORIGINAL_VAR} or self.unsets else ""

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

    def applied(self) -> dict[str, str]:
        """The options autoalloc put in effect here: the keys it asked for, as merged, or a parent's string."""
        if self.action not in ("apply", "inherited") or not self.value:
            return {}
        try:
            pairs = allocconf.parse(self.value)
        except allocconf.ConfError:
            return {}
        if self.action == "inherited":
            return dict(pairs)
        return {k: v for k in self.requested if (v := allocconf.last_value(pairs, k)) is not None}


def parse_applied(text: str | None) -> tuple[str, str] | None:
    """``AUTOALLOC_APPLIED`` (``rule;value``) as ``(rule, value)``, or None."""
    if text is None:
        return None
    rule, _, value = text.partition(";")
    return rule, value


def disabled(entry: EntryPoint, env: Mapping[str, str], torch: TorchInfo | None, reason: str) -> Decision:
    """``AUTOALLOC_DISABLE`` in this process: nothing of autoalloc's, not even what a parent process wrote."""
    read_var = allocconf.effective_var(env, torch)
    current = env.get(read_var, "") if read_var else ""
    base = {"entry": entry, "torch": torch, "read_var": read_var, "value": current,
            "env_before": {name: env[name] for name in ALL_VARS if name in env}}
    applied = parse_applied(env.get(APPLIED_VAR))
    undone = _undo(env, torch, base) if applied is not None and applied[1] == current else None
    if undone is not None:
        reason += f"; restoring the allocator variables a parent process changed (rule {applied[0]})"
    return Decision("disabled", reason=reason, **(undone or base))


def _undo(env: Mapping[str, str], torch: TorchInfo | None, base: dict) -> dict | None:
    """Decision fields that put back what ``AUTOALLOC_ORIGINAL`` recorded, or None without a record."""
    try:
        original = json.loads(env.get(ORIGINAL_VAR) or "null")
    except ValueError:
        return None
    if not isinstance(original, dict) or not set(original) <= set(ALL_VARS):
        return None
    if not all(v is None or isinstance(v, str) for v in original.values()):
        return None
    writes = {k: v for k, v in original.items() if v is not None}
    unsets = (*(k for k, v in original.items() if v is None and k in env), APPLIED_VAR, ORIGINAL_VAR)
    after = {k: v for k, v in {**env, **writes}.items() if k not in unsets}
    read_var = allocconf.effective_var(after, torch)
    value = after.get(read_var, "") if read_var else ""
    return {**base, "writes": writes, "unsets": unsets, "read_var": read_var, "value": value}


def layer_warnings(policy: Policy) -> list[str]:
    """One warning per layer file that could not be used."""
    out = []
    for layer in policy.layers:
        if layer.status in ("error", "untrusted"):
            out.append(f"autoalloc: ignoring the {layer.layer} policy {layer.path}: {layer.message}")
    return out


def platform_notes(torch: TorchInfo | None, platform: str) -> tuple[list[str], bool]:
    """Notes on why the options may have no effect, and whether expandable segments must not be written."""
    if torch is None:
        return ["torch is not installed here: the decision assumes a recent CUDA build"], False
    if platform.startswith("win"):
        return ["expandable segments are not supported on Windows: not written"], True
    if torch.flavour == "rocm":
        head = (torch.hip or "").split(".")[0]
        major = int(head) if head.isdigit() else 0
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
    notes, no_segments = platform_notes(torch, platform)
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
        elif torch is not None and (why := allocconf.version_error(key, str(valued.value), torch.release)):
            warnings.append(f"autoalloc: {key}:{valued.value} {why} ({torch.describe()}): not set (asked for by {origin})")
        elif key == SEGMENTS and no_segments:
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

    applied = parse_applied(env.get(APPLIED_VAR))
    if applied is not None and applied[1] == current:
        denied = first_match(policy.rules, entry, imported) if policy.enabled.value else None
        if denied is not None and denied.rule is not None and denied.rule.action == "skip":
            undone = _undo(env, torch, base)
            if undone is not None:
                return Decision(
                    "skip", rule=denied.rule.name, rule_source=denied.rule.source.describe(),
                    reason=f"{denied.reason}; restoring the allocator variables a parent process changed "
                    f"(rule {applied[0]})", trigger=denied.trigger, **undone,
                )
        return Decision(
            "inherited", rule=applied[0] or None, rule_source=f"a parent process ({APPLIED_VAR})",
            reason=f"a parent process applied rule {applied[0]}", **base,
        )

    warnings = layer_warnings(policy)
    if not policy.enabled.value:
        where = policy.enabled.source.describe() if policy.enabled.source else "?"
        return Decision("disabled", reason=f"enabled = false in {where}", warnings=tuple(warnings), **base)

    match = first_match(policy.rules, entry, imported)
    rule = match.rule
    if rule is None:
        return Decision("none", reason="no rule matches", warnings=tuple(warnings), **base)
    if rule.action == "skip":
        return Decision(
            "skip", rule=rule.name, rule_source=rule.source.describe(), reason=match.reason, trigger=match.trigger,
            warnings=tuple(warnings), **base,
        )
    return resolve(policy, rule, entry, env, torch, late, platform, match.reason, match.trigger, warnings)


def _torch_name(torch: TorchInfo | None) -> str:
    return torch.describe() if torch else "torch"


def _several_vars(env_before: Mapping[str, str], read_var: str | None, torch: TorchInfo | None) -> str | None:
    """The warning for several allocator variables set to different values, or None."""
    set_vars = [name for name in (CUDA_VAR, HIP_VAR, ALLOC_VAR) if name in env_before]
    if len({env_before[name] for name in set_vars}) < 2:
        return None
    shown = ", ".join(f"{name}={env_before[name]!r}" for name in set_vars)
    if read_var is None:
        reads = " or ".join(allocconf.read_order(torch))
        used = f"reads none of them (it reads only {reads})"
    else:
        empty = " (set but empty, which still wins)" if env_before[read_var] == "" else ""
        others = ", ".join(name for name in set_vars if name != read_var)
        used = f"uses only {read_var}{empty} and ignores {others}"
        if torch is not None and torch.flavour == "cuda" and read_var == HIP_VAR and ALLOC_VAR in env_before:
            used += f" (CUDA-only options such as backend still come from {ALLOC_VAR})"
    return f"autoalloc: several allocator variables are set to different values ({shown}); {_torch_name(torch)} {used}"


def resolve(
    policy: Policy,
    rule: Rule,
    entry: EntryPoint,
    env: Mapping[str, str],
    torch: TorchInfo | None,
    late: bool = False,
    platform: str = sys.platform,
    reason: str = "",
    trigger: str | None = None,
    warnings: list[str] | tuple[str, ...] = (),
) -> Decision:
    """The ``apply`` decision for ``rule``: its options merged into the environment, every conflict said once."""
    warnings = list(warnings)
    first = len(warnings)  # where this decision's own warnings start
    env_before = {name: env[name] for name in ALL_VARS if name in env}
    read_var = allocconf.effective_var(env, torch)
    current = env.get(read_var, "") if read_var else ""
    ours, gate_warnings, notes = _gate(policy.options_for(rule), torch, platform, late)
    warnings += gate_warnings
    override = policy.on_conflict.value == "override"
    conflict_from = policy.on_conflict.source.describe() if policy.on_conflict.source else "autoalloc's default"

    # Merge into the variable torch reads. One it ignores (PYTORCH_ALLOC_CONF on a 2.9 CUDA
    # build) stays ignored: copying it over could wake up options this torch rejects.
    source_var = read_var
    several = _several_vars(env_before, read_var, torch)
    if several is None and read_var is None and env_before:
        shown = ", ".join(f"{name}={text!r}" for name, text in env_before.items())
        warnings.append(
            f"autoalloc: {_torch_name(torch)} ignores {shown} (it reads only "
            f"{' or '.join(allocconf.read_order(torch))}); left as it is, and autoalloc writes {CUDA_VAR}"
        )
    existing_text = env_before.get(source_var, "") if source_var else ""

    def finish(value: str, writes: dict[str, str], setter: str | None = None) -> Decision:
        if several is not None:
            written = [name for name in writes if name != source_var]
            if source_var is None:
                action = f"autoalloc writes {', '.join(written)}"
            else:
                also = f" and writes the result to {', '.join(written)} too" if written else ""
                action = f"autoalloc merges into {source_var}{also}"
            warnings.insert(first, f"{several}. {action}.")
        if writes and ORIGINAL_VAR not in env:
            writes[ORIGINAL_VAR] = json.dumps({name: env_before.get(name) for name in writes}, sort_keys=True)
        writes[APPLIED_VAR] = f"{rule.name};{value}"
        return Decision(
            "apply", entry, torch, rule.name, rule.source.describe(), reason, trigger,
            requested=ours, env_before=env_before, read_var=allocconf.effective_var({**env, **writes}, torch),
            value=value, writes=writes, setter_value=setter if late and value != current else None,
            warnings=tuple(warnings), notes=tuple(notes),
        )

    try:
        pairs = allocconf.parse(existing_text)
    except allocconf.ConfError as exc:
        fatal = ""
        if allocconf.aborts_import(existing_text):
            fatal = "; torch 2.10+ CUDA builds abort `import torch` (SIGABRT) on it"
        warnings.append(
            f"autoalloc: cannot parse {source_var}={existing_text!r} ({exc}); it is left exactly as it is and "
            f"rule {rule.name} is not applied{fatal}"
        )
        return finish(existing_text, {})

    merged, conflicts = allocconf.merge(pairs, ours, override)
    backend = allocconf.last_value(merged, "backend")
    if backend in allocconf.ASYNC_BACKENDS and SEGMENTS in ours:
        ours = {k: v for k, v in ours.items() if k != SEGMENTS}
        origin = source_var if allocconf.last_value(pairs, "backend") == backend else f"rule {rule.name}"
        warnings.append(
            f"autoalloc: {origin} selects backend:{backend}, where expandable_segments has no effect; "
            "autoalloc does not add it"
        )
        merged, conflicts = allocconf.merge(pairs, ours, override)
    try:
        allocconf.check_options(merged)
    except allocconf.ConfError as exc:
        sizes = ("large_segment_size_mb", "max_split_size_mb", "max_non_split_rounding_mb")
        dropped = [f"{k}:{ours[k]}" for k in sizes if k in ours]
        try:
            allocconf.check_options(pairs)
        except allocconf.ConfError:
            dropped = []  # the environment's own problem: left to torch
        if dropped:
            ours = {k: v for k, v in ours.items() if k not in sizes}
            warnings.append(
                f"autoalloc: rule {rule.name}'s {', '.join(dropped)} together with {source_var}={existing_text!r} "
                f"would be rejected by torch ({exc}); autoalloc does not add {'them' if len(dropped) > 1 else 'it'}"
            )
            merged, conflicts = allocconf.merge(pairs, ours, override)
    for key in conflicts:
        env_value = allocconf.last_value(pairs, key)
        if override:  # asked for explicitly: shown by explain, doctor and AUTOALLOC_DEBUG, not warned about
            notes.append(
                f"{source_var} sets {key}:{env_value}; replaced by {key}:{ours[key]} for rule {rule.name} "
                f'(on_conflict = "override" in {conflict_from})'
            )
        else:
            warnings.append(
                f"autoalloc: {source_var} sets {key}:{env_value}, rule {rule.name} wants {key}:{ours[key]}; "
                f'keeping {key}:{env_value} (set on_conflict = "override" to replace it)'
            )
    split = allocconf.last_value(merged, "max_split_size_mb")
    env_had_both = allocconf.last_value(pairs, SEGMENTS) == "True" and allocconf.last_value(pairs, "max_split_size_mb")
    if allocconf.last_value(merged, SEGMENTS) == "True" and split and not env_had_both:
        if torch is not None and torch.release < (2, 3):
            effect = (
                f"can fail with an INTERNAL ASSERT (!block->expandable_segment_) on {torch.describe()} "
                f"({ISSUE_119452}, fixed in torch 2.3)"
            )
        else:
            effect = f"can make reserved memory grow far beyond what is allocated ({ISSUE_123548})"
        warnings.append(
            f"autoalloc: max_split_size_mb:{split} together with expandable_segments:True {effect}; "
            "consider dropping max_split_size_mb"
        )
    value = allocconf.serialize(merged)
    setter = allocconf.serialize([(k, v) for k, v in merged if k != "backend"])  # fixed at load; never re-sent
    if not ours or (value == existing_text and source_var == read_var):
        return finish(existing_text if source_var else current, {}, setter)
    writes = {}
    for name in (source_var, CUDA_VAR, ALLOC_VAR):
        if name and (name == source_var or name not in env_before or env_before[name] == existing_text):
            writes[name] = value
    return finish(value, writes, setter)
