"""The cache directory as ``autoalloc cache [--clear]`` and ``doctor`` show it: where it is,
whether the hook can use it and why not, what it holds; and emptying it.

It is ``$XDG_CACHE_HOME/autoalloc`` (else ``~/.cache/autoalloc``) on POSIX systems, opened
by ``privatedir`` (a directory of this user's alone); ``layercache`` keeps its entries there
and keeps it small. A read-only, missing or refused directory means no cache, and no message
in the hook: ``describe`` says why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from autoalloc import layercache, privatedir
from autoalloc.layercache import TEMP


def describe(env: Mapping[str, str] = os.environ) -> dict:
    """Where the cache is, whether the hook can use it (and why not), its entries and their
    bytes."""
    where = privatedir.cache_location(env)
    path = None if where is None else os.path.join(where[0], *where[1])
    out = {"path": path, "used": False, "reason": None, "entries": 0, "bytes": 0,
           "temporary": 0}  # fmt: skip
    try:
        fd = privatedir.open_cache_dir(create=False, env=env)
    except FileNotFoundError:
        if where is not None and not os.path.isdir(where[0]) and where[1][0] == ".cache":
            out["reason"] = f"{where[0]} does not exist (HOME is never made)"
        else:
            out.update(used=True, reason="not made yet: the next process to import torch makes it")
        return out
    except OSError as exc:
        is_refused = isinstance(exc, privatedir.Refused)
        out["reason"] = str(exc) if is_refused else f"{path}: {exc.strerror}"
        return out
    try:
        files = layercache.files(fd)
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
        fd = privatedir.open_cache_dir(create=False, env=env)
    except FileNotFoundError:
        return 0
    try:
        files = layercache.files(fd)
        for name, _ in files:
            layercache.unlink(name, fd)
    finally:
        os.close(fd)
    return len(files)
