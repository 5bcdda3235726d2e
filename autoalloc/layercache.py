"""Remember validated policy layers across processes, so an unchanged file is not parsed again.

Every process that imports torch reads the policy; parsing TOML in pure Python and validating
every rule costs more than the rest of the decision, and the files hardly ever change. This
cache keeps, per layer file, the validated result together with the exact bytes it came
from: a process still reads each file as before (the same checks on the same descriptor),
and uses the cached result only when the bytes are identical, so a stale entry cannot be
used whatever the file's time stamps say. It also keeps the answer of ``platformdirs`` for
the site and user config directories, keyed by everything that answer depends on.

As safe as the reading it replaces:

- stored in ``$XDG_CACHE_HOME/autoalloc`` (else ``~/.cache/autoalloc``), absolute paths only,
  on POSIX systems; the directory is created with mode 0700;
- an entry is used only when it and its directory are owned by this user and writable by
  nobody else, it is a regular file (not a link), and it unpickles with an unpickler that
  builds nothing but the policy's own record classes: a foreign, corrupt or tampered
  entry is ignored, silently;
- an entry is written to a temporary file in the same directory and renamed over the old
  one, so ranks writing at once each write a whole file and the last one wins;
- a read-only, missing or unusable cache directory means no cache, and no message.

Only the hook uses it (``enable()``, at ``import torch``): ``explain``, ``doctor``, ``check``
and other callers of the decision read the files as they are.

An entry is also keyed by the identity of autoalloc's modules that validate (so an upgrade
or an edit of the package starts afresh), the Python version and ``HOME`` (``~`` in patterns).
"""

from __future__ import annotations

import os
import pickle
import stat
import sys
import zlib
from collections.abc import Callable, Mapping

FORMAT = 1
MAX_BYTES = 64 << 20
_ALLOWED = frozenset(
    {
        ("autoalloc.policy", "LayerConfig"),
        ("autoalloc.policy", "Rule"),
        ("autoalloc.policy", "Source"),
        ("autoalloc.wrappers", "Wrapper"),
        ("autoalloc.globs", "RulePatterns"),
    }
)
# the modules whose code decides what a validated layer holds
_CODE = (
    "policy", "schema", "problems", "globs", "wrappers", "allocconf", "messages", "sources",
    "layercache", "records",
)


_ENABLED: list[bool] = []


def enable() -> None:
    """Use the cache in this process (the hook calls it before deciding)."""
    _ENABLED[:] = [True]


class _Unpickler(pickle.Unpickler):
    """Builds the policy's record classes and plain data, nothing else (no call, no import)."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not a policy record")
        return getattr(sys.modules[module], name)


def directory(env: Mapping[str, str] = os.environ) -> str | None:
    """The cache directory (None: no cache here, or not enabled in this process)."""
    if os.name != "posix" or not _ENABLED:
        return None
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = env.get("HOME", "")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "autoalloc")


_CODE_IDENTITY: list[tuple] = []


def _code_identity() -> tuple:
    """What identifies the validating code: the files of its modules, and the interpreter
    (once per process)."""
    if not _CODE_IDENTITY:
        _CODE_IDENTITY.append(_code_files())
    return _CODE_IDENTITY[0]


def _code_files() -> tuple:
    # By file, not by loaded module: a process that finds its layers here never imports the
    # validator (schema), and must still compute the identity the writing process did.
    out: list = [FORMAT, sys.implementation.cache_tag]
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _CODE:
        path = os.path.join(here, f"{name}.py")
        try:
            st = os.stat(path)
        except OSError:  # a source-less installation: no identity, no cache
            return ()
        out.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def _path(key: tuple) -> str | None:
    """The entry's file: named by what it is for, not by the code identity, so that a new
    version of autoalloc replaces its entries instead of adding to them."""
    where = directory()
    if where is None:
        return None
    digest = zlib.crc32(repr(key[:-1]).encode("utf-8", "surrogateescape"))
    return os.path.join(where, f"{key[0]}-{digest:08x}.pickle")


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _read(path: str) -> bytes | None:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    if not _private(os.stat(os.path.dirname(path))):
        return None
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > MAX_BYTES:
            return None
        chunks, size = [], 0
        while size <= st.st_size:
            chunk = os.read(fd, st.st_size + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _loads(blob: bytes) -> object:
    import io

    return _Unpickler(io.BytesIO(blob)).load()


# The entries this process restored, by file, with the bytes they came from: a later decision
# of the process (an import trigger, the first optimizer) reads the file again, as the first
# did, and unpickles it only if its bytes changed. The values are validated records, which
# nothing changes, as the layers validated in the process are shared (policy).
_RESTORED: dict[str, tuple[bytes, object]] = {}


def _restored(path: str, blob: bytes) -> object:
    known = _RESTORED.get(path)
    if known is not None and known[0] == blob:
        return known[1]
    stored = _loads(blob)
    if len(_RESTORED) >= 16:  # a process reading many projects' policies: stay small
        _RESTORED.clear()
    _RESTORED[path] = (blob, stored)
    return stored


def get(kind: str, key: tuple, data: object) -> object | None:
    """The value stored for ``key`` from exactly ``data``, or None (absent, stale, unusable)."""
    try:
        full = (kind, *key, _code_identity())
        path = _path(full)
        if path is None or not full[-1]:
            return None
        blob = _read(path)
        if blob is None:
            return None
        stored = _restored(path, blob)
        if not isinstance(stored, tuple) or len(stored) != 3:
            return None
        if stored[0] != full or stored[1] != data:
            return None
        return stored[2]
    except Exception:  # absent, unreadable, corrupt, foreign: no cache
        return None


def put(kind: str, key: tuple, data: object, value: object) -> None:
    """Store ``value`` for ``key`` and ``data``; silently nothing when it cannot be stored."""
    temp = None
    try:
        full = (kind, *key, _code_identity())
        path = _path(full)
        if path is None or not full[-1]:
            return
        blob = pickle.dumps((full, data, value), protocol=4)
        if len(blob) > MAX_BYTES or _loads(blob)[2] is None:  # only what `get` can read back
            return
        where = os.path.dirname(path)
        os.makedirs(where, mode=0o700, exist_ok=True)
        if not _private(os.stat(where)):
            return
        temp = f"{path}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(temp, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, path)
        temp = None
    except Exception:  # read-only, full, missing, raced: no cache
        pass
    finally:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass


_PACKAGES: dict[str, tuple] = {}


def _package_files(name: str) -> tuple:
    """The identity of an installed package's ``__init__.py`` and ``version.py`` (an upgrade
    rewrites them), found without importing it; looked up once per process (the site and the
    user config directories both depend on platformdirs)."""
    if name not in _PACKAGES:
        _PACKAGES[name] = _find_package_files(name)
    return _PACKAGES[name]


def _find_package_files(name: str) -> tuple:
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(name)
    origin = getattr(spec, "origin", None)
    if not origin or not os.path.isabs(origin):
        return ()
    out = []
    for path in (origin, os.path.join(os.path.dirname(origin), "version.py")):
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def config_dir(kind: str, locate: Callable[[], str]) -> str:
    """``locate()`` (platformdirs' answer for the ``kind`` config file), remembered by what it
    depends on: the environment variables it reads, the user, the platform and the
    installed platformdirs."""
    if directory() is None:
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
