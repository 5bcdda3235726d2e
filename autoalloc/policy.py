"""Policy: one TOML layer as records, and layers composed into one Policy with provenance.

Functions of their arguments: a TOML dict in, a ``LayerConfig`` (and the ``Problem``s that
``schema``'s walk found, or a ``PolicyError`` naming the key) out; a list of layers in, a
``Policy`` out. One thing more is read: ``HOME``, for a ``~`` in a pattern (``globs``; the
layer cache keys its entries by it). What a file may hold is ``schema``'s; reading files is
``sources``' job.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import field
from typing import Any, Literal, get_args

from autoalloc import globs
from autoalloc.allocconf import DEFAULT_ALLOCATOR, is_serialized
from autoalloc.problems import PolicyError, Problem
from autoalloc.records import record
from autoalloc.wrappers import Wrapper

LayerName = Literal["builtin", "site", "user", "project", "env"]
# skipped: a pyproject.toml that cannot be inspected (a FIFO, a device, unreadable, huge),
# passed over by the project search; explain and check mention it, a run says nothing
LayerState = Literal["found", "missing", "error", "untrusted", "unset", "skipped"]
LAYERS: tuple[LayerName, ...] = get_args(LayerName)

__all__ = [
    "LAYERS", "LayerConfig", "LayerName", "LayerState", "LayerStatus", "Policy", "PolicyError",
    "Rule", "Source", "Valued", "compose", "salvage", "summarize", "switched", "unknown_switches",
]


@record(frozen=True)
class Source:
    """Where a value came from: the layer and its file."""

    layer: str
    path: str

    def describe(self) -> str:
        return f"{self.layer} ({self.path})"


# Built-in rules merged into one: ``enable``/``disable`` of a former name acts on the new one
# (``enable = ["tts-train"]`` turns on every other-audio trainer).
RENAMED: Mapping[str, tuple[str, ...]] = {
    "audio-training": ("tts-train", "enhancement-train", "classification-train"),
}


@record(frozen=True)
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
    compiled: globs.RulePatterns = field(default=globs.NO_PATTERNS, compare=False, repr=False)
    enabled: bool = True  # false: off until a higher layer lists the name in `enable`
    outside: tuple[str, ...] = ()  # files marking toolkit checkouts where `imports` do not fire
    training: bool = False  # holds only once the process has built a torch optimizer
    also_imports: tuple[str, ...] = ()  # an `imports` trigger holds only with one of these,
    not_imports: tuple[str, ...] = ()  # ... and none of these...
    not_imports_unless: tuple[str, ...] = ()  # ... or with one of these too


@record(frozen=True)
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
    # [module_sets], expanded; what a rule's lists refer to ('@name') is expanded in them
    module_sets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pending: bool = False  # a rule or set refers to a lower layer's set: ``modulesets.link``


@record(frozen=True)
class Valued:
    """A setting with its provenance (``None`` source: autoalloc's own default)."""

    value: object
    source: Source | None = None
    rule: str | None = None


def salvage(
    data: object, source: Source, allow_trust: bool = False
) -> tuple[LayerConfig, tuple[str, ...]]:
    """The valid part of a layer, and one sentence for each part left out.

    A mistake costs only the part it is in: an invalid allocator option drops that option,
    any other mistake in a rule drops that rule, a bad top-level setting drops that setting,
    and the rest of the file applies. A typo in one rule thus switches off neither the
    file's deny rules nor its allow rules. Raises PolicyError only when the policy is not a
    table at all.
    """
    config, problems = _layer(data, source, allow_trust)
    return config, tuple(p.sentence() for p in problems)


def _layer(
    data: object, source: Source, allow_trust: bool
) -> tuple[LayerConfig, tuple[Problem, ...]]:
    """One layer's records, built from what the schema's walk kept, and its problems."""
    from autoalloc import schema  # only where a file is parsed: cached layers skip it

    document = schema.walk(data, source.layer, allow_trust)
    kept = (document.settings, document.rules, document.wrappers, document.pending)
    return walked(source, *kept), document.problems


def walked(source: Source, settings: Mapping[str, Any], rules: Sequence[Mapping[str, Any]],
           wrappers: Sequence[Mapping[str, Any]], pending: bool) -> LayerConfig:  # fmt: skip
    """A layer's records from what the schema's walk kept: each top-level setting of
    ``schema.TOP`` is a field of the same name; rules and wrappers are checked tables."""
    made = tuple(_rule(checked, source) for checked in rules)
    wraps = tuple(Wrapper(layer=source.layer, **w) for w in wrappers)
    return LayerConfig(source=source, rules=made, wrappers=wraps, pending=pending, **settings)


def _rule(checked: Mapping[str, Any], source: Source) -> Rule:
    """A rule from its checked table, its patterns compiled."""
    kinds = ("scripts", "modules", "commands", "argv")
    compiled = globs.compile_rule(*(checked.get(kind, ()) for kind in kinds))
    return Rule(source=source, compiled=compiled, **checked)


@record(frozen=True)
class LayerStatus:
    """One policy layer as read: where it is, what happened (``found``, ``missing``, ``error``,
    ``untrusted`` or ``unset``), and what it holds."""

    layer: LayerName
    path: str | None
    status: LayerState
    reason: str = ""  # why no file is used
    config: LayerConfig | None = field(default=None, compare=False, repr=False)  # validated
    data: bytes = field(default=b"", compare=False, repr=False)  # the bytes read (layercache)
    notes: tuple[str, ...] = ()  # a sentence for each part of a file used that is left out
    aside: str = ""  # what the file leaves unread elsewhere (a [tool.autoalloc] beside it)

    @property
    def message(self) -> str:
        """What a run warns of once, and explain and check show."""
        return " ".join(filter(None, (self.reason, summarize(self.notes), self.aside)))


@record(frozen=True)
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
        """The allocator options an ``apply`` rule asks for: ``[allocator]`` overlaid by its own.

        Each is checked again, as validation made it (``is_serialized``): a layer restored
        from the layer cache is whatever that file held, and what is not a valid value is
        left out here rather than handed to torch, whose parser it would break."""
        options = {k: v for k, v in self.allocator.items() if is_serialized(k, v.value)}
        for key, value in rule.allocator.items():
            if is_serialized(key, value):
                options[key] = Valued(value, rule.source, rule.name)
        return options


# The top-level settings a layer may set, and their values when none does.
SCALARS = {"enabled": True, "on_conflict": "keep", "on_setter": "warn", "adaptive": "off"}


def compose(configs: Sequence[LayerConfig], layers: Sequence[LayerStatus] = ()) -> Policy:
    """Compose validated layers, given lowest first."""
    settings = {key: Valued(value) for key, value in SCALARS.items()}
    allocator: dict[str, Valued] = {k: Valued(v) for k, v in DEFAULT_ALLOCATOR.items()}
    for config in configs:  # lowest first: a higher layer's setting overrides
        for key in SCALARS:
            if getattr(config, key) is not None:
                settings[key] = Valued(getattr(config, key), config.source)
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
        # most layers above list no `enable`/`disable` and name none of the rules below
        switching = any(c.disable or c.enable for c in higher)
        taken = frozenset().union(*named[level + 1 :])
        for rule in config.rules:
            switch = switched(rule.name, higher) if switching else None
            disabler = switch[1] if switch and switch[0] == "disable" else None
            replacer = None
            if rule.name in taken:
                replacer = next(configs[i] for i in above if rule.name in named[i])
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
        layers=tuple(layers), configs=tuple(configs), allocator=allocator, rules=tuple(rules),
        dropped=dropped, switched_on=switched_on, wrappers=_wrappers(configs), **settings,
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
    ``name`` (or a former name of it) in ``enable`` or ``disable`` (``disable`` wins within one
    layer), else None."""
    names = (name, *RENAMED.get(name, ()))
    for config in reversed(configs):
        if not (config.disable or config.enable):
            continue  # most layers list neither: composing looks at every rule in each
        if any(n in config.disable for n in names):
            return "disable", config
        if any(n in config.enable for n in names):
            return "enable", config
    return None


def unknown_switches(
    config: LayerConfig, known: Collection[str], more: Callable[[], Collection[str]] = tuple
) -> list[str]:
    """A sentence for each name in ``config``'s ``disable`` or ``enable`` that names no rule
    of any layer (``known``; ``more()``: other names, e.g. the built-in wrappers, asked
    only when a name is not in ``known``), with the closest name that does."""
    from autoalloc.messages import closest, meaning, shortened

    out = []
    extra: Collection[str] | None = None
    former = {old for names in RENAMED.values() for old in names}
    for key, does in (("disable", "off"), ("enable", "on")):
        for name in getattr(config, key):
            if name in known or name in former:
                continue
            extra = more() if extra is None else extra
            if name in extra:
                continue
            # difflib is slow on many names: a hint for the first few mistakes only, any case
            folded = {n.casefold(): n for n in sorted({*known, *extra})} if len(out) < 5 else {}
            hint = meaning(folded.get(closest(name.casefold(), folded))) if folded else ""
            out.append(
                f"{key}: no rule is named {shortened(name)}{hint or '.'} "
                f"It switches nothing {does}."
            )
    return out


def summarize(problems: Sequence[str], shown: int = 3) -> str:
    """The problems of one file for its single warning: the first few, and how many more."""
    if not problems:
        return ""
    more = len(problems) - shown
    tail = f" ({more} more: run `autoalloc check`.)" if more > 0 else ""
    return " ".join(problems[:shown]) + tail + " The rest of the file applies."
