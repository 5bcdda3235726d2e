"""What autoalloc remembers across processes (``get``, ``put``): each policy layer validated,
by the exact bytes of its file (the built-in one also as released: ``released``), and
platformdirs' answer for the site and user config files.

Every process that imports torch reads the policy; parsing TOML in pure Python, validating
every rule and asking platformdirs cost more than the rest of the decision, and the answers
hardly ever change. A process still reads each file as before (the same checks on the same
descriptor) and uses the stored value only when the bytes are identical, so a stale entry
cannot be used whatever the file's time stamps say. An entry is used only when it unpickles
with an unpickler that builds nothing but the record classes its caller names (a foreign,
corrupt or tampered entry is ignored, silently; a rule's allocator values are checked again
where they are used: ``policy``). It is keyed by the identity of autoalloc's files (an
upgrade or an edit starts afresh) and the Python version, and named by what it is for and
where that code lies (two environments sharing a ``HOME`` keep one each, an upgrade replaces
its own). Where and how the files are kept: ``cachedir``. The hook enables it (``enable()``,
at ``import torch``); the commands read the policy files as they are.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from autoalloc import cachedir

FORMAT = 1
T = TypeVar("T")
_HERE = os.path.dirname(os.path.abspath(__file__))
_ENABLED: list[bool] = []
_CODE_IDENTITY: list[str] = []
_PLATFORMDIRS: list[tuple] = []  # the identity of the installed platformdirs' files
_PATHS: dict[tuple, tuple] = {}  # the site and user files, by config_path's key


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
        usable = isinstance(stored, tuple) and len(stored) == 3 and stored[:2] == (full, data)
        return stored[2] if usable else None
    except Exception:  # absent, unreadable, corrupt, foreign, refused: no cache
        return None


def put(kind: str, key: tuple, data: object, value: object) -> None:
    """Store ``value`` (plain data and records, as ``get`` reads back) for ``key`` and
    ``data``; silently nothing when it cannot be stored."""
    if not _ENABLED or not _code_identity() or value is None:
        return
    try:
        full = (kind, *key, _code_identity())
        cachedir.write(_name(full), pickle.dumps((full, data, value), protocol=4))
    except Exception:  # unpicklable, refused, read-only, full, raced: no cache
        pass


def released(data: bytes, build: Callable[..., T]) -> T | None:
    """The built-in rules validated for the release, by builtin.toml's bytes ``data``
    (builtin.json: what the schema's walk kept), made by ``build`` from the walked document:
    the first process parses no rules (a launcher's still parses wrappers.toml). None when
    made from other bytes (an edited builtin.toml), unreadable, or of a shape ``build`` does
    not take (the walk changed since builtin.json was made): the TOML is parsed then."""
    try:
        with open(os.path.join(_HERE, "builtin.json"), "rb") as f:
            twin = json.loads(f.read())
        made_from = twin["toml"] == [len(data), zlib.crc32(data)]
        return build(**_tuples(twin["walked"])) if made_from else None
    except Exception:  # anything wrong with the twin: the TOML is the truth
        return None


def _tuples(value: object) -> Any:
    """JSON's lists as the tuples the walk keeps (a list of strings at once: the most)."""
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if not isinstance(value, list):
        return value
    return tuple(value) if all(type(v) is str for v in value) else tuple(map(_tuples, value))


def config_path(layer: str) -> str | None:
    """The ``site`` or ``user`` config file: platformdirs' answer for both, remembered together
    by what it depends on: the environment variables it reads, the user, the platform and the
    installed platformdirs' files (looked up once per process, without importing it). None:
    in the hook, no file can be there (``_none_there``), and platformdirs is not asked."""
    if _none_there():
        return None
    key: tuple = ()
    try:
        names = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS")
        key = (*(os.environ.get(n) for n in names), os.getuid(), os.geteuid(), sys.platform,
               _platformdirs()) if _ENABLED else ()  # fmt: skip
    except Exception:  # no cache
        pass
    paths = _PATHS.get(key) or (get("config-dirs", key, None) if key and key[-1] else None)
    if not (isinstance(paths, tuple) and len(paths) == 2 and all(type(p) is str for p in paths)):
        import platformdirs

        found = (platformdirs.site_config_dir, platformdirs.user_config_dir)
        paths = tuple(os.path.join(where("autoalloc"), "config.toml") for where in found)
        if key and key[-1]:
            put("config-dirs", key, None, paths)
    if key:
        _PATHS[key] = paths
    return paths[layer == "user"]


def _none_there() -> bool:
    """In the hook on Linux, whether no ``autoalloc`` folder is in any XDG configuration
    directory, where platformdirs names both files (``test_layercache`` holds it to that).
    An empty or relative HOME: platformdirs takes the password database's, not looked at."""
    env, home = os.environ, os.environ.get("HOME", "/")
    if not _ENABLED or sys.platform != "linux" or "ANDROID_DATA" in env or not os.path.isabs(home):
        return False
    dirs = env.get("XDG_CONFIG_DIRS", "").split(":")
    bases = (env.get("XDG_CONFIG_HOME"), "~/.config", "/etc/xdg", *dirs)
    return not any(os.path.isdir(os.path.expanduser(f"{b}/autoalloc")) for b in bases if b)


def _platformdirs() -> tuple:
    """The identity of platformdirs' ``__init__.py`` and ``version.py`` (an upgrade rewrites
    them); () when it is not found."""
    if not _PLATFORMDIRS:
        from importlib.machinery import PathFinder

        origin = getattr(PathFinder.find_spec("platformdirs"), "origin", None) or ""
        paths = (origin, os.path.join(os.path.dirname(origin), "version.py"))
        found = []
        for path in paths if os.path.isabs(origin) else ():
            try:
                st = os.stat(path)
            except OSError:
                continue
            found.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
        _PLATFORMDIRS.append(tuple(found))
    return _PLATFORMDIRS[0]
