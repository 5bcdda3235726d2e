"""Glob patterns of the policy, compiled once: ``**`` paths for scripts, dotted names, argv tokens.

Script patterns with a ``/`` match the whole absolute path, ``**`` spanning any number of
directories (a relative pattern may start anywhere: ``examples/asr/*.py`` is
``**/examples/asr/*.py``); a pattern without ``/`` matches the file name. Module and
command patterns are whole-name globs (``*`` also crosses dots). Argv patterns are
case-insensitive and match one argument.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass


def _class(pattern: str, i: int) -> tuple[str, int]:
    """Translate a ``[...]`` class starting at ``i``; a ``[`` without ``]`` is literal."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    if j >= len(pattern):
        return re.escape("["), i + 1
    body = pattern[i + 1 : j].replace("\\", "\\\\")
    if body[:1] in ("!", "^"):
        body = "^" + body[1:]
    return f"[{body}]", j + 1


def path_regex(pattern: str) -> str:
    """Regex source for a path glob with ``**``."""
    if pattern.startswith("~"):
        pattern = os.path.expanduser(pattern)
    if not pattern.startswith(("/", "**")):
        pattern = "**/" + pattern
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            text, i = _class(pattern, i)
            out.append(text)
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _either(sources: Sequence[str], flags: int = 0) -> re.Pattern[str] | None:
    if not sources:
        return None
    return re.compile("|".join(f"(?:{s})" for s in sources) + r"\Z", flags | re.DOTALL)


@dataclass(frozen=True)
class RulePatterns:
    """A rule's patterns as compiled regexes (``None`` when the rule has none of that kind)."""

    paths: re.Pattern[str] | None = None  # script patterns with a '/'
    names: re.Pattern[str] | None = None  # script patterns without '/': file name
    modules: re.Pattern[str] | None = None
    commands: re.Pattern[str] | None = None
    argv: re.Pattern[str] | None = None

    def script(self, *paths: str) -> bool:
        for path in paths:
            if not path:
                continue
            if self.paths is not None and self.paths.match(path):
                return True
            if self.names is not None and self.names.match(os.path.basename(path)):
                return True
        return False

    def module(self, name: str) -> bool:
        return self.modules is not None and bool(self.modules.match(name))

    def command(self, name: str) -> bool:
        return self.commands is not None and bool(self.commands.match(name))

    def arguments(self, args: Sequence[str]) -> bool:
        """The argv condition: true without one, else when any argument matches."""
        if self.argv is None:
            return True
        return any(self.argv.match(a) for a in args)


def compile_rule(
    scripts: Sequence[str], modules: Sequence[str], commands: Sequence[str], argv: Sequence[str]
) -> RulePatterns:
    """Compile one rule's patterns; raises ``re.error`` for a pattern that cannot compile."""

    glob = fnmatch.translate
    return RulePatterns(
        paths=_either([path_regex(p) for p in scripts if "/" in p]),
        names=_either([glob(p) for p in scripts if "/" not in p]),
        modules=_either([glob(p) for p in modules]),
        commands=_either([glob(p) for p in commands]),
        argv=_either([glob(p) for p in argv], re.IGNORECASE),
    )


def which(patterns: Sequence[str], kind: str, value: str) -> str | None:
    """The first of ``patterns`` (of ``kind``: scripts, modules, commands, argv) that matches ``value``."""
    for pattern in patterns:
        if kind == "scripts" and "/" in pattern:
            regex, subject = path_regex(pattern), value
        else:
            regex = fnmatch.translate(pattern)
            subject = os.path.basename(value) if kind == "scripts" else value
        if re.match(regex + r"\Z", subject, re.DOTALL | (re.IGNORECASE if kind == "argv" else 0)):
            return pattern
    return None
