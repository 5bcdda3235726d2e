"""Decide what to do: policy + entry point + environment + installed torch in, a ``Decision`` out.

Pure: it computes the environment writes (or the runtime-setter string), the warnings
and the notes, but performs none of them; ``hook`` carries them out, ``explain`` and
``doctor`` only show them. Every allocator string it produces comes from
``allocconf.serialize`` of validated values merged into a string that ``allocconf.parse``
accepted, so it is never malformed.

The conflict cases of docs/conflicts.md are each said in at most one warning per decision,
by the steps of ``resolve`` (several allocator variables, a key the environment sets
otherwise, the backend, ``max_split_size_mb`` beside expandable segments, a value that
cannot be parsed) and by ``platform_notes``; a child process that finds
``AUTOALLOC_APPLIED`` matching what torch reads is ``inherited`` and says nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Container, Mapping
from dataclasses import field
from typing import Any, Literal

from autoalloc import allocconf
from autoalloc.allocconf import ALL_VARS, ALLOC_VAR, CUDA_VAR, HIP_VAR
from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import APPLIED_VAR, ORIGINAL_VAR
from autoalloc.match import first_match
from autoalloc.messages import shortened
from autoalloc.policy import Policy, Rule, Valued
from autoalloc.records import record, replace
from autoalloc.torchinfo import TorchInfo

# ORIGINAL_VAR holds what the allocator variables held before autoalloc wrote them (JSON;
# null = unset), so a child that a skip rule denies (a vLLM server started by a training
# job) gets them back.
__all__ = ["Action", "Decision", "decide", "disabled", "resolve"]
ISSUE_119452 = "https://github.com/pytorch/pytorch/issues/119452"
ISSUE_123548 = "https://github.com/pytorch/pytorch/issues/123548"
SEGMENTS = allocconf.SEGMENTS

Action = Literal["apply", "skip", "none", "disabled", "inherited"]


@record(frozen=True)
class Decision:
    """What autoalloc decided for this process, and everything needed to explain it.

    ``action``: ``apply`` (a rule asked for options), ``skip`` (a deny rule matched),
    ``none`` (no rule matched), ``disabled`` (``enabled = false`` or ``AUTOALLOC_DISABLE``),
    ``inherited`` (a parent process applied them already; nothing to do, nothing to say).
    """

    action: Action
    entry: EntryPoint
    torch: TorchInfo | None = None
    rule: str | None = None
    rule_source: str | None = None
    reason: str = ""
    trigger: str | None = None
    requested: Mapping[str, str] = field(default_factory=dict)  # the policy's options, gated
    env_before: Mapping[str, str] = field(default_factory=dict)  # allocator variables already set
    read_var: str | None = None  # the variable torch reads, after the writes
    value: str | None = None  # the allocator string torch will read
    writes: Mapping[str, str] = field(default_factory=dict)  # environment assignments to make
    unsets: tuple[str, ...] = ()  # environment variables to remove
    setter_value: str | None = None  # for a late trigger: the full string for the runtime setter
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # Of the warnings, those that come from what this process's node reads for itself (its
    # environment, its torch, a user, site or AUTOALLOC_CONFIG policy file) and say that it
    # does not get what its rule asks for, or that such a file was not used: on a job of
    # several nodes, global rank 0 cannot see them, so each node that has one says it.
    departures: tuple[str, ...] = ()

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
            parts.append(f"-> {self.read_var}={shortened(self.value)}{via}")
        return " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """The decision as plain data: the one form ``explain --json`` and ``doctor --json``
        show."""
        return {
            "entry_point": self.entry.describe(),
            "action": self.action,
            "rule": self.rule,
            "rule_source": self.rule_source,
            "reason": self.reason,
            "trigger": self.trigger,
            "requested": dict(self.requested),
            "env_before": dict(self.env_before),
            "writes": dict(self.writes),
            "unsets": list(self.unsets),
            "via": self.via or None,
            "setter_value": self.setter_value,
            "read_var": self.read_var,
            "value": self.value,
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }

    def applied(self) -> dict[str, str]:
        """The options autoalloc put in effect here: the keys it asked for, as merged, or a
        parent's string."""
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


def _as_found(entry: EntryPoint, env: Mapping[str, str], torch: TorchInfo | None) -> dict:
    """A decision's fields for the environment as it is: the variables set, what torch reads."""
    read_var = allocconf.effective_var(env, torch)
    return {
        "entry": entry,
        "torch": torch,
        "env_before": {name: env[name] for name in ALL_VARS if name in env},
        "read_var": read_var,
        "value": env.get(read_var, "") if read_var else "",
    }


def disabled(
    entry: EntryPoint, env: Mapping[str, str], torch: TorchInfo | None, reason: str
) -> Decision:
    """``AUTOALLOC_DISABLE`` in this process: nothing of autoalloc's, not even what a parent
    process wrote."""
    base = _as_found(entry, env, torch)
    applied = parse_applied(env.get(APPLIED_VAR))
    undone = _undo(env, base) if applied is not None and applied[1] == base["value"] else None
    if undone is not None:
        reason += f"; {_RESTORING} (rule {applied[0]})"
    return Decision(action="disabled", reason=reason, **(undone or base))


_RESTORING = "restoring the allocator variables a parent process changed"


def _undo(env: Mapping[str, str], base: dict) -> dict | None:
    """Decision fields that put back what ``AUTOALLOC_ORIGINAL`` recorded (None: no record);
    ``base``: those of the environment as it is (``_as_found``)."""
    try:
        original = json.loads(env.get(ORIGINAL_VAR) or "null")
    except ValueError:
        return None
    if not isinstance(original, dict) or not set(original) <= set(ALL_VARS):
        return None
    if not all(v is None or isinstance(v, str) for v in original.values()):
        return None
    writes = {k: v for k, v in original.items() if v is not None}
    unsets = (
        *(k for k, v in original.items() if v is None and k in env),
        APPLIED_VAR,
        ORIGINAL_VAR,
    )
    after = {k: v for k, v in {**env, **writes}.items() if k not in unsets}
    read_var = allocconf.effective_var(after, base["torch"])
    value = after.get(read_var, "") if read_var else ""
    return {**base, "writes": writes, "unsets": unsets, "read_var": read_var, "value": value}


NODE_LAYERS = ("site", "user", "env")  # files a node reads for itself (not the project's)


def layer_warnings(policy: Policy, layers: Container[str] | None = None) -> list[str]:
    """One warning per layer file that could not be used (of ``layers`` only, when given)."""
    out = []
    for layer in policy.layers:
        if layers is not None and layer.layer not in layers:
            continue
        if layer.status in ("error", "untrusted"):
            out.append(
                f"autoalloc: ignoring the {layer.layer} policy {layer.path}: {layer.message}"
            )
        elif layer.status == "found" and layer.message:  # used, all but the parts named
            out.append(f"autoalloc: in the {layer.layer} policy {layer.path}: {layer.message}")
    return out


def platform_notes(torch: TorchInfo | None, platform: str) -> tuple[list[str], bool]:
    """Notes on why the options may have no effect, and whether expandable segments must not
    be written."""
    if torch is None:
        return ["torch is not installed here: the decision assumes a recent CUDA build"], False
    if platform.startswith("win"):
        return ["expandable segments are not supported on Windows: not written"], True
    if torch.flavour == "rocm":
        head = (torch.hip or "").split(".")[0]
        major = int(head) if head.isdigit() else 0
        if torch.release < (2, 12) or major < 7:
            note = (
                "expandable segments need torch >= 2.12 with ROCm >= 7.0 "
                f"({torch.describe()}): not written"
            )
            return [note], True
    if torch.flavour == "cpu":
        return [
            f"{torch.describe()}: allocator options have no effect without a GPU build "
            "(written anyway)"
        ], False
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
                f"autoalloc: {key} needs torch >= {spec.since[0]}.{spec.since[1]}, "
                f"but {torch.describe()} is installed: "
                f"not set (asked for by {origin})"
            )
        elif torch is not None and (
            why := allocconf.version_error(key, str(valued.value), torch.release)
        ):
            warnings.append(
                f"autoalloc: {key}:{valued.value} {why} ({torch.describe()}): "
                f"not set (asked for by {origin})"
            )
        elif key == SEGMENTS and no_segments:
            continue
        elif key == "backend" and late:
            notes.append(
                "backend cannot change after torch is loaded: not set by the runtime setter"
            )
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
    trains: bool = False,
    now: allocconf.InEffect | None = None,
) -> Decision:
    """The decision for this process. ``late``: torch is already loaded (a later import trigger);
    ``trains``: the process has built an optimizer (``training = true`` rules may hold);
    ``now``: what torch uses at a late decision (the rule's options go under it).

    1. a parent process of this job applied options: inherited (or undone for a skip rule);
    2. ``enabled = false``; 3. the first matching rule: none, skip or apply.
    """
    base = _as_found(entry, env, torch)
    applied = parse_applied(env.get(APPLIED_VAR))
    if applied is not None and applied[1] == base["value"]:  # 1
        return _from_parent(policy, env, imported, base, applied[0], trains)
    warnings = tuple(layer_warnings(policy))
    said = {"warnings": warnings, "departures": tuple(layer_warnings(policy, NODE_LAYERS))}
    if not policy.enabled.value:  # 2
        where = policy.enabled.source.describe() if policy.enabled.source else "?"
        why = f"enabled = false in {where}"
        return Decision(action="disabled", reason=why, **said, **base)
    match = first_match(policy.rules, entry, imported, trains)  # 3
    rule = match.rule
    if rule is None:
        return Decision(action="none", reason="no rule matches", **said, **base)
    if rule.action == "skip":
        return Decision(
            action="skip", rule=rule.name, rule_source=rule.source.describe(), reason=match.reason,
            trigger=match.trigger, **said, **base,
        )  # fmt: skip
    resolved = resolve(policy, rule, entry, env, torch, late, platform, now)
    return replace(
        resolved, reason=match.reason, trigger=match.trigger,
        warnings=(*warnings, *resolved.warnings),
        departures=(*said["departures"], *resolved.departures),
    )  # fmt: skip


def _from_parent(
    policy: Policy,
    env: Mapping[str, str],
    imported: Container[str],
    base: dict,
    parent_rule: str,
    trains: bool,
) -> Decision:
    """A child of a job autoalloc applied options for: silent, unless a skip rule denies it
    (a vLLM server started by a training job), which gets the user's variables back."""
    entry = base["entry"]
    denied = first_match(policy.rules, entry, imported, trains) if policy.enabled.value else None
    if denied is not None and denied.rule is not None and denied.rule.action == "skip":
        undone = _undo(env, base)
        if undone is not None:
            return Decision(
                action="skip", rule=denied.rule.name, rule_source=denied.rule.source.describe(),
                reason=f"{denied.reason}; {_RESTORING} (rule {parent_rule})",
                trigger=denied.trigger, **undone,
            )  # fmt: skip
    return Decision(
        action="inherited", rule=parent_rule or None,
        rule_source=f"a parent process ({APPLIED_VAR})",
        reason=f"a parent process applied rule {parent_rule}", **base,
    )  # fmt: skip


def _torch_name(torch: TorchInfo | None) -> str:
    return torch.describe() if torch else "torch"


def _several_vars(
    env_before: Mapping[str, str], read_var: str | None, torch: TorchInfo | None
) -> str | None:
    """The warning for several allocator variables set to different values, or None."""
    set_vars = [name for name in (CUDA_VAR, HIP_VAR, ALLOC_VAR) if name in env_before]
    if len({env_before[name] for name in set_vars}) < 2:
        return None
    shown = ", ".join(f"{name}={shortened(env_before[name])}" for name in set_vars)
    if read_var is None:
        reads = " or ".join(allocconf.read_order(torch))
        used = f"reads none of them (it reads only {reads})"
    else:
        empty = " (set but empty, which still wins)" if env_before[read_var] == "" else ""
        others = ", ".join(name for name in set_vars if name != read_var)
        used = f"uses only {read_var}{empty} and ignores {others}"
        if (
            torch is not None
            and torch.flavour == "cuda"
            and read_var == HIP_VAR
            and ALLOC_VAR in env_before
        ):
            used += f" (CUDA-only options such as backend still come from {ALLOC_VAR})"
    return (
        f"autoalloc: several allocator variables are set to different values ({shown}); "
        f"{_torch_name(torch)} {used}"
    )


@record
class _Resolving:
    """The working state of ``resolve``'s steps: what the environment holds and what is added."""

    rule: Rule
    env: Mapping[str, str]
    torch: TorchInfo | None
    read_var: str | None  # the variable torch reads (and autoalloc merges into)
    existing: str  # its text
    pairs: list[tuple[str, str]]  # the options merged into, parsed: its own, or torch's now
    ours: dict[str, str]  # the rule's options that are still to be added
    override: bool
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    origin: Mapping[str, str] = field(default_factory=dict)  # who set a key of ``pairs``
    base: str | None = None  # the text of ``pairs`` where it is not ``existing`` (late)
    departures: list[str] = field(default_factory=list)  # of ``warnings`` (``Decision``)

    def set_by(self, key: str) -> str | None:
        return self.origin.get(key, self.read_var)

    def depart(self, message: str) -> None:
        """Warn that the process does not get what the rule asks for, because of what its node
        reads for itself (the environment, the installed torch)."""
        self.warnings.append(message)
        self.departures.append(message)

    def merged(self) -> tuple[list[tuple[str, str]], list[str]]:
        return allocconf.merge(self.pairs, self.ours, self.override)


def resolve(
    policy: Policy,
    rule: Rule,
    entry: EntryPoint,
    env: Mapping[str, str],
    torch: TorchInfo | None,
    late: bool = False,
    platform: str = sys.platform,
    now: allocconf.InEffect | None = None,
) -> Decision:
    """The ``apply`` decision for ``rule``: its options merged into the environment, in the
    steps numbered below (each function's docstring says its step), each saying its
    conflicts once.

    ``now`` (a late apply, torch loaded): what torch uses at this moment, the environment's
    string and the program's runtime setter calls, is what the options are merged into, with
    the same precedence; a runtime ``expandable_segments:False`` is the program's refusal.
    The setter gets that full string; the environment, which only children read, gets the
    rule's options merged into its own string (``_for_children``).
    """
    ours, warnings, notes = _gate(policy.options_for(rule), torch, platform, late)  # 1
    env_before = {name: env[name] for name in ALL_VARS if name in env}
    read_var = allocconf.effective_var(env, torch)
    existing = env_before.get(read_var, "") if read_var else ""
    override = policy.on_conflict.value == "override"
    state = _Resolving(rule, env, torch, read_var, existing, [], ours, override, warnings, notes)
    state.departures.extend(warnings)  # 1's: options this torch cannot take
    several = _several_vars(env_before, read_var, torch)
    if several is None and read_var is None and env_before:
        warnings.append(_ignored_vars(env_before, torch))
    if now is not None:  # 2, late: what torch uses now
        _merge_under(state, now)
    else:  # 2
        try:
            state.pairs = allocconf.parse(existing)
        except allocconf.ConfError as exc:
            state.depart(_unparseable(read_var, existing, rule.name, exc))
            return _finish(state, entry, several, existing, {}, None)
    _drop_ignored_by_backend(state)  # 3
    _drop_size_clashes(state)  # 4
    merged = _say_conflicts(state, policy)  # 5
    _warn_split_with_segments(state, merged)  # 6
    value = allocconf.serialize(merged)  # 7
    setter = allocconf.serialize([(k, v) for k, v in merged if k != "backend"])  # fixed at load
    base = existing if state.base is None else state.base
    if not state.ours or value == base:
        return _finish(state, entry, several, base, {}, setter if late else None)
    if state.base is not None:  # late: torch gets ``value``, the children their own string
        children = _for_children(state)
        writes = {}
        if children is not None and children != existing:
            writes = _writes(read_var, env_before, existing, children)
        return _finish(state, entry, several, value, writes, setter, children)
    writes = _writes(read_var, env_before, existing, value)
    return _finish(state, entry, several, value, writes, setter if late else None)


def _for_children(state: _Resolving) -> str | None:
    """Step 7 of a late apply: what the program's children get, the environment's string
    (what the program put there, even after ``import torch``) with the rule's options merged
    in as at start-up; never what the program set for itself through the setter. None where
    the environment's string cannot take them (left as it is: a child decides for itself)."""
    try:
        merged, _ = allocconf.merge(allocconf.parse(state.existing), state.ours, state.override)
        allocconf.check_options(merged)
    except allocconf.ConfError:
        return None
    return allocconf.serialize(merged)


def _merge_under(state: _Resolving, now: allocconf.InEffect) -> None:
    """Step 2 of a late apply: merge into what torch uses now; respect a runtime refusal."""
    state.pairs, state.origin = list(now.pairs), dict(now.origin)
    state.base = allocconf.serialize(now.pairs)
    if now.refused() and state.ours.pop(SEGMENTS, None) is not None:
        state.notes.append(
            f"{now.origin.get(SEGMENTS, 'the program')} set expandable_segments:False at run "
            "time: the program's choice, respected"
        )
    # A key the program set at run time is its choice whatever on_conflict says (that is
    # about the environment's values): the rule's value for it is not merged at all.
    for key in sorted(now.runtime & state.ours.keys()):
        ours, value = state.ours.pop(key), allocconf.last_value(now.pairs, key)
        if value != ours:
            state.warnings.append(
                f"autoalloc: {state.set_by(key)} sets {key}:{value}, rule {state.rule.name} "
                f"wants {key}:{ours}; keeping {key}:{value} (the program's own setting at "
                "run time, which on_conflict does not replace)"
            )


def _ignored_vars(env_before: Mapping[str, str], torch: TorchInfo | None) -> str:
    """The warning for allocator variables this torch does not read at all.

    One it ignores (PYTORCH_ALLOC_CONF on a 2.9 CUDA build) stays ignored: copying it over
    could wake up options this torch rejects.
    """
    shown = ", ".join(f"{name}={shortened(text)}" for name, text in env_before.items())
    reads = " or ".join(allocconf.read_order(torch))
    return (
        f"autoalloc: {_torch_name(torch)} ignores {shown} (it reads only {reads}); "
        f"left as it is, and autoalloc writes {CUDA_VAR}"
    )


def _unparseable(var: str | None, text: str, rule: str, exc: Exception) -> str:
    fatal = ""
    if allocconf.aborts_import(text):
        fatal = "; torch 2.10+ CUDA builds abort `import torch` (SIGABRT) on it"
    return (
        f"autoalloc: cannot parse {var}={shortened(text)} ({exc}); it is left exactly as it is and "
        f"rule {rule} is not applied{fatal}"
    )


def _drop_ignored_by_backend(state: _Resolving) -> None:
    """Step 3: no expandable segments where the backend (cudaMallocAsync) ignores them."""
    backend = allocconf.last_value(state.merged()[0], "backend")
    if backend not in allocconf.ASYNC_BACKENDS or SEGMENTS not in state.ours:
        return
    del state.ours[SEGMENTS]
    from_env = allocconf.last_value(state.pairs, "backend") == backend
    origin = state.set_by("backend") if from_env else f"rule {state.rule.name}"
    say = state.depart if from_env else state.warnings.append
    say(
        f"autoalloc: {origin} selects backend:{backend}, where expandable_segments has no effect; "
        "autoalloc does not add it"
    )


_SIZES = ("large_segment_size_mb", "max_split_size_mb", "max_non_split_rounding_mb")


def _drop_size_clashes(state: _Resolving) -> None:
    """Step 4: the rule's size options that torch would reject next to the environment's."""
    try:
        allocconf.check_options(state.merged()[0])
        return
    except allocconf.ConfError as exc:
        problem = exc
    try:
        allocconf.check_options(state.pairs)
    except allocconf.ConfError:
        return  # the environment's own problem: left to torch
    dropped = [f"{k}:{state.ours.pop(k)}" for k in _SIZES if k in state.ours]
    if dropped:
        them = "them" if len(dropped) > 1 else "it"
        now = f"{state.read_var}={shortened(state.existing)}"
        if state.base is not None:
            now = f"the allocator settings in effect ({shortened(state.base)})"
        state.depart(
            f"autoalloc: rule {state.rule.name}'s {', '.join(dropped)} together with "
            f"{now} would be rejected by torch ({problem}); "
            f"autoalloc does not add {them}"
        )


def _say_conflicts(state: _Resolving, policy: Policy) -> list[tuple[str, str]]:
    """Step 5: the merged options; a key the environment sets otherwise is said once."""
    merged, conflicts = state.merged()
    source = policy.on_conflict.source
    conflict_from = source.describe() if source else "autoalloc's default"
    name = state.rule.name
    for key in conflicts:
        var = state.set_by(key)
        env_value = allocconf.last_value(state.pairs, key)
        ours = state.ours[key]
        if state.override:  # asked for explicitly: shown by explain, doctor and AUTOALLOC_DEBUG
            state.notes.append(
                f"{var} sets {key}:{env_value}; replaced by {key}:{ours} for rule {name} "
                f'(on_conflict = "override" in {conflict_from})'
            )
        else:
            state.depart(
                f"autoalloc: {var} sets {key}:{env_value}, rule {name} wants {key}:{ours}; "
                f'keeping {key}:{env_value} (set on_conflict = "override" to replace it)'
            )
    return merged


def _warn_split_with_segments(state: _Resolving, merged: list[tuple[str, str]]) -> None:
    """Step 6: max_split_size_mb next to expandable segments, unless the environment had both."""
    split = allocconf.last_value(merged, "max_split_size_mb")
    pairs = state.pairs
    env_had_both = allocconf.last_value(pairs, SEGMENTS) == "True" and allocconf.last_value(
        pairs, "max_split_size_mb"
    )
    if allocconf.last_value(merged, SEGMENTS) != "True" or not split or env_had_both:
        return
    torch = state.torch
    if torch is not None and torch.release < (2, 3):
        effect = (
            f"can fail with an INTERNAL ASSERT (!block->expandable_segment_) on "
            f"{torch.describe()} ({ISSUE_119452}, fixed in torch 2.3)"
        )
    else:
        effect = f"can make reserved memory grow far beyond what is allocated ({ISSUE_123548})"
    state.warnings.append(
        f"autoalloc: max_split_size_mb:{split} together with expandable_segments:True {effect}; "
        "consider dropping max_split_size_mb"
    )


def _writes(
    read_var: str | None, env_before: Mapping[str, str], existing: str, value: str
) -> dict[str, str]:
    """Step 7: the variable torch reads, and the others that held the same text (or nothing)."""
    writes = {}
    for name in (read_var, CUDA_VAR, ALLOC_VAR):
        if name and (name == read_var or env_before.get(name, existing) == existing):
            writes[name] = value
    return writes


def _finish(
    state: _Resolving,
    entry: EntryPoint,
    several: str | None,
    value: str,
    writes: dict[str, str],
    setter: str | None,
    marked: str | None = None,
) -> Decision:
    """The ``apply`` Decision: the several-variables warning first, the marks written last.

    ``marked``: the string the children find in the environment, where it is not ``value``
    (a late apply), for ``AUTOALLOC_APPLIED``: a child that finds it knows it as the job's.
    """
    env, read_var = state.env, state.read_var
    env_before = {name: env[name] for name in ALL_VARS if name in env}
    warnings = state.warnings
    if several is not None:
        written = [name for name in writes if name != read_var]
        if read_var is None:
            action = f"autoalloc writes {', '.join(written)}"
        else:
            also = f" and writes the result to {', '.join(written)} too" if written else ""
            action = f"autoalloc merges into {read_var}{also}"
        warnings = [f"{several}. {action}.", *warnings]
    if writes and ORIGINAL_VAR not in env:
        writes[ORIGINAL_VAR] = json.dumps(
            {name: env_before.get(name) for name in writes}, sort_keys=True
        )
    writes[APPLIED_VAR] = f"{state.rule.name};{value if marked is None else marked}"
    current = env.get(read_var, "") if read_var else ""
    if state.base is not None:  # late: torch's string now, not the environment's
        current = state.base
    rule, torch = state.rule, state.torch
    return Decision(
        action="apply",
        entry=entry,
        torch=torch,
        rule=rule.name,
        rule_source=rule.source.describe(),
        requested=dict(state.ours),
        env_before=env_before,
        read_var=allocconf.effective_var({**env, **writes}, torch),
        value=value,
        writes=writes,
        setter_value=setter if value != current else None,
        warnings=tuple(warnings),
        notes=tuple(state.notes),
        departures=tuple(state.departures),
    )
