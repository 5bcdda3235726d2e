"""Remember validated policy layers across processes, so an unchanged file is not parsed again.

Every process that imports torch reads the policy; parsing TOML in pure Python and validating
every rule costs more than the rest of the decision, and the files hardly ever change. This
cache keeps, per layer file, the validated result together with the exact bytes it came
from: a process still reads each file as before (the same checks on the same descriptor),
and uses the cached result only when the bytes are identical, so a stale entry cannot be
used whatever the file's time stamps say. It also keeps the answer of ``platformdirs`` for
the site and user config directories, keyed by everything that answer depends on.

As safe as the reading it replaces, and it never writes where another user has a say:

- stored in ``$XDG_CACHE_HOME/autoalloc`` (else ``~/.cache/autoalloc``), on POSIX systems;
  the directory is reached from ``XDG_CACHE_HOME`` (or ``HOME``) one name at a time: each
  must belong to this user (effective uid: root whose ``HOME`` is a user's, as under
  ``sudo -E``, has no cache), a symbolic link is followed only when it is this user's in a
  directory nobody else can write, and the last one must be writable by nobody else. What
  is missing below them is created with mode 0700 (``HOME`` never is). Every file is then
  opened relative to the directory so checked, never by its path;
- an entry is used only when it is owned by this user and writable by nobody else, it is a
  regular file (not a link), and it unpickles with an unpickler that builds nothing but the
  policy's own record classes: a foreign, corrupt or tampered entry is ignored, silently
  (and the allocator values of a rule are checked again where they are used: ``policy``);
- an entry is written to a temporary file in the same directory and renamed over the old
  one, so ranks writing at once each write a whole file and the last one wins;
- it stays small: a process that adds an entry removes temporary files older than
  ``STALE_SECONDS`` (a writer killed before its rename) and, past ``MAX_ENTRIES``, the
  least recently used quarter of them;
- a read-only, missing or refused cache directory means no cache, and no message in the
  hook: ``autoalloc cache`` (``describe``) says where it is, what it holds, or why it is not
  used, and ``--clear`` empties it (``clear``).

Only the hook uses it (``enable()``, at ``import torch``): ``explain``, ``doctor``, ``check``
and other callers of the decision read the files as they are.

An entry is also keyed by the identity of autoalloc's modules that validate (so an upgrade
or an edit of the package starts afresh), the Python version and ``HOME`` (``~`` in
patterns); its file is named by what it is for and by where that code lies, so two
environments sharing a ``HOME`` keep an entry each, and an upgrade replaces its own.
"""

from __future__ import annotations

import errno
import os
import pickle
import stat
import sys
import zlib
from collections.abc import Callable, Mapping

FORMAT = 1
MAX_BYTES = 64 << 20
MAX_ENTRIES = 128  # past this, a new entry evicts the least recently used quarter
STALE_SECONDS = 600  # a temporary file this old lost its writer (entries take milliseconds)
SUFFIX, TEMP = ".pickle", ".tmp"
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
    "layercache", "records", "modulesets",
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


class Refused(OSError):
    """The cache directory is not one this process may use; the text says why."""


def location(env: Mapping[str, str] = os.environ) -> tuple[str, tuple[str, ...]] | None:
    """Where the cache directory is: a base directory that must exist (``XDG_CACHE_HOME``,
    else ``HOME``) and the names below it; None without an absolute one, or off POSIX."""
    if os.name != "posix":
        return None
    base = env.get("XDG_CACHE_HOME", "")
    if os.path.isabs(base):
        return base, ("autoalloc",)
    home = env.get("HOME", "")
    return (home, (".cache", "autoalloc")) if os.path.isabs(home) else None


def directory(env: Mapping[str, str] = os.environ) -> str | None:
    """The cache directory (None: no cache here, or not enabled in this process)."""
    where = location(env) if _ENABLED else None
    return None if where is None else os.path.join(where[0], *where[1])


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BASE_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_DIR_FLAGS = _BASE_FLAGS | getattr(os, "O_NOFOLLOW", 0)
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
# The directory this process checked name by name, by path: (device, inode). A later use
# opens the path and checks that it is that same directory, still private.
_CHECKED: dict[str, tuple[int, int]] = {}


def _open_dir(create: bool, env: Mapping[str, str] = os.environ) -> int:
    """A descriptor of the cache directory, checked (see the module's docstring); raises
    Refused, or OSError (missing when not ``create``, unreadable)."""
    where = location(env)
    if where is None:
        raise Refused("no cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path")
    path = os.path.join(where[0], *where[1])
    known = _CHECKED.get(path)
    if known is not None:
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError:
            fd = -1
        if fd >= 0:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == known and _private(st):
                return fd
            os.close(fd)
    base, names = where
    fd = _walk_below(base, names, create, xdg=names == ("autoalloc",))
    st = os.fstat(fd)
    _CHECKED[path] = (st.st_dev, st.st_ino)
    return fd


def _walk_below(base: str, names: tuple[str, ...], create: bool, xdg: bool) -> int:
    """``_walk``, where a missing ``base`` that is ``XDG_CACHE_HOME`` (``xdg``) is made as the
    rest is, mode 0700, when ``create`` (``HOME`` is never made)."""
    try:
        return _walk(base, names, create)
    except FileNotFoundError:
        parent = os.path.dirname(base)
        if not (create and xdg) or parent == base:
            raise
        return _walk(parent, (os.path.basename(base), *names), create)


def _walk(base: str, names: tuple[str, ...], create: bool) -> int:
    """Open ``base`` then each of ``names`` below it, each checked, creating what is missing
    (mode 0700) when ``create``; the last must be private. Returns its descriptor."""
    fd = _owned(os.open(base, _BASE_FLAGS), base)  # HOME itself may be a link (/home -> ...)
    where = base
    try:
        for name in names:
            where = os.path.join(where, name)
            sub = _step(fd, name, where, create)
            os.close(fd)
            fd = sub
        mode = os.fstat(fd).st_mode
        if mode & _OTHERS_WRITE:
            raise Refused(
                f"{where} is writable by others (mode {stat.S_IMODE(mode):04o}); "
                f"`chmod go-w {where}` lets autoalloc use it"
            )
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step(parent: int, name: str, where: str, create: bool) -> int:
    """Open the directory ``name`` in ``parent`` (made if missing and ``create``)."""
    try:
        return _owned(os.open(name, _DIR_FLAGS, dir_fd=parent), where)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=parent)  # 0700 whatever the umask (XDG)
        except FileExistsError:  # another process made it meanwhile
            pass
        return _owned(os.open(name, _DIR_FLAGS, dir_fd=parent), where)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EMLINK):  # EMLINK: a link, on FreeBSD
            raise
    # A symbolic link (~/.cache on a scratch disk): followed only when it is this user's,
    # in a directory nobody else can write, so that nobody else chooses where it points.
    link = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if link.st_uid != os.geteuid() or os.fstat(parent).st_mode & _OTHERS_WRITE:
        raise Refused(f"{where} is a symbolic link that another user may change")
    return _owned(os.open(name, _BASE_FLAGS, dir_fd=parent), where)


def _owned(fd: int, where: str) -> int:
    """``fd``, when what it opened belongs to this process's effective user (else closed)."""
    uid = os.fstat(fd).st_uid
    if uid != os.geteuid():
        os.close(fd)
        raise Refused(f"{where} belongs to uid {uid}, not to this user (uid {os.geteuid()})")
    return fd


def make_private(path: str, env: Mapping[str, str] = os.environ) -> None:
    """Make ``path``, under ``XDG_CACHE_HOME`` or ``HOME``, as the cache directory is made:
    through directories of this user only, what is missing with mode 0700 (``ab``'s default
    output). Raises Refused (outside both, or refused) or OSError."""
    for var in ("XDG_CACHE_HOME", "HOME"):
        base = env.get(var, "")
        if os.path.isabs(base) and path.startswith(base.rstrip("/") + "/"):
            names = tuple(n for n in os.path.relpath(path, base).split("/") if n)
            if ".." not in names:
                os.close(_walk_below(base, names, True, xdg=var == "XDG_CACHE_HOME"))
                return
    raise Refused(f"{path} is neither under XDG_CACHE_HOME nor under HOME")


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


_HERE = os.path.dirname(os.path.abspath(__file__))


def _name(key: tuple) -> str | None:
    """The entry's file name: by what it is for and where the code lies, not by the code's
    identity, so that a new version of autoalloc replaces its own entries instead of adding
    to them, and two environments sharing a HOME keep theirs."""
    if directory() is None:
        return None
    what = (key[:-1], _HERE, sys.implementation.cache_tag)
    digest = zlib.crc32(repr(what).encode("utf-8", "surrogateescape"))
    return f"{key[0]}-{digest:08x}{SUFFIX}"


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & _OTHERS_WRITE


def _read(name: str) -> bytes | None:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
    where = _open_dir(create=False)
    try:
        fd = os.open(name, flags, dir_fd=where)
    finally:
        os.close(where)
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
        name = _name(full)
        if name is None or not full[-1]:
            return None
        blob = _read(name)
        if blob is None:
            return None
        stored = _restored(name, blob)
        if not isinstance(stored, tuple) or len(stored) != 3:
            return None
        if stored[0] != full or stored[1] != data:
            return None
        return stored[2]
    except Exception:  # absent, unreadable, corrupt, foreign, refused: no cache
        return None


def put(kind: str, key: tuple, data: object, value: object) -> None:
    """Store ``value`` for ``key`` and ``data``; silently nothing when it cannot be stored."""
    try:
        full = (kind, *key, _code_identity())
        name = _name(full)
        if name is None or not full[-1]:
            return
        blob = pickle.dumps((full, data, value), protocol=4)
        if len(blob) > MAX_BYTES or _loads(blob)[2] is None:  # only what `get` can read back
            return
        where = _open_dir(create=True)
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
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=where)
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=where, dst_dir_fd=where)
    except BaseException:
        _unlink(temp, where)
        raise


def _unlink(name: str, where: int) -> None:
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


def _tidy(where: int) -> None:
    """Remove stale temporary files and, past ``MAX_ENTRIES``, the least recently used
    entries (by access time where the file system keeps it, else by the time written)."""
    import time

    now = time.time()
    entries = []
    for name, st in _files(where):
        if not name.endswith(TEMP):
            entries.append((max(st.st_atime, st.st_mtime), name))
        elif now - st.st_mtime > STALE_SECONDS:
            _unlink(name, where)
    if len(entries) > MAX_ENTRIES:
        entries.sort()
        for _, name in entries[: len(entries) - MAX_ENTRIES * 3 // 4]:
            _unlink(name, where)


def describe(env: Mapping[str, str] = os.environ) -> dict:
    """For ``autoalloc cache``: where the cache is, whether the hook can use it (and why
    not), its entries and their bytes."""
    where = location(env)
    path = None if where is None else os.path.join(where[0], *where[1])
    out = {"path": path, "used": False, "reason": None, "entries": 0, "bytes": 0, "temporary": 0}
    try:
        fd = _open_dir(create=False, env=env)
    except FileNotFoundError:
        if where is not None and not os.path.isdir(where[0]) and where[1][0] == ".cache":
            out["reason"] = f"{where[0]} does not exist (HOME is never made)"
        else:
            out.update(used=True, reason="not made yet: the next process to import torch makes it")
        return out
    except OSError as exc:
        out["reason"] = str(exc) if isinstance(exc, Refused) else f"{path}: {exc.strerror}"
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
        fd = _open_dir(create=False, env=env)
    except FileNotFoundError:
        return 0
    try:
        files = _files(fd)
        for name, _ in files:
            _unlink(name, fd)
    finally:
        os.close(fd)
    _RESTORED.clear()
    return len(files)


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
