"""A rule's lists of module names, declared once, and ``"@name"`` in them expanded.

``MODULE_LISTS`` declares the lists a rule's import condition reads: ``schema`` checks them,
``explain`` and ``selfimports`` say what each does, ``match`` holds what they mean. A policy
file names lists of modules once, in ``[module_sets]``; a rule's lists refer to them as
``"@name"``. ``schema`` expands the references to a file's own sets when it validates the
file; what refers to a lower layer's set stays as written (the layer is ``pending``) until
``link`` expands it against the sets of the layers below, when the layers are read. The
rules that match thus hold plain module names only, and a layer that refers to no lower set
(the built-in one, most files) costs nothing here.

Pure: tuples and mappings in, tuples out; the layers ``link`` takes are the ``LayerConfig``
records of ``policy``, changed with ``records.replace`` only (this module sits below
``policy`` and ``schema``, which use it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from autoalloc.problems import PolicyError, Problem
from autoalloc.records import record, replace


@record(frozen=True)
class ModuleList:
    """What one of a rule's lists of module names does in its import condition."""

    requires: str | None  # the list it qualifies, which must be given with it
    does: str  # what an import of one of its modules does to the rule
    shown: str  # explain's words before its names
    counts: bool  # an import of one of its modules counts for the rule (watched, shown as why)


MODULE_LISTS: Mapping[str, ModuleList] = {
    "imports": ModuleList(None, "trigger it", "one of", True),
    "also_imports": ModuleList("imports", "complete its imports trigger", "with one of", True),
    "not_imports": ModuleList("imports", "keep it from applying", "and none of", False),
    "not_imports_unless": ModuleList(
        "not_imports", "outweigh its not_imports", "unless also one of", False),
}
REF = "@"  # '@name' in a list of module names stands for the names of the module set 'name'
TABLE = "module_sets"

Sets = Mapping[str, tuple[str, ...]]


def expand(entries: tuple[str, ...], names: Callable[[str], tuple[str, ...]]) -> tuple[str, ...]:
    """``entries`` with each ``@name`` replaced by ``names(name)``, in order, each name once
    (the first time it comes); ``entries`` itself when it holds no reference, and the set's
    own tuple when it is one reference (so that a cached layer stores the names once)."""
    if not has_ref(entries):
        return entries
    if len(entries) == 1:
        return names(entries[0][1:])
    out: dict[str, None] = {}
    for entry in entries:
        for name in names(entry[1:]) if entry.startswith(REF) else (entry,):
            out.setdefault(name)
    return tuple(out)


def has_ref(entries: Iterable[str]) -> bool:
    """Whether ``entries`` refer to a module set."""
    return any(entry.startswith(REF) for entry in entries)


def lower_set(name: str, below: Sets) -> tuple[str, ...]:
    """The names of the set ``name`` as the layers ``below`` define it; raises PolicyError
    when none does, with the closest name that one does."""
    if name in below:
        return below[name]
    from autoalloc.messages import did_you_mean, shortened

    hint = did_you_mean(REF + name, [REF + n for n in below])
    raise PolicyError(
        f"no module set is named {shortened(REF + name)} in this file or a lower layer{hint}"
    )


def expand_lists(
    lists: Mapping[str, tuple[str, ...]], names: Callable[[str], tuple[str, ...]], where: str
) -> dict[str, tuple[str, ...]]:
    """The module lists of one rule (those of ``lists``, a rule's keys to their values) with
    each ``@name`` expanded by ``names``; raises PolicyError naming the rule and the key."""
    out = {}
    for key in MODULE_LISTS:
        try:
            if key in lists:
                out[key] = expand(lists[key], names)
        except PolicyError as exc:
            raise PolicyError(f"{where}: {key}: {exc}") from None
    return out


def link(configs: Sequence[Any]) -> list[tuple[Any, tuple[Problem, ...]]]:
    """Each layer (``policy.LayerConfig``, lowest first) with its references to lower
    layers' module sets expanded, and a problem for each it could not expand, which costs
    that rule or set.

    A reference means the set as the layers up to its own define it: a higher layer that
    defines a set of the same name changes its own rules, never a lower layer's. A layer
    that refers to no lower set (not ``pending``) is returned as it is.
    """
    visible: dict[str, tuple[str, ...]] = {}
    out: list[tuple[Any, tuple[Problem, ...]]] = []
    for config in configs:
        problems: list[Problem] = []
        if config.pending:
            below = dict(visible)
            config = replace(
                config, pending=False, module_sets=_linked_sets(config, below, problems),
                rules=_linked_rules(config, below, problems),
            )
        visible.update(config.module_sets)
        out.append((config, tuple(problems)))
    return out


def _linked_sets(config: Any, below: Sets, problems: list[Problem]) -> dict[str, tuple[str, ...]]:
    """The layer's sets with their references to ``below`` expanded; a set that refers to
    one none there defines is left out."""
    sets: dict[str, tuple[str, ...]] = {}
    for name, names in config.module_sets.items():
        try:
            sets[name] = expand(names, lambda ref: lower_set(ref, below))
        except PolicyError as exc:
            cost = f"The module set {name!r} is ignored."
            problems.append(Problem(f"{TABLE}.{name}: {exc}", cost))
    return sets


def _linked_rules(config: Any, below: Sets, problems: list[Problem]) -> tuple[Any, ...]:
    """The layer's rules with their references to ``below`` expanded; a rule that refers
    to a set none there defines is left out."""
    rules = []
    for rule in config.rules:
        lists = {key: getattr(rule, key) for key in MODULE_LISTS}
        try:
            lists = expand_lists(lists, lambda ref: lower_set(ref, below), f'rule "{rule.name}"')
        except PolicyError as exc:
            problems.append(Problem(str(exc), f'Rule "{rule.name}" is ignored.'))
            continue
        rules.append(replace(rule, **lists))
    return tuple(rules)
