"""What autoalloc remembers across processes: validated policy layers, so that an unchanged
file is not parsed again, and platformdirs' answer for the site and user config files.

Every process that imports torch reads the policy; parsing TOML in pure Python and validating
every rule costs more than the rest of the decision, and the files hardly ever change; so
does importing platformdirs and asking it where the config files are. This module keeps,
per layer file, the validated result together with the exact bytes it came from: a process
still reads each file as before (the same checks on the same descriptor), and uses the
cached result only when the bytes are identical, so a stale entry cannot be used whatever
the file's time stamps say. ``get`` and ``put`` serve any kind of value (``kind`` names it).

Where and how entries are kept is ``cachedir``'s (a directory of this user's alone, entries
written aside and renamed over, kept small, only autoalloc's own files touched). What this
module adds: an entry is used only when it unpickles with an unpickler that builds nothing
but the record classes its caller names (a foreign, corrupt or tampered entry is ignored,
silently, and the allocator values of a rule are checked again where they are used:
``policy``), and only when it was written by the same code for the same key.

The hook enables it (``enable()``, at ``import torch``); ``explain``, ``check`` and the other
commands read the files as they are. An entry is also keyed by the identity of autoalloc's
files (so an upgrade or an edit of the package starts afresh) and the Python version; its
file is named by what it is for and by where that code lies, so two environments sharing a
``HOME`` keep an entry each, and an upgrade replaces its own.
"""

from __future__ import annotations

import os
import pickle
import sys
import zlib
from collections.abc import Callable

from autoalloc import cachedir

FORMAT = 1
_HERE = os.path.dirname(os.path.abspath(__file__))
_ENABLED: list[bool] = []
_CODE_IDENTITY: list[str] = []
_PACKAGES: dict[str, tuple] = {}


def enable() -> None:
    """Use the cache in this process (the hook calls it before deciding)."""
    _ENABLED[:] = [True]


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
    return f"{key[0]}-{digest:08x}{cachedir.SUFFIX}"


def get(kind: str, key: tuple, data: object, records: tuple[type, ...] = ()) -> object | None:
    """The value stored for ``key`` from exactly ``data``, or None (absent, stale, unusable).
    ``records``: the classes the value may hold, besides plain data."""
    if not _ENABLED or not _code_identity():
        return None
    try:
        full = (kind, *key, _code_identity())
        stored = _loads(cachedir.read(_name(full)), records)
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
        blob = pickle.dumps((full, data, value), protocol=4)
        if _loads(blob, records)[2] is not None:  # only what `get` reads back
            cachedir.write(_name(full), blob)
    except Exception:  # unpicklable, refused, read-only, full, raced: no cache
        pass


def site_path() -> str:
    return _remembered("site", _site_path)


def user_path() -> str:
    return _remembered("user", _user_path)


def _site_path() -> str:
    import platformdirs

    return os.path.join(platformdirs.site_config_dir("autoalloc"), "config.toml")


def _user_path() -> str:
    import platformdirs

    return os.path.join(platformdirs.user_config_dir("autoalloc"), "config.toml")


def _remembered(kind: str, locate: Callable[[], str]) -> str:
    """``locate()``, remembered by what it depends on: the environment variables it reads,
    the user, the platform and the installed platformdirs (whose import and answer cost
    more, in every process that imports torch, than reading the answer back)."""
    if not _ENABLED:
        return locate()
    env = os.environ
    try:
        names = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS")
        key = (*(env.get(n) for n in names), os.getuid(), os.geteuid(), sys.platform,
               _package_files("platformdirs"))  # fmt: skip
    except Exception:
        return locate()
    hit = get(f"{kind}-dir", key, None)
    if isinstance(hit, str):
        return hit
    path = locate()
    if key[-1]:
        put(f"{kind}-dir", key, None, path)
    return path


def _package_files(name: str) -> tuple:
    """The identity of an installed package's ``__init__.py`` and ``version.py`` (an upgrade
    rewrites them), found without importing it; looked up once per process (the site and
    the user config directories both depend on platformdirs)."""
    if name not in _PACKAGES:
        from importlib.machinery import PathFinder

        origin = getattr(PathFinder.find_spec(name), "origin", None)
        found = []
        if origin and os.path.isabs(origin):
            for path in (origin, os.path.join(os.path.dirname(origin), "version.py")):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                found.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
        _PACKAGES[name] = tuple(found)
    return _PACKAGES[name]
