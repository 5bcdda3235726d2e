"""Which rule decides: the first one, in policy order, whose condition holds for this process.

A rule holds when its argv condition (if any) holds and any of its lists matches: the
script path, the ``-m`` module, the console command, or a trigger module that has been
imported (with one of its ``also_imports``, and none of its ``not_imports`` unless one of its
``not_imports_unless`` is there too).
Pure: an entry point and a set of imported names in, a ``Match`` out; only
``inside_checkout`` (an import trigger's ``outside`` markers) looks at the file system.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable, Sequence

from autoalloc.entrypoint import EntryPoint
from autoalloc.globs import which
from autoalloc.policy import Rule
from autoalloc.records import record


@record(frozen=True)
class Match:
    """The deciding rule (or None) and what made it match."""

    rule: Rule | None = None
    reason: str = ""
    trigger: str | None = None  # the imported module, for import matches


def argv_reason(rule: Rule, entry: EntryPoint) -> str | None:
    """Why the rule matches this command line, or None."""
    patterns = rule.compiled
    # the real path only where it differs (a link): every rule is looked at, at every start
    paths = (entry.path,) if entry.realpath == entry.path else (entry.path, entry.realpath)
    reason = None
    if entry.kind == "script" and patterns.script(*paths):
        reason = f"script matches {patterns.which_script(rule.scripts, *paths)!r}"
    elif entry.kind == "module" and patterns.module(entry.target):
        reason = f"module matches {which(rule.modules, 'modules', entry.target)!r}"
    elif entry.kind == "command":
        if patterns.command(entry.target):
            reason = f"command matches {which(rule.commands, 'commands', entry.target)!r}"
        elif patterns.script(*paths):
            reason = f"command path matches {patterns.which_script(rule.scripts, *paths)!r}"
    # The argv condition last, for a rule whose selectors matched: a command line can carry
    # tens of thousands of arguments, and most rules do not name this program.
    if reason is None or not patterns.argv:
        return reason
    arg = patterns.argument(entry.args)
    if arg is None:
        return None
    return reason + f" and argument {arg!r} matches {which(rule.argv, 'argv', arg)!r}"


def import_trigger(rule: Rule, entry: EntryPoint, imported: Container[str]) -> str | None:
    """The first of the rule's trigger modules that is imported, when the argv condition holds
    and the ``also_imports`` and ``not_imports`` conditions too."""
    for name in rule.imports:
        if name in imported and rule.compiled.arguments(entry.args):
            if rule.also_imports and _first(rule.also_imports, imported) is None:
                return None
            if _excluded_by(rule, imported):
                return None
            return None if rule.outside and inside_checkout(entry, rule.outside) else name
    return None


def _excluded_by(rule: Rule, imported: Container[str]) -> str | None:
    """The first of the rule's ``not_imports`` that is imported, when none of its
    ``not_imports_unless`` is: a few dozen set lookups."""
    found = _first(rule.not_imports, imported)
    return None if found is None or _first(rule.not_imports_unless, imported) else found


def _first(names: Sequence[str], imported: Container[str]) -> str | None:
    return next((name for name in names if name in imported), None)


def _trigger_reason(rule: Rule, trigger: str, imported: Container[str]) -> str:
    reason = f"module {trigger} is imported"
    also = _first(rule.also_imports, imported)
    if also is not None and also != trigger:
        reason += f" with {also}"
    if not rule.not_imports:
        return reason
    against, despite = _first(rule.not_imports, imported), _first(rule.not_imports_unless, imported)
    if against is None:
        return reason + " (none of its not_imports is)"
    return reason + f" ({against} of its not_imports too, outweighed by {despite})"


def inside_checkout(entry: EntryPoint, markers: Sequence[str]) -> str | None:
    """The toolkit checkout the program belongs to, or None.

    A script (or console command) is inside when a directory above it holds one of
    ``markers``, files relative to a checkout's root (``nemo/package_info.py``); a ``-m``
    module is inside when its top-level package is a marker's first directory. The
    checkout's folder name plays no part: users rename it. At most a few dozen stats.
    """
    if entry.kind == "module":
        top = entry.target.split(".")[0]
        return next((m for m in markers if "/" in m and m.split("/")[0] == top), None)
    if entry.kind not in ("script", "command"):
        return None
    for path in dict.fromkeys(p for p in (entry.path, entry.realpath) if p):
        found = _checkout_above(os.path.dirname(path), tuple(markers))
        if found:
            return found
    return None


def _checkout_above(directory: str, markers: tuple[str, ...]) -> str | None:
    while True:
        for marker in markers:
            if os.path.isfile(os.path.join(directory, marker)):
                return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def first_match(
    rules: Sequence[Rule], entry: EntryPoint, imported: Container[str] = (), trains: bool = False
) -> Match:
    """The deciding rule for this process, given the modules imported so far and whether it
    has built an optimizer (``trains``: a ``training = true`` rule holds only then)."""
    for rule in rules:
        if rule.training and not trains:
            continue
        suffix = " and it builds an optimizer" if rule.training else ""
        reason = argv_reason(rule, entry)
        if reason:
            return Match(rule, reason + suffix)
        trigger = import_trigger(rule, entry, imported)
        if trigger:
            return Match(rule, _trigger_reason(rule, trigger, imported) + suffix, trigger)
        if rule.training and not (rule.scripts or rule.modules or rule.commands or rule.imports):
            if rule.compiled.arguments(entry.args):
                return Match(rule, "the process builds an optimizer")
    return Match()


def watches_training(rules: Iterable[Rule]) -> bool:
    """Whether any rule waits for the process to build an optimizer."""
    return any(rule.training for rule in rules)


def training_names(rules: Iterable[Rule]) -> frozenset[str]:
    """Every module name the ``training`` rules look for: what they count needs evidence that
    the program asked for it (``autoalloc.evidence``)."""
    return frozenset(
        name
        for rule in rules
        if rule.training
        for name in (*rule.imports, *rule.also_imports, *rule.not_imports,
                     *rule.not_imports_unless)
    )


def pending_triggers(rules: Iterable[Rule], imported: Container[str]) -> set[str]:
    """Trigger modules not imported yet: the names to keep watching (a ``training`` rule's are
    looked up when the optimizer is built, not watched). ``also_imports`` are watched too: the
    trigger may come first."""
    return {
        name
        for rule in rules
        if not rule.training
        for name in (*rule.imports, *rule.also_imports)
        if name not in imported
    }
