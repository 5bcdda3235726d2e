"""What a policy file may hold, declared once, and the one walk that checks a table against it.

Every key of a policy file, of its ``[[rules]]`` and of its ``[[wrappers]]`` tables is a
``Field`` here: its type, its limits and its allowed values (a near miss gets a did-you-mean).
``walk`` reads a parsed document against these fields and keeps what is valid; each mistake
becomes one ``Problem`` that says what is wrong and what it costs: a bad top-level setting
costs that setting, an invalid allocator option that option, any other mistake in a rule or
a wrapper that rule or wrapper, and the rest of the file applies. The strict reading is the
same walk, raising the first problem as a ``PolicyError``. The walk also expands a rule's
references to the file's own ``[module_sets]`` (``modulesets``); one to a lower layer's set
is left for ``modulesets.link``.

Pure: plain TOML data in, plain checked data out. ``policy`` builds its records from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Literal

from autoalloc import allocconf
from autoalloc.allocconf import DEFAULT_ALLOCATOR
from autoalloc.messages import closest, did_you_mean, meaning, shortened
from autoalloc.modulesets import MODULE_LISTS, REF, TABLE, expand, expand_lists, has_ref
from autoalloc.problems import PolicyError, Problem
from autoalloc.records import record

MAX_LIST = 10_000  # entries of one list, rules and wrappers of one file included
MAX_STR = 4096
NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}\Z"
NAME_RULE = "name must be letters, digits, '-', '_' or '.' (at most 100)"

Kind = Literal["bool", "text", "strings", "paths", "choice", "allocator", "tables", "sets"]


@record(frozen=True)
class Field:
    """One key: what its value must be (``choices`` for a ``choice``)."""

    kind: Kind
    choices: tuple[str, ...] = ()


@record(frozen=True)
class Item:
    """One kind of array-of-tables entry (``[[rules]]``, ``[[wrappers]]``)."""

    noun: str  # "rule": counted from 1 in messages, as a person counts them in the file
    fields: Mapping[str, Field]
    needs: tuple[str, ...]  # at least one of these must be given (and not empty or false)
    name_required: bool  # False: an unnamed entry is named "<layer>-<index>"
    # key -> the key it qualifies, which must be given with it (not_imports needs imports)
    requires: Mapping[str, str] = field(default_factory=dict)


ACTIONS = ("apply", "skip")
CONFLICT_MODES = ("keep", "override")
SETTER_MODES = ("warn", "merge")  # on_setter: for a later setter call that drops options
ADAPTIVE_MODES = ("off", "advise", "apply")
PROGRAM_KINDS = ("python", "command")

_STRINGS = Field("strings")
_BOOL = Field("bool")
_TEXT = Field("text")

RULE = Item(
    noun="rule",
    fields={
        "name": _TEXT, "description": _TEXT, "scripts": _STRINGS, "modules": _STRINGS,
        "commands": _STRINGS, "argv": _STRINGS, **dict.fromkeys(MODULE_LISTS, _STRINGS),
        "action": Field("choice", ACTIONS), "allocator": Field("allocator"), "enabled": _BOOL,
        "outside": Field("paths"), "training": _BOOL,
    },
    needs=("scripts", "modules", "commands", "imports", "training"),
    name_required=False,
    requires={key: kind.requires for key, kind in MODULE_LISTS.items() if kind.requires},
)

WRAPPER_LISTS = (
    "modules", "commands", "scripts", "subcommands", "value_options", "flag_options",
    "module_options", "code_options", "command_options", "no_program", "separators",
)
WRAPPER_FLAGS = ("launcher", "options_take_value", "split_at_separator", "after_separator")
WRAPPER = Item(
    noun="wrapper",
    fields={
        "name": _TEXT, "description": _TEXT, "program": Field("choice", PROGRAM_KINDS),
        **{key: _STRINGS for key in WRAPPER_LISTS}, **{key: _BOOL for key in WRAPPER_FLAGS},
    },
    needs=("modules", "commands", "scripts"),
    name_required=True,
)

TOP = {
    "enabled": _BOOL,
    "on_conflict": Field("choice", CONFLICT_MODES),
    "on_setter": Field("choice", SETTER_MODES),
    "adaptive": Field("choice", ADAPTIVE_MODES),
    "allocator": Field("allocator"),
    "rules": Field("tables"),
    "disable": _STRINGS,
    "enable": _STRINGS,
    "trusted_dirs": _STRINGS,  # user, site and AUTOALLOC_CONFIG files only
    "wrappers": Field("tables"),
    TABLE: Field("sets"),
}
ITEMS = {"rules": RULE, "wrappers": WRAPPER}

# The top-level tables that pyproject.toml's own specifications define (PEP 517, 621, 735):
# a key of these is never autoalloc's, whatever its name.
PYPROJECT_OWN = ("build-system", "project", "tool", "dependency-groups")


def misplaced(document: Mapping[str, Any], mentioned: bool = True) -> list[Problem]:
    """Autoalloc keys at the top level of a pyproject.toml (``[[rules]]`` pasted below
    ``[tool.autoalloc]`` starts a table of its own), each with its right spelling there.

    ``mentioned``: the file names autoalloc somewhere; else only ``[[rules]]`` that look
    like autoalloc's (a condition key) and an ``[allocator]`` of torch's options count, not
    another tool's top-level table of the same name.
    """
    problems = []
    for key, value in document.items():
        if key not in TOP or key in PYPROJECT_OWN or not (mentioned or _looks_ours(key, value)):
            continue
        kind = TOP[key].kind
        if key in ITEMS:
            wrote, right = f"[[{key}]]", f"[[tool.autoalloc.{key}]]"
        elif kind in ("allocator", "sets"):
            wrote, right = f"[{key}]", f"[tool.autoalloc.{key}]"
        else:
            example = "[...]" if kind == "strings" else "..."
            wrote, right = key, f"tool.autoalloc.{key} = {example}"
        problems.append(Problem(
            f"{wrote} is at the top level of pyproject.toml, where autoalloc does not read it: "
            f"write {right}", _misplaced_cost(key, value)))
    return problems


def _looks_ours(key: str, value: object) -> bool:
    if key == "rules" and isinstance(value, list):
        return any(isinstance(r, dict) and not set(r).isdisjoint(RULE.needs) for r in value)
    if key == "allocator" and isinstance(value, dict):
        return bool(value) and set(value) <= set(allocconf.KEYS)
    return False


def _misplaced_cost(key: str, value: object) -> str:
    """What a misplaced key costs: ``Its 2 rules are ignored.``, ``It is ignored.``"""
    if key not in ITEMS or not isinstance(value, list) or not value:
        return "It is ignored."
    count, noun = len(value), ITEMS[key].noun
    return f"Its {count} {noun}{' is' if count == 1 else 's are'} ignored."


@record(frozen=True)
class Document:
    """What ``walk`` kept of a policy document: checked top-level values, rules and wrappers
    as checked tables (each with its ``name``), and a problem for everything left out."""

    settings: Mapping[str, Any]
    rules: tuple[Mapping[str, Any], ...]
    wrappers: tuple[Mapping[str, Any], ...]
    problems: tuple[Problem, ...]
    # a rule or set still refers to a lower layer's set ('@name'): ``modulesets.link``
    pending: bool = False


def walk(data: object, layer: str, allow_trust: bool) -> Document:
    """Check a parsed policy document; raises PolicyError only when it is not a table."""
    if not isinstance(data, dict):
        raise PolicyError("the policy must be a table")
    fields = TOP if allow_trust else {k: v for k, v in TOP.items() if k != "trusted_dirs"}
    problems: list[Problem] = []
    settings: dict[str, Any] = {}
    items: dict[str, tuple[Mapping[str, Any], ...]] = {"rules": (), "wrappers": ()}
    known = _known_first(data, fields, "", problems, _setting_cost)
    # the sets first, wherever the file defines them: the rules refer to them
    sets = _module_sets(dict(known).get(TABLE, {}), problems)
    for key, value in known:
        if key in ITEMS:
            refs = sets if key == "rules" else None
            items[key] = _items(value, key, ITEMS[key], layer, problems, refs)
        elif key != TABLE:
            _check_into(settings, key, fields[key], value, "", problems, _setting_cost(key))
    if sets.raw:
        settings[TABLE] = sets.expanded()
    pending = any(has_ref(v) for v in settings.get(TABLE, {}).values()) or any(
        has_ref(rule.get(key, ())) for rule in items["rules"] for key in MODULE_LISTS
    )
    return Document(settings, items["rules"], items["wrappers"], tuple(problems), pending)


def _setting_cost(key: str) -> str:
    return f"The setting {shortened(key)} is ignored."


def _known_first(
    data: Mapping[str, Any], fields: Mapping[str, Field], where: str, problems: list[Problem],
    cost: Any,
) -> list[tuple[str, Any]]:
    """The known keys of ``data`` (file order); a problem for each unknown key, first."""
    for key in data:
        if key not in fields:
            hint = did_you_mean(key, fields) if len(problems) < HINTED else ""
            if key == "trusted_dirs":
                hint = " (only user, site and AUTOALLOC_CONFIG files may trust directories)"
            problems.append(Problem(f"{_at(where)}unknown key {shortened(key)}{hint}", cost(key)))
    return [(key, value) for key, value in data.items() if key in fields]


# A file's warning shows its first 3 problems and counts the rest: a did-you-mean (difflib,
# slow for many keys) is looked for in a layer's first problems only, so that a file of
# thousands of mistyped keys still loads at once.
HINTED = 20


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def _check_into(
    out: dict[str, Any], key: str, field: Field, value: object, where: str,
    problems: list[Problem], cost: str,
) -> None:
    """``out[key]`` = the checked value; else a problem costing ``cost``.

    An allocator table keeps its valid options: each invalid one costs itself only.
    """
    try:
        out[key] = check(key, field, value, where)
    except PolicyError as exc:
        if field.kind == "allocator" and isinstance(value, dict):
            out[key] = _kept_options(value, f"{_at(where)}allocator", problems)
        else:
            problems.append(Problem(str(exc), cost))


def check(key: str, field: Field, value: object, where: str = "") -> Any:
    """One value checked against its field (raises PolicyError naming the key); converted:
    lists to tuples, allocator tables to torch's text for each option."""
    name = f"{_at(where)}{key}"
    kind = field.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise PolicyError(f"{name} must be true or false")
        return value
    if kind == "text":
        if not isinstance(value, str) or len(value) > MAX_STR:
            raise PolicyError(f"{name} must be a string")
        return value
    if kind == "choice":
        if value not in field.choices:
            hint = did_you_mean(value, field.choices)
            shown = shortened(value, 40)  # short, whatever its size
            raise PolicyError(f"{name} must be {_either(field.choices)}, not {shown}{hint}")
        return value
    if kind == "allocator":
        return allocator(value, f"{_at(where)}allocator")
    if kind == "tables":
        if not isinstance(value, list) or len(value) > MAX_LIST:
            raise PolicyError(f"{name} must be an array of tables ([[{key}]])")
        return value
    if kind == "strings" and isinstance(value, bool) and key == "enable":
        raise PolicyError(f"{name} must be a list of rule names{meaning('enabled')}")
    strings = _strings(value, name)
    if kind == "paths":
        for path in strings:
            parts = path.split("/")
            if path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
                example = "'pkg/__init__.py'"
                raise PolicyError(f"{name}: {path!r} must be a relative path like {example}")
    return strings


def _either(choices: Sequence[str]) -> str:
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _strings(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"{name} must be a list of strings")
    if len(value) > MAX_LIST:
        raise PolicyError(f"{name} has more than {MAX_LIST} entries")
    for item in value:
        if not isinstance(item, str) or not item or len(item) > MAX_STR:
            raise PolicyError(f"{name} must be a list of non-empty strings")
    return tuple(value)


def allocator(value: object, where: str) -> dict[str, str]:
    """An ``allocator`` table as torch's text per option; raises PolicyError at the first
    invalid option (``where``: ``allocator`` or ``rule 2 ("x"): allocator``)."""
    if not isinstance(value, dict):
        raise PolicyError(f"{where} must be a table")
    out: dict[str, str] = {}
    for key, item in value.items():
        if key not in allocconf.KEYS:
            raise PolicyError(_unknown_option(key, where, closest(key, allocconf.KEYS)))
        try:
            out[key] = allocconf.serialize_value(key, item)
        except allocconf.ConfError as exc:
            raise PolicyError(f"{where}.{key}: {exc}") from None
    try:
        allocconf.check_options(out)
    except allocconf.ConfError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    return out


def _kept_options(options: dict, where: str, problems: list[Problem]) -> dict[str, str]:
    """The options of an allocator table that are valid, one after the other."""
    kept: dict[str, object] = {}
    for key, value in options.items():
        known = key in allocconf.KEYS
        # one closest() per unknown key (hint and default both), and only for the first ones
        meant = key if known else closest(key, allocconf.KEYS) if len(problems) < HINTED else None
        try:
            if not known:  # checked first: no table is built for each of many mistyped keys
                raise PolicyError(_unknown_option(key, where, meant))
            allocator({**kept, key: value}, where)
            kept[key] = value
        except PolicyError as exc:
            why = _default_instead(key, meant, options)
            problems.append(Problem(str(exc), f"The option {shortened(key)} is ignored{why}."))
    return allocator(kept, where)


def _unknown_option(key: str, where: str, meant: str | None) -> str:
    rule = where.rpartition(": ")[0]  # 'rule 2 ("x")' from 'rule 2 ("x"): allocator'
    return f"{_at(rule)}unknown allocator option {shortened(key)}{meaning(meant)}"


def _default_instead(key: str, meant: str | None, options: Mapping[str, object]) -> str:
    """Where the option ``meant`` by an ignored ``key`` comes from instead, when it has a
    default.

    A mistyped or invalid ``expandable_segments`` leaves the built-in default in effect, so a
    run shows ``expandable_segments:True`` beside the warning: say so, not to puzzle.
    """
    if meant not in DEFAULT_ALLOCATOR or (meant != key and meant in options):
        return ""
    default = f"{meant}:{DEFAULT_ALLOCATOR[meant]}"
    return f"; {meant} then comes from the defaults ([allocator], built-in: {default})"


# ---------------------------------------------------------------- module sets

class Sets:
    """One layer's ``[module_sets]``, each expanded on demand within the layer.

    ``raw``: the valid definitions as written; ``broken``: a set whose definition was left
    out, with the reason a reference to it gives. A reference to a set the layer does not
    define, or to the set being defined (``tts = ["@tts", "mylib"]`` extends a lower layer's
    ``tts``), is a lower layer's: it is kept as written, pending, for ``modulesets.link``.
    """

    def __init__(self, raw: Mapping[str, tuple[str, ...]], broken: dict[str, str]) -> None:
        self.raw = raw
        self.broken = broken
        self._done: dict[str, tuple[str, ...]] = {}
        self._open: list[str] = []

    def names(self, name: str, within: str | None = None) -> tuple[str, ...]:
        """What ``@name`` stands for, written in the set ``within`` (None: in a rule);
        raises PolicyError for a cycle or a broken set."""
        if name in self.broken and name != within:
            raise PolicyError(self.broken[name])
        if name in self.raw and name != within:
            return self._own(name)
        return (REF + name,)

    def _own(self, name: str) -> tuple[str, ...]:
        if name in self._done:
            return self._done[name]
        if name in self._open:
            cycle = " -> ".join(REF + n for n in (*self._open[self._open.index(name):], name))
            raise PolicyError(f"the module sets refer to each other in a cycle: {cycle}")
        self._open.append(name)
        try:
            names = expand(self.raw[name], lambda ref: self.names(ref, name))
        finally:
            self._open.pop()
        self._done[name] = names
        return names

    def expanded(self) -> dict[str, tuple[str, ...]]:
        """Every valid set, expanded as far as this layer can (``raw``'s order)."""
        return {name: self._own(name) for name in self.raw if name not in self.broken}


def _module_sets(value: object, problems: list[Problem]) -> Sets:
    """A layer's ``[module_sets]`` checked: each set's mistake costs that set (and the rules
    that refer to it), and a cycle every set in it."""
    if not isinstance(value, dict) or len(value) > MAX_LIST:
        text = f"{TABLE} must be a table of lists of module names ([{TABLE}])"
        problems.append(Problem(text, "No module set is read."))
        return Sets({}, {})
    raw: dict[str, tuple[str, ...]] = {}
    broken: dict[str, str] = {}
    for name, entries in value.items():
        where = f"{TABLE}.{shortened(name)}"
        try:
            if not re.match(NAME_RE, name):
                raise PolicyError(f"{TABLE}: {shortened(name)}: set {NAME_RULE}")
            raw[name] = _strings(entries, where)
            bad = next((e for e in raw[name] if e.startswith(REF)
                        and not re.match(NAME_RE, e[1:])), None)  # fmt: skip
            if bad is not None:
                raise PolicyError(f"{where}: {shortened(bad)} names no module set: {NAME_RULE}")
        except PolicyError as exc:
            raw.pop(name, None)
            broken[name] = _left_out(name)
            problems.append(Problem(str(exc), f"The module set {shortened(name)} is ignored."))
    sets = Sets(raw, broken)
    for name in raw:
        try:
            sets.names(name)
        except PolicyError as exc:
            sets.broken[name] = _left_out(name)
            problems.append(Problem(f"{TABLE}.{name}: {exc}",
                                    f"The module set {shortened(name)} is ignored."))
    return sets


def _left_out(name: str) -> str:
    return f"the module set {shortened(REF + name)} is left out (a mistake in its definition)"


def _items(
    value: object, key: str, item: Item, layer: str, problems: list[Problem],
    sets: Sets | None = None,
) -> tuple[Mapping[str, Any], ...]:
    """The valid entries of a ``[[rules]]`` or ``[[wrappers]]`` array, each name once."""
    try:
        check(key, TOP[key], value)
    except PolicyError as exc:
        problems.append(Problem(str(exc), f"No {item.noun} is read."))
        return ()
    kept: list[Mapping[str, Any]] = []
    names: set[str] = set()
    for index, data in enumerate(value):  # type: ignore[arg-type]
        entry = _item(data, index, item, layer, problems, sets)
        if entry is None:
            continue
        # the built-in file gives a rule in parts of one name (audio-training: its toolkits'
        # command lines, and what other programs import), switched and replaced together
        if entry["name"] in names and layer != "builtin":  # a set: linear in the entries
            problems.append(Problem(
                f"{item.noun} {index + 1}: another {item.noun} is already named "
                f"{entry['name']!r}", f"{item.noun.capitalize()} {index + 1} is ignored."))
            continue
        names.add(entry["name"])
        kept.append(entry)
    return tuple(kept)


def _item(
    data: object, index: int, item: Item, layer: str, problems: list[Problem],
    sets: Sets | None = None,
) -> Mapping[str, Any] | None:
    """One entry's checked values (with ``name``), or None when a mistake costs the entry:
    anything but an invalid allocator option, which costs that option only. ``sets``: the
    layer's module sets, which the entry's lists of module names may refer to."""
    where = f"{item.noun} {index + 1}"
    cost = f"{item.noun.capitalize()} {index + 1} is ignored."
    if not isinstance(data, dict):
        problems.append(Problem(f"{where} must be a table", cost))
        return None
    name = data.get("name") if item.name_required else data.get("name", f"{layer}-{index}")
    if not isinstance(name, str) or not re.match(NAME_RE, name):
        problems.append(Problem(f"{where}: {NAME_RULE}", cost))
        return None
    where = f'{where} ("{name}")'
    mine: list[Problem] = []
    out: dict[str, Any] = {}
    for key, value in _known_first(data, item.fields, where, mine, lambda _: cost):
        _check_into(out, key, item.fields[key], value, where, mine, cost)
    if sets is not None:
        try:
            out.update(expand_lists(out, sets.names, where))
        except PolicyError as exc:
            mine.append(Problem(str(exc), cost))
    if not any(out.get(k) for k in item.needs):
        mine.append(Problem(f"{where} needs at least one of {', '.join(item.needs)}", cost))
    for key, other in item.requires.items():
        if out.get(key) and not out.get(other):
            mine.append(Problem(f"{where}: {key} needs {other}", cost))
    fatal = next((p for p in mine if p.cost == cost), None)
    problems.extend([fatal] if fatal else mine)
    return None if fatal else {**out, "name": name}
