"""Remember validated policy layers across processes, so an unchanged file is not parsed again.

Every process that imports torch reads the policy; parsing TOML in pure Python and validating
every rule costs more than the rest of the decision, and the files hardly ever change. This
cache keeps, per layer file, the validated result together with the exact bytes it came
from: a process still reads each file as before (the same checks on the same descriptor),
and uses the cached result only when the bytes are identical, so a stale entry cannot be
used whatever the file's time stamps say. ``configdirs`` keeps platformdirs' answers here too.

As safe as the reading it replaces, and it never writes where another user has a say:

- the entries live in the cache directory ``privatedir`` opens (this user's alone), each
  opened relative to it, never by path (``cachedir`` shows it and clears it);
- an entry is used only when it is owned by this user and writable by nobody else, a regular
  file (not a link), and it unpickles with an unpickler that builds nothing but the record
  classes its caller names: a foreign, corrupt or tampered entry is ignored, silently (and
  the allocator values of a rule are checked again where they are used: ``policy``);
- an entry is written to a temporary file in the same directory and renamed over the old
  one, so ranks writing at once each write a whole file and the last one wins;
- it stays small: a process that adds an entry removes temporary files older than
  ``STALE_SECONDS`` (a writer killed before its rename) and, past ``MAX_ENTRIES``, the least
  recently used quarter of the entries.

The hook enables it (``enable()``, at ``import torch``); ``explain``, ``check`` and the other
commands read the files as they are. An entry is also keyed by the identity of autoalloc's
files (so an upgrade or an edit of the package starts afresh) and the Python version; its
file is named by what it is for and by where that code lies, so two environments sharing a
``HOME`` keep an entry each, and an upgrade replaces its own.
"""

from __future__ import annotations

import os
import pickle
import stat
import sys
import zlib

from autoalloc import privatedir, safefile

FORMAT = 1
MAX_BYTES = 64 << 20
SUFFIX, TEMP = ".pickle", ".tmp"  # an entry, and one being written
MAX_ENTRIES = 128  # past this, a new entry evicts the least recently used quarter
STALE_SECONDS = 600  # a temporary file this old lost its writer (entries take milliseconds)
_HERE = os.path.dirname(os.path.abspath(__file__))
_ENABLED: list[bool] = []
_CODE_IDENTITY: list[str] = []


def enable() -> None:
    """Use the cache in this process (the hook calls it before deciding)."""
    _ENABLED[:] = [True]


def enabled() -> bool:
    return bool(_ENABLED)


class _Unpickler(pickle.Unpickler):
    """Builds the caller's record classes and plain data, nothing else (no call, no import)."""

    def __init__(self, blob: bytes, records: tuple[type, ...]) -> None:
        import io

        super().__init__(io.BytesIO(blob))
        self.records = {(cls.__module__, cls.__qualname__): cls for cls in records}

    def find_class(self, module: str, name: str) -> object:
        found = self.records.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not a policy record")
        return found


def _loads(blob: bytes, records: tuple[type, ...] = ()) -> object:
    return _Unpickler(blob, records).load()


def _code_identity() -> str:
    """A 64-bit digest of the code that writes entries: every module file of the package
    (not the loaded modules: a process that finds its layers here never imports the
    validator) and the interpreter; "" when it cannot be told. Data files need not count:
    an entry is keyed by the bytes of the file it was made from."""
    if not _CODE_IDENTITY:
        out: list = [FORMAT, sys.implementation.cache_tag]
        try:  # in the directory's own order: the same for the same files, else a miss
            with os.scandir(_HERE) as entries:
                for entry in entries:
                    if entry.name.endswith(".py"):
                        st = entry.stat()
                        out.append((entry.name, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:  # an unreadable installation: no identity, no cache
            out = []
        text = repr(out).encode("utf-8", "surrogateescape")
        _CODE_IDENTITY.append(f"{zlib.crc32(text):08x}{zlib.adler32(text):08x}" if out else "")
    return _CODE_IDENTITY[0]


def _name(key: tuple) -> str:
    """The entry's file name: by what it is for and where the code lies, not by the code's
    identity, so that a new version of autoalloc replaces its own entries instead of adding
    to them, and two environments sharing a HOME keep theirs."""
    what = (key[:-1], _HERE, sys.implementation.cache_tag)
    digest = zlib.crc32(repr(what).encode("utf-8", "surrogateescape"))
    return f"{key[0]}-{digest:08x}{SUFFIX}"


def _read(name: str) -> bytes:
    where = privatedir.open_cache_dir(create=False)
    try:
        return safefile.read(name, MAX_BYTES, dir_fd=where, nofollow=True, private=True)[0]
    finally:
        os.close(where)


def get(kind: str, key: tuple, data: object, records: tuple[type, ...] = ()) -> object | None:
    """The value stored for ``key`` from exactly ``data``, or None (absent, stale, unusable).
    ``records``: the classes the value may hold, besides plain data."""
    if not _ENABLED or not _code_identity():
        return None
    try:
        full = (kind, *key, _code_identity())
        stored = _loads(_read(_name(full)), records)
        if not isinstance(stored, tuple) or len(stored) != 3:
            return None
        if stored[0] != full or stored[1] != data:
            return None
        return stored[2]
    except Exception:  # absent, unreadable, corrupt, foreign, refused: no cache
        return None


def put(kind: str, key: tuple, data: object, value: object, records: tuple[type, ...] = ()) -> None:
    """Store ``value`` for ``key`` and ``data``; silently nothing when it cannot be stored."""
    if not _ENABLED or not _code_identity():
        return
    try:
        full = (kind, *key, _code_identity())
        name = _name(full)
        blob = pickle.dumps((full, data, value), protocol=4)
        if len(blob) > MAX_BYTES or _loads(blob, records)[2] is None:  # what `get` reads back
            return
        where = privatedir.open_cache_dir(create=True)
    except Exception:  # unpicklable, refused, read-only, missing: no cache
        return
    try:
        new = not _exists(name, where)
        _write(where, name, blob)
        if new:  # rarely: the first process for a project, a HOME, an upgrade
            _tidy(where)
    except Exception:  # full, raced: no cache
        pass
    finally:
        os.close(where)


def _exists(name: str, where: int) -> bool:
    try:
        os.stat(name, dir_fd=where, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write(where: int, name: str, blob: bytes) -> None:
    """``name`` in the directory ``where`` holds ``blob``, whole (written aside, renamed)."""
    temp = f"{name}.{os.getpid()}{TEMP}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temp, flags | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=where)
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=where, dst_dir_fd=where)
    except BaseException:
        unlink(temp, where)
        raise


def unlink(name: str, where: int) -> None:
    try:
        os.unlink(name, dir_fd=where)
    except OSError:
        pass


def files(where: int) -> list[tuple[str, os.stat_result]]:
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


def _tidy(where: int) -> None:
    """Remove stale temporary files and, past ``MAX_ENTRIES``, the least recently used
    entries (by access time where the file system keeps it, else by the time written)."""
    import time

    now = time.time()
    entries = []
    for name, st in files(where):
        if not name.endswith(TEMP):
            entries.append((max(st.st_atime, st.st_mtime), name))
        elif now - st.st_mtime > STALE_SECONDS:
            unlink(name, where)
    if len(entries) > MAX_ENTRIES:
        entries.sort()
        for _, name in entries[: len(entries) - MAX_ENTRIES * 3 // 4]:
            unlink(name, where)
