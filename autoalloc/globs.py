"""Glob patterns of the policy: ``**`` paths for scripts, dotted names, argv tokens.

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
from collections.abc import Iterable, Sequence

from autoalloc.records import record

_DSTAR = object()  # a whole '**' segment: any number of directories


class _AnySegment:
    """One path segment, whatever it is (the segment a trailing ``/**`` needs)."""

    def match(self, segment: str) -> bool:
        return True


_ANY = _AnySegment()


class NameGlob:
    """One fnmatch pattern matched against a whole name, with a regex only when one is needed.

    A policy can hold 10,000 rules, and each decision looks at every one: compiling tens of
    thousands of regexes (``re`` caches only 512) would cost seconds, and even one costs more
    than the rest of a match. Most patterns are a literal, or literal parts joined by ``*``
    (``*train*.py``), which string searches decide exactly; for the others (``?``, ``[...]``)
    the literal prefix and suffix reject most names before the regex is compiled (once, here).
    """

    __slots__ = ("_chunks", "_min", "_prefix", "_regex", "_suffix", "literal", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._regex: re.Pattern[str] | None = None
        magic = _has_magic(pattern)
        self.literal = None if magic else pattern
        self._prefix, self._suffix = _bounds(pattern)
        # only '*' wildcards: the literal parts between them, found in order, decide it
        self._chunks = None
        if magic and "?" not in pattern and "[" not in pattern:
            self._chunks = tuple(pattern.split("*")[1:-1])
        self._min = len(self._prefix) + len(self._suffix)

    def match(self, name: str) -> bool:
        if self.literal is not None:
            return name == self.literal
        if len(name) < self._min or not name.startswith(self._prefix):
            return False
        if not name.endswith(self._suffix):
            return False
        if self._chunks is not None:
            # Leftmost first is exact for '*' alone: a later place for one part leaves
            # less room for the next, never more.
            at, end = len(self._prefix), len(name) - len(self._suffix)
            for chunk in self._chunks:
                at = name.find(chunk, at, end)
                if at < 0:
                    return False
                at += len(chunk)
            return True
        if self._regex is None:
            self._regex = _compiled(fnmatch.translate(self.pattern), re.DOTALL)
        return self._regex.match(name) is not None


_NOTHING = re.compile("(?!)")


def _compiled(regex: str, flags: int) -> re.Pattern[str]:
    """``regex`` compiled; one that fnmatch translated into an invalid range on 3.9
    (``[z-a]``) matches nothing, instead of failing the decision of every rule after it.
    3.10+ translates such classes itself, not always into nothing (``[!z-a]``: any one
    character), so on 3.9 such a pattern may match less than on later versions."""
    try:
        return re.compile(regex, flags)
    except re.error:
        return _NOTHING


def _has_magic(text: str) -> bool:
    return "*" in text or "?" in text or "[" in text


def _bounds(pattern: str) -> tuple[str, str]:
    """The literal text every name that ``pattern`` matches starts and ends with."""
    if "?" not in pattern and "[" not in pattern:
        if "*" not in pattern:
            return pattern, ""
        parts = pattern.split("*")
        return parts[0], parts[-1]
    found = [i for i in (pattern.find("*"), pattern.find("?"), pattern.find("[")) if i >= 0]
    star = pattern.rfind("*")
    tail = pattern[star + 1 :]
    # The suffix after the last '*' is literal unless a '?' or a class reaches into it.
    literal_tail = star >= 0 and not _has_magic(tail) and "]" not in tail
    return pattern[: min(found)], tail if literal_tail else ""


def _path_parts(pattern: str) -> list[str]:
    """A script pattern's segments, anchored (a relative pattern may start anywhere)."""
    text = os.path.expanduser(pattern) if pattern.startswith("~") else pattern
    if not text.startswith("/") and not text.startswith("**/") and text != "**":
        text = "**/" + text
    return text.split("/")


def _literals(parts: Sequence[str]) -> frozenset[str]:
    """The segments without wildcards: a path the pattern matches holds every one of them."""
    return frozenset([p for p in parts if p and "*" not in p and "?" not in p and "[" not in p])


def _segment(part: str) -> NameGlob:
    """A matcher for one path segment (``[^...]`` negates too, as ``[!...]``)."""
    return NameGlob(part.replace("[^", "[!"))


class PathGlob:
    """A script pattern with a ``/``, matched segment by segment in at most (pattern x path) steps.

    ``**`` as a whole segment spans any number of directories (a trailing ``/**`` at least
    one); elsewhere ``**`` is ``*``, as in gitignore. A regex with one ``(?:[^/]*/)*`` per
    ``**`` (or one ``[^/]*`` per ``*``) backtracks exponentially on a hostile pattern such
    as ``**/**/**/**/**/**/**/**/**/**/x.py`` and would hang ``import torch``; here ``**``
    is the ``*`` of a greedy wildcard match over segments, and every other segment is an
    fnmatch glob (linear since Python 3.9) matched against one segment.
    """

    __slots__ = ("_fixed", "_last", "_literals", "_parts", "_segments", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        parts = _path_parts(pattern)
        self._parts = parts
        self._segments: tuple | None = None  # built by the first match that gets past the checks
        self._fixed = len(parts) - parts.count("**") + (parts[-1] == "**")
        # Cheap necessary conditions, checked first: most rules fail on them (every rule of
        # the policy is looked at, at every `import torch`).
        self._literals = _literals(parts)
        self._last: NameGlob | None = None  # the file-name segment's matcher, built on demand

    def _build(self) -> tuple:
        parts = self._parts
        segments: list = []
        for i, part in enumerate(parts):
            if part == "**":
                if i == len(parts) - 1:
                    segments.append(_ANY)
                if not segments or segments[-1] is not _DSTAR:
                    segments.append(_DSTAR)
            else:
                segments.append(_segment(part))
        return tuple(segments)

    def match(self, path: str) -> bool:
        parts, present = _split(path)
        if self._fixed > len(parts) or not self._literals <= present:
            return False
        last = self._parts[-1]
        if last != "**":
            if self._last is None:
                self._last = _segment(last)
            if not self._last.match(parts[-1]):
                return False
        if self._segments is None:
            self._segments = self._build()
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


_SPLIT: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}


def _split(path: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """``path``'s segments, and as a set: split once per path, not once per pattern (a
    decision matches the same one or two paths against every rule's patterns)."""
    found = _SPLIT.get(path)
    if found is None:
        if len(_SPLIT) >= 64:  # a long-lived process checking many paths: stay small
            _SPLIT.clear()
        parts = tuple(path.split("/"))
        found = _SPLIT[path] = (parts, frozenset(parts))
    return found


_MATCHERS: dict[tuple[type, str], NameGlob | PathGlob] = {}


def _matcher(kind: type[NameGlob] | type[PathGlob], pattern: str) -> NameGlob | PathGlob:
    """The matcher for one pattern, built at its first use in this process and shared by
    every rule that names the same pattern (``compile_rule`` expands ``~``; a pattern it
    could not expand is not shared, since it would be expanded again)."""
    if pattern.startswith("~"):
        return kind(pattern)
    found = _MATCHERS.get((kind, pattern))
    if found is None:
        if len(_MATCHERS) >= 4096:  # a long-lived process reading many policies: stay small
            _MATCHERS.clear()
        found = _MATCHERS[kind, pattern] = kind(pattern)
    return found


def _any_path(paths: tuple[tuple[str, frozenset[str]], ...], path: str) -> bool:
    """Whether any of the ``PathGlob`` patterns matches ``path``: each one's literal segments
    are a necessary condition checked first, and its matcher is built only for a path that
    holds them all (a decision looks at every rule of the policy, and most name other paths,
    whose matchers would cost more to build than all the checks together)."""
    present = _split(path)[1]
    for pattern, need in paths:
        if need <= present and _matcher(PathGlob, pattern).match(path):
            return True
    return False


def _any_name(names: tuple[tuple[str, str, str], ...], name: str) -> bool:
    """Whether any of the ``NameGlob`` patterns matches ``name``: each one's literal prefix
    and suffix checked first, as ``_any_path`` checks literal segments."""
    for pattern, prefix, suffix in names:
        if name.startswith(prefix) and name.endswith(suffix):
            if _matcher(NameGlob, pattern).match(name):
                return True
    return False


_ARGV: dict[tuple[str, ...], re.Pattern[str]] = {}


def _argv_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """Argument patterns as one case-insensitive regex, compiled at the first use of these
    patterns in this process (not re's cache: on 3.9/3.10 each call names its groups anew,
    so results can be joined)."""
    regex = _ARGV.get(patterns)
    if regex is None:
        if len(_ARGV) >= 256:
            _ARGV.clear()
        flags = re.IGNORECASE | re.DOTALL
        translated = [fnmatch.translate(p) for p in patterns]
        regex = _compiled(_any_of(translated), flags)
        if regex is _NOTHING:  # one of them cannot compile here: the others still match
            valid = [r for r in translated if _compiled(r, flags) is not _NOTHING]
            regex = _compiled(_any_of(valid), flags) if valid else _NOTHING
        _ARGV[patterns] = regex
    return regex


def _any_of(regexes: Sequence[str]) -> str:
    """One regex matching a whole argument that any of ``regexes`` matches."""
    return "|".join(f"(?:{r})" for r in regexes) + r"\Z"


@record(frozen=True)
class RulePatterns:
    """A rule's patterns, each with what rejects most values cheaply, worked out at validation:
    script patterns with a ``/`` (``~`` expanded) with their literal segments; script patterns
    without (the file name), module and command patterns, with their literal prefix and
    suffix; argument patterns. Empty where the rule has none.

    Tuples of strings, so that the layer cache stores them with each rule and restores them
    in C (no code of this record runs then, and an empty field is not stored); a per-pattern
    matcher (``NameGlob``, ``PathGlob``) is built only for a value that gets past the checks,
    once per process and pattern.
    """

    paths: tuple[tuple[str, frozenset[str]], ...] = ()  # (pattern, its literal segments)
    names: tuple[tuple[str, str, str], ...] = ()  # (pattern, its literal prefix, suffix)
    modules: tuple[tuple[str, str, str], ...] = ()
    commands: tuple[tuple[str, str, str], ...] = ()
    argv: tuple[str, ...] = ()

    def script(self, *paths: str) -> bool:
        for path in paths:
            if not path:
                continue
            if self.paths and _any_path(self.paths, path):
                return True
            if self.names and _any_name(self.names, os.path.basename(path)):
                return True
        return False

    def which_script(self, scripts: Sequence[str], *paths: str) -> str | None:
        """The first of ``scripts``, the list these patterns were compiled from, that matches
        the first of ``paths`` any of them matches, or None: what a reason names, in the
        list's order and spelling, each matched as ``script`` matches it (``~`` expanded as
        it was at validation, whatever ``HOME`` is now)."""
        expanded = iter([pattern for pattern, _ in self.paths])
        compiled = [(p, next(expanded) if "/" in p else p) for p in scripts]
        for path in paths:
            if path:  # no real path: skipped, as script() skips it
                for spelled, pattern in compiled:
                    if _matches(pattern, "scripts", path):
                        return spelled
        return None

    def module(self, name: str) -> bool:
        return bool(self.modules) and _any_name(self.modules, name)

    def command(self, name: str) -> bool:
        return bool(self.commands) and _any_name(self.commands, name)

    def arguments(self, args: Sequence[str]) -> bool:
        """The argv condition: true without one, else when any argument matches."""
        return not self.argv or self.argument(args) is not None

    def argument(self, args: Sequence[str]) -> str | None:
        """The first of ``args`` that an argv pattern matches (None without argv patterns)."""
        if not self.argv:
            return None
        regex = _argv_regex(self.argv)
        return next((a for a in args if regex.match(a) is not None), None)


NO_PATTERNS = RulePatterns()


def compile_rule(
    scripts: Sequence[str], modules: Sequence[str], commands: Sequence[str], argv: Sequence[str]
) -> RulePatterns:
    """One rule's patterns with their checks; cheap: regexes are compiled only when a value
    needs one."""
    paths = tuple(
        os.path.expanduser(p) if p.startswith("~") else p  # with the HOME the layer is cached by
        for p in scripts
        if "/" in p
    )
    return RulePatterns(
        tuple((p, _literals(_path_parts(p))) for p in paths),
        _with_bounds(p for p in scripts if "/" not in p),
        _with_bounds(modules),
        _with_bounds(commands),
        tuple(argv),
    )


def _with_bounds(patterns: Iterable[str]) -> tuple[tuple[str, str, str], ...]:
    return tuple((p, *_bounds(p)) for p in patterns)


def which(patterns: Sequence[str], kind: str, value: str) -> str | None:
    """The first of ``patterns`` that matches ``value``, or None.

    ``kind`` says what the patterns are: scripts, modules, commands or argv. Each pattern is
    matched by the matcher ``RulePatterns`` uses for it, so that the pattern a reason names
    is one that decided (a rule's script patterns: ``RulePatterns.which_script``).
    """
    if kind == "scripts":
        return compile_rule(patterns, (), (), ()).which_script(patterns, value)
    return next((p for p in patterns if _matches(p, kind, value)), None)


def _matches(pattern: str, kind: str, value: str) -> bool:
    if kind == "argv":
        return _argv_regex((pattern,)).match(value) is not None
    if kind == "scripts":
        if "/" in pattern:
            return _matcher(PathGlob, pattern).match(value)
        value = os.path.basename(value)
    return _matcher(NameGlob, pattern).match(value)
