"""autoalloc's cache directory as a whole: where it is, opened checked, kept small,
described and emptied (``autoalloc cache [--clear]``, ``doctor``).

It is ``$XDG_CACHE_HOME/autoalloc`` (else ``~/.cache/autoalloc``) on POSIX systems, reached
as ``privatedir`` reaches a directory of this user's. ``layercache`` keeps its entries there.
It stays small: a process that adds an entry removes temporary files older than
``STALE_SECONDS`` (a writer killed before its rename) and, past ``MAX_ENTRIES``, the least
recently used quarter of the entries. A read-only, missing or refused directory means no
cache, and no message in the hook: ``describe`` says where it is, what it holds, or why it
is not used.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from autoalloc import privatedir

MAX_ENTRIES = 128  # past this, a new entry evicts the least recently used quarter
STALE_SECONDS = 600  # a temporary file this old lost its writer (entries take milliseconds)
SUFFIX, TEMP = ".pickle", ".tmp"


def path(env: Mapping[str, str] = os.environ) -> str | None:
    """The cache directory's path (None: no cache on this system or without HOME)."""
    where = privatedir.cache_location(env)
    return None if where is None else os.path.join(where[0], *where[1])


def open_dir(create: bool, env: Mapping[str, str] = os.environ) -> int:
    """A descriptor of the cache directory, checked (``privatedir``); raises Refused, or
    OSError (missing when not ``create``, unreadable)."""
    where = privatedir.cache_location(env)
    if where is None:
        raise privatedir.Refused(
            "no cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path"
        )
    base, names = where
    return privatedir.open_checked(base, names, create, xdg=names == ("autoalloc",))


def unlink(name: str, where: int) -> None:
    try:
        os.unlink(name, dir_fd=where)
    except OSError:
        pass


def _files(where: int) -> list[tuple[str, os.stat_result]]:
    """The entries and temporary files of the directory ``where`` (nothing else in it)."""
    out = []
    for name in os.listdir(where):
        if name.endswith((SUFFIX, TEMP)):
            try:
                st = os.stat(name, dir_fd=where, follow_symlinks=False)
            except OSError:  # removed meanwhile
                continue
            if stat.S_ISREG(st.st_mode):
                out.append((name, st))
    return out


def tidy(where: int) -> None:
    """Remove stale temporary files and, past ``MAX_ENTRIES``, the least recently used
    entries (by access time where the file system keeps it, else by the time written)."""
    import time

    now = time.time()
    entries = []
    for name, st in _files(where):
        if not name.endswith(TEMP):
            entries.append((max(st.st_atime, st.st_mtime), name))
        elif now - st.st_mtime > STALE_SECONDS:
            unlink(name, where)
    if len(entries) > MAX_ENTRIES:
        entries.sort()
        for _, name in entries[: len(entries) - MAX_ENTRIES * 3 // 4]:
            unlink(name, where)


def describe(env: Mapping[str, str] = os.environ) -> dict:
    """Where the cache is, whether the hook can use it (and why not), its entries and their
    bytes."""
    where = privatedir.cache_location(env)
    out = {"path": path(env), "used": False, "reason": None, "entries": 0, "bytes": 0,
           "temporary": 0}  # fmt: skip
    try:
        fd = open_dir(create=False, env=env)
    except FileNotFoundError:
        if where is not None and not os.path.isdir(where[0]) and where[1][0] == ".cache":
            out["reason"] = f"{where[0]} does not exist (HOME is never made)"
        else:
            out.update(used=True, reason="not made yet: the next process to import torch makes it")
        return out
    except OSError as exc:
        is_refused = isinstance(exc, privatedir.Refused)
        out["reason"] = str(exc) if is_refused else f"{out['path']}: {exc.strerror}"
        return out
    try:
        files = _files(fd)
    finally:
        os.close(fd)
    out["used"] = True
    out["entries"] = sum(not name.endswith(TEMP) for name, _ in files)
    out["temporary"] = len(files) - out["entries"]
    out["bytes"] = sum(st.st_size for _, st in files)
    return out


def clear(env: Mapping[str, str] = os.environ) -> int:
    """Remove every entry and temporary file (nothing else); how many. Raises Refused or
    OSError where ``describe`` says it is not used."""
    try:
        fd = open_dir(create=False, env=env)
    except FileNotFoundError:
        return 0
    try:
        files = _files(fd)
        for name, _ in files:
            unlink(name, fd)
    finally:
        os.close(fd)
    return len(files)
