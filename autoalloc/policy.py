"""Policy: validate one TOML layer, and compose layers into one Policy with provenance.

Pure functions: a TOML dict in, a ``LayerConfig`` (or a ``PolicyError`` naming the key)
out; a list of layers in, a ``Policy`` out. Reading files is ``sources``' job.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from autoalloc import allocconf, globs, wrappers
from autoalloc.messages import closest, did_you_mean
from autoalloc.wrappers import Wrapper

LayerName = Literal["builtin", "site", "user", "project", "env"]
LayerState = Literal["found", "missing", "error", "untrusted", "unset"]
LAYERS: tuple[LayerName, ...] = get_args(LayerName)
ACTIONS = ("apply", "skip")
CONFLICT_MODES = ("keep", "override")
SETTER_MODES = ("warn", "merge")  # on_setter: for a later setter call that drops options

ADAPTIVE_MODES = ("off", "advise", "apply")

_TOP_KEYS = {
    "enabled", "on_conflict", "on_setter", "allocator", "rules", "disable", "enable",
    "trusted_dirs", "wrappers", "adaptive",
}
_RULE_KEYS = {"name", "description", "scripts", "modules", "commands", "imports", "argv", "action",
              "allocator", "enabled", "outside", "training"}
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}\Z")
_MAX_LIST = 10_000
_MAX_STR = 4096


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the key."""


@dataclass(frozen=True)
class Source:
    """Where a value came from: the layer and its file."""

    layer: str
    path: str

    def describe(self) -> str:
        return f"{self.layer} ({self.path})"


@dataclass(frozen=True)
class Rule:
    """One ``[[rules]]`` entry, validated, with its patterns compiled."""

    name: str
    source: Source
    action: str = "apply"
    description: str = ""
    scripts: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    allocator: Mapping[str, str] = field(default_factory=dict)  # serialized values
    compiled: globs.RulePatterns = field(default=globs.RulePatterns(), compare=False, repr=False)
    enabled: bool = True  # false: off until a higher layer lists the name in `enable`
    outside: tuple[str, ...] = ()  # files marking toolkit checkouts where `imports` do not fire
    training: bool = False  # holds only once the process has built a torch optimizer


@dataclass(frozen=True)
class LayerConfig:
    """The validated content of one policy file."""

    source: Source
    enabled: bool | None = None
    on_conflict: str | None = None
    allocator: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    disable: tuple[str, ...] = ()
    trusted_dirs: tuple[str, ...] = ()
    on_setter: str | None = None
    enable: tuple[str, ...] = ()
    wrappers: tuple[Wrapper, ...] = ()  # programs that run another program (wrappers.toml)
    adaptive: str | None = None


@dataclass(frozen=True)
class Valued:
    """A setting with its provenance (``None`` source: autoalloc's own default)."""

    value: object
    source: Source | None = None
    rule: str | None = None


def _shown(value: object) -> str:
    """A wrong value as a message quotes it: short, whatever its size."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _str_list(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"{where} must be a list of strings")
    if len(value) > _MAX_LIST:
        raise PolicyError(f"{where} has more than {_MAX_LIST} entries")
    for item in value:
        if not isinstance(item, str) or not item or len(item) > _MAX_STR:
            raise PolicyError(f"{where} must be a list of non-empty strings")
    return tuple(value)


def _allocator(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PolicyError(f"{where} must be a table")
    out: dict[str, str] = {}
    for key, item in value.items():
        if key not in allocconf.KEYS:
            hint = did_you_mean(key, allocconf.KEYS)
            rule = where.rpartition(": ")[0]  # "rule 2 (...)" from "rule 2 (...): allocator"
            raise PolicyError(f"{rule}{': ' if rule else ''}unknown allocator option {key!r}{hint}")
        try:
            out[key] = allocconf.serialize_value(key, item)
        except allocconf.ConfError as exc:
            raise PolicyError(f"{where}.{key}: {exc}") from None
    try:
        allocconf.check_options(out)
    except allocconf.ConfError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    return out


def _rule(data: object, index: int, source: Source) -> Rule:
    where = f"rule {index + 1}"  # counted from 1, as a person counts the [[rules]] of a file
    if not isinstance(data, dict):
        raise PolicyError(f"{where} must be a table")
    name = data.get("name", f"{source.layer}-{index}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise PolicyError(f"{where}: name must be letters, digits, '-', '_' or '.' (at most 100)")
    where = f'rule {index + 1} ("{name}")'
    unknown = sorted(set(data) - _RULE_KEYS)
    if unknown:
        hint = did_you_mean(unknown[0], _RULE_KEYS)
        raise PolicyError(f"{where}: unknown key {unknown[0]!r}{hint}")
    action = data.get("action", "apply")
    if action not in ACTIONS:
        hint = did_you_mean(action, ACTIONS)
        raise PolicyError(f"{where}: action must be 'apply' or 'skip', not {_shown(action)}{hint}")
    description = data.get("description", "")
    if not isinstance(description, str) or len(description) > _MAX_STR:
        raise PolicyError(f"{where}: description must be a string")
    kinds = ("scripts", "modules", "commands", "imports", "argv")
    lists = {k: _str_list(data[k], f"{where}: {k}") if k in data else () for k in kinds}
    training = data.get("training", False)
    if not isinstance(training, bool):
        raise PolicyError(f"{where}: training must be true or false")
    if not training and not any(lists[k] for k in ("scripts", "modules", "commands", "imports")):
        raise PolicyError(
            f"{where} needs at least one of scripts, modules, commands, imports, training"
        )
    allocator = _allocator(data["allocator"], f"{where}: allocator") if "allocator" in data else {}
    kinds_used = (lists["scripts"], lists["modules"], lists["commands"], lists["argv"])
    compiled = globs.compile_rule(*kinds_used)
    switches = _rule_switches(data, where)
    return Rule(name, source, action, description, allocator=allocator, compiled=compiled, **lists,
                **switches, training=training)


def _rule_switches(data: dict, where: str) -> dict:
    """A rule's ``enabled`` flag and ``outside`` markers (checkout-relative file paths)."""
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise PolicyError(f"{where}: enabled must be true or false")
    outside = _str_list(data["outside"], f"{where}: outside") if "outside" in data else ()
    for marker in outside:
        parts = marker.split("/")
        if marker.startswith("/") or "\\" in marker or any(p in ("", ".", "..") for p in parts):
            raise PolicyError(f"{where}: outside: {marker!r} must be a relative path like "
                              "'pkg/__init__.py'")
    return {"enabled": enabled, "outside": outside}


# Validated layers by table object, for callers that pass ``cache=True``: ``sources`` hands out
# one read-only table per file content, so a later decision in the same process (an import
# trigger, ``explain``) does not validate a 10,000-rule file again. An entry keeps its table
# alive, so that table's id cannot be reused by another object while the entry exists.
_VALIDATED: dict[tuple, tuple[object, LayerConfig]] = {}
_VALIDATED_MAX = 16


def validate(
    data: object, source: Source, allow_trust: bool = False, cache: bool = False
) -> LayerConfig:
    """Check a parsed TOML document (the ``[tool.autoalloc]`` table for pyproject.toml).

    ``cache``: remember the result for this very table object, which the caller promises
    never to change.
    """
    if not cache:
        return _validate(data, source, allow_trust)
    key = (id(data), source, allow_trust, os.environ.get("HOME"))  # HOME: '~' in patterns
    hit = _VALIDATED.get(key)
    if hit is not None and hit[0] is data:
        return hit[1]
    config = _validate(data, source, allow_trust)
    if len(_VALIDATED) >= _VALIDATED_MAX:
        del _VALIDATED[next(iter(_VALIDATED))]
    _VALIDATED[key] = (data, config)
    return config


def _validate(data: object, source: Source, allow_trust: bool) -> LayerConfig:
    if not isinstance(data, dict):
        raise PolicyError("the policy must be a table")
    keys = _TOP_KEYS if allow_trust else _TOP_KEYS - {"trusted_dirs"}
    unknown = sorted(set(data) - keys)
    if unknown:
        hint = did_you_mean(unknown[0], keys)
        if unknown[0] == "trusted_dirs":
            hint = " (only user, site and AUTOALLOC_CONFIG files may trust directories)"
        raise PolicyError(f"unknown key {unknown[0]!r}{hint}")
    enabled = data.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise PolicyError("enabled must be true or false")
    on_conflict = data.get("on_conflict")
    if on_conflict is not None and on_conflict not in CONFLICT_MODES:
        hint = did_you_mean(on_conflict, CONFLICT_MODES)
        shown = _shown(on_conflict)
        raise PolicyError(f"on_conflict must be 'keep' or 'override', not {shown}{hint}")
    on_setter = data.get("on_setter")
    if on_setter is not None and on_setter not in SETTER_MODES:
        hint = did_you_mean(on_setter, SETTER_MODES)
        raise PolicyError(f"on_setter must be 'warn' or 'merge', not {_shown(on_setter)}{hint}")
    allocator = _allocator(data["allocator"], "allocator") if "allocator" in data else {}
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list) or len(raw_rules) > _MAX_LIST:
        raise PolicyError("rules must be an array of tables ([[rules]])")
    rules = tuple(_rule(r, i, source) for i, r in enumerate(raw_rules))
    seen: set[str] = set()
    for rule in rules:  # a set, not list.count: linear in the number of rules
        if rule.name in seen:
            raise PolicyError(f"two rules are named {rule.name!r}")
        seen.add(rule.name)
    disable = _str_list(data["disable"], "disable") if "disable" in data else ()
    trusted = _str_list(data["trusted_dirs"], "trusted_dirs") if "trusted_dirs" in data else ()
    enable = _str_list(data["enable"], "enable") if "enable" in data else ()
    try:
        table = wrappers.validate_all(data["wrappers"], source.layer) if "wrappers" in data else ()
    except wrappers.WrapperError as exc:
        raise PolicyError(str(exc)) from None
    adaptive = data.get("adaptive")
    if adaptive is not None and adaptive not in ADAPTIVE_MODES:
        raise PolicyError("adaptive must be 'off', 'advise' or 'apply'")
    return LayerConfig(
        source, enabled, on_conflict, allocator, rules, disable, trusted, on_setter, enable, table,
        adaptive,
    )


@dataclass(frozen=True)
class LayerStatus:
    """What happened to one layer: ``found``, ``missing``, ``error``, ``untrusted`` or ``unset``."""

    layer: LayerName
    path: str | None
    status: LayerState
    message: str = ""


DEFAULT_ALLOCATOR = {"expandable_segments": "True"}


@dataclass(frozen=True)
class Policy:
    """All layers composed: effective settings with provenance, and rules in match order."""

    layers: tuple[LayerStatus, ...]
    configs: tuple[LayerConfig, ...]
    enabled: Valued
    on_conflict: Valued
    allocator: Mapping[str, Valued]
    rules: tuple[Rule, ...]  # highest layer first, file order within a layer
    dropped: Mapping[str, str]  # rule name -> why it is not active
    on_setter: Valued = Valued("warn")
    # off-by-default rule -> what enabled it
    switched_on: Mapping[str, str] = field(default_factory=dict)
    wrappers: tuple[Wrapper, ...] = ()  # highest layer first; a name replaces lower ones
    adaptive: Valued = Valued("off")

    def options_for(self, rule: Rule) -> dict[str, Valued]:
        """The allocator options an ``apply`` rule asks for: ``[allocator]`` overlaid by its own."""
        options = dict(self.allocator)
        for key, value in rule.allocator.items():
            options[key] = Valued(value, rule.source, rule.name)
        return options


def compose(configs: Sequence[LayerConfig], layers: Sequence[LayerStatus] = ()) -> Policy:
    """Compose validated layers, given lowest first."""
    enabled = Valued(True)
    on_conflict = Valued("keep")
    on_setter = Valued("warn")
    adaptive = Valued("off")
    allocator: dict[str, Valued] = {k: Valued(v) for k, v in DEFAULT_ALLOCATOR.items()}
    for config in configs:
        if config.enabled is not None:
            enabled = Valued(config.enabled, config.source)
        if config.on_conflict is not None:
            on_conflict = Valued(config.on_conflict, config.source)
        if config.on_setter is not None:
            on_setter = Valued(config.on_setter, config.source)
        if config.adaptive is not None:
            adaptive = Valued(config.adaptive, config.source)
        for key, value in config.allocator.items():
            allocator[key] = Valued(value, config.source)
    rules: list[Rule] = []
    dropped: dict[str, str] = {}
    switched_on: dict[str, str] = {}
    # per layer, as sets: each rule is looked up in the layers above it (linear, not quadratic)
    named = [frozenset(r.name for r in c.rules) for c in configs]
    for level, config in enumerate(configs):
        higher = configs[level + 1 :]
        above = range(level + 1, len(configs))
        for rule in config.rules:
            switch = switched(rule.name, higher)
            disabler = switch[1] if switch and switch[0] == "disable" else None
            replacer = next((configs[i] for i in above if rule.name in named[i]), None)
            if disabler is not None:
                where = disabler.source.describe()
                dropped[f"{rule.name}@{config.source.layer}"] = f"disabled by {where}"
            elif replacer is None and not rule.enabled and switch is None:
                why = f'off until enabled (enable = ["{rule.name}"])'
                dropped[f"{rule.name}@{config.source.layer}"] = why
            elif replacer is None and not rule.enabled and switch is not None:
                rules.append(rule)
                switched_on[rule.name] = f"enabled by {switch[1].source.describe()}"
            elif replacer is not None:
                why = f"replaced by the rule of the same name in {replacer.source.describe()}"
                dropped[f"{rule.name}@{config.source.layer}"] = why
            else:
                rules.append(rule)
    order = {layer: i for i, layer in enumerate(LAYERS)}
    rules.sort(key=lambda r: -order.get(r.source.layer, 0))  # stable: file order kept
    return Policy(
        tuple(layers), tuple(configs), enabled, on_conflict, allocator, tuple(rules), dropped,
        on_setter, switched_on, _wrappers(configs), adaptive,
    )


def _wrappers(configs: Sequence[LayerConfig]) -> tuple[Wrapper, ...]:
    """Wrappers of every layer, highest first; one of the same name in a higher layer, or
    a higher layer's ``disable``, removes a lower one."""
    table: list[Wrapper] = []
    for level in range(len(configs) - 1, -1, -1):
        higher = configs[level + 1 :]
        for wrapper in configs[level].wrappers:
            if not any(wrapper.name in (*c.disable, *(w.name for w in c.wrappers)) for c in higher):
                table.append(wrapper)
    return tuple(table)


def switched(name: str, configs: Sequence[LayerConfig]) -> tuple[str, LayerConfig] | None:
    """``("enable" | "disable", layer)`` from the highest of ``configs`` (lowest first) that lists
    ``name`` in ``enable`` or ``disable`` (``disable`` wins within one layer), else None."""
    for config in reversed(configs):
        if name in config.disable:
            return "disable", config
        if name in config.enable:
            return "enable", config
    return None


def salvage(
    data: object, source: Source, allow_trust: bool = False, cache: bool = False
) -> tuple[LayerConfig, tuple[str, ...]]:
    """The valid part of a layer, and one sentence for each part left out.

    A mistake costs only the part it is in: an invalid allocator option drops that option,
    any other mistake in a rule drops that rule, a bad top-level setting drops that setting,
    and the rest of the file applies. A typo in one rule thus switches off neither the
    file's deny rules nor its allow rules. Raises PolicyError only when the policy is not a
    table at all. A valid file costs one ``validate`` (``cache``: as ``validate``'s).
    """
    try:
        return validate(data, source, allow_trust, cache=cache), ()
    except PolicyError:
        if not isinstance(data, dict):
            raise
    problems: list[str] = []
    top: dict = {}
    for key, value in data.items():
        if key == "rules":
            continue
        if key == "wrappers" and isinstance(value, list):
            value = _kept_wrappers(value, source.layer, problems)
        try:
            validate({**top, key: value}, source, allow_trust)
            top[key] = value
        except PolicyError as exc:
            if key == "allocator" and isinstance(value, dict):
                top[key] = _kept_options(
                    value,
                    lambda t: validate({**top, "allocator": t}, source, allow_trust),
                    problems,
                )
            else:
                problems.append(_sentence(exc, f"The setting {key!r} is ignored."))
    config = validate(top, source, allow_trust)
    raw = data.get("rules", [])
    if not isinstance(raw, list) or len(raw) > _MAX_LIST:
        problems.append("rules must be an array of tables ([[rules]]). No rule is read.")
        raw = []
    rules: list[Rule] = []
    for index, item in enumerate(raw):
        rule = _salvage_rule(item, index, source, problems)
        if rule is not None and any(r.name == rule.name for r in rules):
            problems.append(f"rule {index + 1}: another rule is already named {rule.name!r}. "
                            f"Rule {index + 1} is ignored.")
        elif rule is not None:
            rules.append(rule)
    return replace(config, rules=tuple(rules)), tuple(problems)


def _sentence(error: Exception, consequence: str) -> str:
    text = str(error)
    return f"{text}{'' if text.endswith(('?', '.')) else '.'} {consequence}"


def _kept_options(options: dict, check: Callable[[dict], object], problems: list[str]) -> dict:
    """The options of an allocator table that ``check`` accepts, one after the other."""
    kept: dict = {}
    for key, value in options.items():
        try:
            check({**kept, key: value})
            kept[key] = value
        except PolicyError as exc:
            why = _default_instead(key, options)
            problems.append(_sentence(exc, f"The option {key!r} is ignored{why}."))
    return kept


def _default_instead(key: str, options: Mapping) -> str:
    """Where the option meant by an ignored ``key`` comes from instead, when it has a default.

    A mistyped or invalid ``expandable_segments`` leaves the built-in default in effect, so a
    run shows ``expandable_segments:True`` beside the warning: say so, not to puzzle.
    """
    meant = key if key in allocconf.KEYS else closest(key, allocconf.KEYS)
    if meant not in DEFAULT_ALLOCATOR or (meant != key and meant in options):
        return ""
    default = f"{meant}:{DEFAULT_ALLOCATOR[meant]}"
    return f"; {meant} then comes from the defaults ([allocator], built-in: {default})"


def _kept_wrappers(items: list, layer: str, problems: list[str]) -> list:
    """The ``[[wrappers]]`` tables that are valid, each named once; a problem for each other."""
    kept, names = [], set()
    for index, item in enumerate(items):
        try:
            name = wrappers.validate(item, f"wrapper {index + 1}", layer).name
        except wrappers.WrapperError as exc:
            problems.append(_sentence(exc, f"Wrapper {index + 1} is ignored."))
            continue
        if name in names:
            problems.append(f"wrapper {index + 1}: another wrapper is already named {name!r}. "
                            f"Wrapper {index + 1} is ignored.")
            continue
        names.add(name)
        kept.append(item)
    return kept


def _salvage_rule(item: object, index: int, source: Source, problems: list[str]) -> Rule | None:
    """Rule ``index`` without its invalid allocator options, or None when it has other errors."""
    try:
        return _rule(item, index, source)
    except PolicyError as exc:
        error = exc
    options = item.get("allocator") if isinstance(item, dict) else None
    if isinstance(options, dict) and isinstance(item, dict):
        try:
            _rule({**item, "allocator": {}}, index, source)
        except PolicyError as exc:
            error = exc
        else:
            def check(table: dict) -> Rule:
                return _rule({**item, "allocator": table}, index, source)

            return check(_kept_options(options, check, problems))
    problems.append(_sentence(error, f"Rule {index + 1} is ignored."))
    return None


def summarize(problems: Sequence[str], shown: int = 3) -> str:
    """The problems of one file for its single warning: the first few, and how many more."""
    if not problems:
        return ""
    more = len(problems) - shown
    tail = f" ({more} more: run `autoalloc check`.)" if more > 0 else ""
    return " ".join(problems[:shown]) + tail + " The rest of the file applies."
