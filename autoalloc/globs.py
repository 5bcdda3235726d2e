"""Glob patterns of the policy, compiled once: ``**`` paths for scripts, dotted names, argv tokens.

Script patterns with a ``/`` match the whole absolute path, ``**`` spanning any number of
directories (a relative pattern may start anywhere: ``examples/asr/*.py`` is
``**/examples/asr/*.py``); a pattern without ``/`` matches the file name. Module and
command patterns are whole-name globs (``*`` also crosses dots). Argv patterns are
case-insensitive and match one argument.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

_DSTAR = object()  # a whole '**' segment: any number of directories


class _AnySegment:
    """One path segment, whatever it is (the segment a trailing ``/**`` needs)."""

    def match(self, segment: str) -> bool:
        return True


_ANY = _AnySegment()


class _Literal:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def match(self, segment: str) -> bool:
        return segment == self.text


_translate = functools.lru_cache(maxsize=1024)(fnmatch.translate)


@functools.lru_cache(maxsize=1024)
def _segment(part: str):
    """A matcher for one path segment: literal, or an fnmatch glob (``[^...]`` negates too)."""
    if not any(c in part for c in "*?["):
        return _Literal(part)
    return re.compile(_translate(part.replace("[^", "[!")), re.DOTALL)


class PathGlob:
    """A script pattern with a ``/``, matched segment by segment in at most (pattern x path) steps.

    ``**`` as a whole segment spans any number of directories (a trailing ``/**`` at least
    one); elsewhere ``**`` is ``*``, as in gitignore. A regex with one ``(?:[^/]*/)*`` per
    ``**`` (or one ``[^/]*`` per ``*``) backtracks exponentially on a hostile pattern such
    as ``**/**/**/**/**/**/**/**/**/**/x.py`` and would hang ``import torch``; here ``**``
    is the ``*`` of a greedy wildcard match over segments, and every other segment is an
    fnmatch glob (linear since Python 3.9) matched against one segment.
    """

    __slots__ = ("_fixed", "_last", "_literals", "_segments", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        text = os.path.expanduser(pattern) if pattern.startswith("~") else pattern
        if not text.startswith("/") and not text.startswith("**/") and text != "**":
            text = "**/" + text  # a relative pattern may start anywhere
        parts = text.split("/")
        segments: list = []
        for i, part in enumerate(parts):
            if part == "**":
                if i == len(parts) - 1:
                    segments.append(_ANY)
                if not segments or segments[-1] is not _DSTAR:
                    segments.append(_DSTAR)
            else:
                segments.append(_segment(part))
        self._segments = tuple(segments)
        self._fixed = sum(1 for m in segments if m is not _DSTAR)
        # Cheap necessary conditions, checked first: most rules fail on them (a policy of
        # 200 rules is decided at every `import torch`).
        self._literals = frozenset(m.text for m in segments if isinstance(m, _Literal))
        last = segments[-1]
        self._last = None if last is _DSTAR or last is _ANY else last

    def match(self, path: str) -> bool:
        parts = path.split("/")
        if self._fixed > len(parts):
            return False
        if self._last is not None and not self._last.match(parts[-1]):
            return False
        if not self._literals.issubset(parts):
            return False
        pattern = self._segments
        p = s = 0
        star = mark = -1
        while s < len(parts):
            if p < len(pattern) and pattern[p] is _DSTAR:
                star, mark = p, s
                p += 1
            elif p < len(pattern) and pattern[p].match(parts[s]):
                p += 1
                s += 1
            elif star >= 0:  # let the last '**' take one more segment, retry from there
                mark += 1
                p, s = star + 1, mark
            else:
                return False
        while p < len(pattern) and pattern[p] is _DSTAR:
            p += 1
        return p == len(pattern)


class PathGlobs:
    """Several ``PathGlob``: ``match`` when any does."""

    __slots__ = ("globs",)

    def __init__(self, patterns: Sequence[str]) -> None:
        self.globs = tuple(PathGlob(p) for p in patterns)

    def match(self, path: str) -> bool:
        return any(g.match(path) for g in self.globs)


def _either(sources: Sequence[str], flags: int = 0) -> re.Pattern[str] | None:
    if not sources:
        return None
    return re.compile("|".join(f"(?:{s})" for s in sources) + r"\Z", flags | re.DOTALL)


@dataclass(frozen=True)
class RulePatterns:
    """A rule's patterns as compiled regexes (``None`` when the rule has none of that kind)."""

    paths: PathGlobs | None = None  # script patterns with a '/'
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

    args = (tuple(scripts), tuple(modules), tuple(commands), tuple(argv))
    if any(p.startswith("~") for p in scripts):  # depends on HOME: not cached
        return _compile_rule.__wrapped__(*args)
    return _compile_rule(*args)


@functools.lru_cache(maxsize=512)
def _compile_rule(
    scripts: tuple[str, ...], modules: tuple[str, ...], commands: tuple[str, ...], argv: tuple[str, ...]
) -> RulePatterns:
    glob = fnmatch.translate  # not cached: on 3.9/3.10 each call names its groups anew, so results can be joined
    return RulePatterns(
        paths=PathGlobs([p for p in scripts if "/" in p]) if any("/" in p for p in scripts) else None,
        names=_either([glob(p) for p in scripts if "/" not in p]),
        modules=_either([glob(p) for p in modules]),
        commands=_either([glob(p) for p in commands]),
        argv=_either([glob(p) for p in argv], re.IGNORECASE),
    )


def which(patterns: Sequence[str], kind: str, value: str) -> str | None:
    """The first of ``patterns`` (of ``kind``: scripts, modules, commands, argv) that matches ``value``."""
    for pattern in patterns:
        if kind == "scripts" and "/" in pattern:
            if PathGlob(pattern).match(value):
                return pattern
            continue
        regex = fnmatch.translate(pattern)
        subject = os.path.basename(value) if kind == "scripts" else value
        if re.match(regex + r"\Z", subject, re.DOTALL | (re.IGNORECASE if kind == "argv" else 0)):
            return pattern
    return None
