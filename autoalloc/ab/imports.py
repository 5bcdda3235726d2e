"""The modules a program's own code imports, read from its source (never run), for ``ab``.

``autoalloc ab`` must know before running a command what its real run will do. A program no
rule names at ``import torch`` can still be decided later, at its first optimizer or at an
import trigger, from what it imports; this reads those imports from the entry script and
the program's own modules beside it (``import a.b``, ``from a import b``: ``a``, ``a.b``),
to ask the policy what that run would get. A reading, not the run: the run's report says
what really happened.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from typing import Any

MAX_FILES = 64
MAX_BYTES = 1 << 20


def names_in(source: str) -> set[str]:
    """The absolute module names ``source`` imports, with their parent packages, and each
    ``from m import x`` as ``m.x`` too (``x`` may be a module, or a class a rule names)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    parts = (name.split(".") for name in found)
    return {".".join(p[: i + 1]) for p in parts for i in range(len(p))}


def _local_file(base: str, name: str) -> str | None:
    """The program's own module ``name`` under ``base`` (a file or a package), if there."""
    path = os.path.join(base, *name.split("."))
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _read(path: str) -> str | None:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def program_imports(entry_point: Mapping[str, Any], cwd: str) -> list[str]:
    """The modules the program of ``entry_point`` (``explain``'s form of it) imports from its
    entry script and its own modules beside it (at most ``MAX_FILES`` files); empty for a
    program whose source is not found (a console command, ``-c``)."""
    start, base = _start(entry_point, cwd)
    if start is None:
        return []
    seen_files, todo, names = {start}, [start], set()
    while todo and len(seen_files) <= MAX_FILES:
        text = _read(todo.pop())
        if text is None:
            continue
        try:
            found = names_in(text)
        except (SyntaxError, ValueError, RecursionError):
            continue
        names |= found
        for name in sorted(found):
            local = _local_file(base, name)
            if local is not None and local not in seen_files:
                seen_files.add(local)
                todo.append(local)
    return sorted(names)


def _start(entry_point: Mapping[str, Any], cwd: str) -> tuple[str | None, str]:
    """The entry file and the directory its own modules are imported from."""
    kind, target = entry_point.get("kind"), str(entry_point.get("target") or "")
    if kind == "script":
        path = str(entry_point.get("realpath") or entry_point.get("path") or target)
        path = path if os.path.isabs(path) else os.path.join(cwd, path)
        if os.path.isdir(path):  # python DIR: its __main__.py
            path = os.path.join(path, "__main__.py")
        return (path if os.path.isfile(path) else None), os.path.dirname(path)
    if kind == "module" and target:
        package = _local_file(cwd, target)
        main = os.path.join(cwd, *target.split("."), "__main__.py")
        return (main if os.path.isfile(main) else package), cwd
    return None, cwd
