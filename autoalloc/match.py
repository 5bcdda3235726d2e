"""Which rule decides: the first one, in policy order, whose condition holds for this process.

A rule holds when its argv condition (if any) holds and any of its lists matches: the
script path, the ``-m`` module, the console command, or a trigger module that has been
imported. Pure: an entry point and a set of imported names in, a ``Match`` out.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

from autoalloc.entrypoint import EntryPoint
from autoalloc.policy import Rule


@dataclass(frozen=True)
class Match:
    """The deciding rule (or None) and what made it match."""

    rule: Rule | None = None
    reason: str = ""
    trigger: str | None = None  # the imported module, for import matches


def argv_reason(rule: Rule, entry: EntryPoint) -> str | None:
    """Why the rule matches this command line, or None."""
    patterns = rule.compiled
    if not patterns.arguments(entry.args):
        return None
    if entry.kind == "script" and patterns.script(entry.path, entry.realpath):
        return f"script {entry.path} matches {list(rule.scripts)}"
    if entry.kind == "module" and patterns.module(entry.target):
        return f"module {entry.target} matches {list(rule.modules)}"
    if entry.kind == "command" and (patterns.command(entry.target) or patterns.script(entry.path, entry.realpath)):
        return f"command {entry.target} matches {list(rule.commands or rule.scripts)}"
    return None


def import_trigger(rule: Rule, entry: EntryPoint, imported: Container[str]) -> str | None:
    """The first of the rule's trigger modules that is imported, when the argv condition holds."""
    for name in rule.imports:
        if name in imported and rule.compiled.arguments(entry.args):
            return name
    return None


def first_match(rules: Sequence[Rule], entry: EntryPoint, imported: Container[str] = ()) -> Match:
    """The deciding rule for this process, given the modules imported so far."""
    for rule in rules:
        reason = argv_reason(rule, entry)
        if reason:
            return Match(rule, reason)
        trigger = import_trigger(rule, entry, imported)
        if trigger:
            return Match(rule, f"module {trigger} is imported", trigger)
    return Match()


def pending_triggers(rules: Iterable[Rule], imported: Container[str]) -> set[str]:
    """Trigger modules not imported yet: the names to keep watching."""
    return {name for rule in rules for name in rule.imports if name not in imported}
