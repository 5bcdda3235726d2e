"""autoalloc's cache directory, and the files autoalloc writes in it: nothing else is touched.

``$XDG_CACHE_HOME/autoalloc`` (else ``~/.cache/autoalloc``) on POSIX systems, reached from its
base one name at a time: each directory must belong to this user (the effective uid: root
whose ``HOME`` is a user's, as under ``sudo -E``, is refused), a symbolic link is followed only
when it is this user's in a directory nobody else can write, and the last one must be
writable by nobody else. What is missing below the base is made 0700 whatever the umask (a
missing ``XDG_CACHE_HOME`` too, ``HOME`` never); files are opened relative to the checked
descriptor, never by path. The directory is autoalloc's when its ``CACHEDIR.TAG``
(https://bford.info/cachedir/) says it is a cache, or when it holds nothing but autoalloc's
files (it is then tagged); any other (a clone of some project there) is refused, and
``describe`` says why. A file is autoalloc's when named ``KIND-XXXXXXXX.pickle`` (an entry)
or ``NAME.PID.tmp`` (one being written) AND beginning with ``MAGIC``: only such files are
replaced, tidied away or cleared. ``layercache`` decides what is stored; ``ab`` and ``bench``
keep their runs in subdirectories. Imports only what every process has loaded before ``site``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping

from autoalloc import safefile

MAGIC = b"autoalloc-cache-entry\n"  # what each file autoalloc writes here begins with
TAG, SIGNATURE = "CACHEDIR.TAG", b"Signature: 8a477f597d28d172789f06886806bc55"
MAX_BYTES = 64 << 20
SUFFIX, TEMP = ".pickle", ".tmp"  # an entry, and one being written
MAX_ENTRIES = 128  # past this, a new entry evicts the least recently used quarter
STALE_SECONDS = 600  # a temporary file this old lost its writer (entries take milliseconds)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_BASE_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_DIR_FLAGS = _BASE_FLAGS | _NOFOLLOW
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class Refused(OSError):
    """The directory is not one this process may use; the text says why."""


def location(env: Mapping[str, str] = os.environ) -> tuple[str, tuple[str, ...]] | None:
    """A base directory that must exist (``XDG_CACHE_HOME``, else ``HOME``) and the names
    below it; None without an absolute one, or off POSIX."""
    if os.name != "posix":
        return None
    base = env.get("XDG_CACHE_HOME", "")
    if os.path.isabs(base):
        return base, ("autoalloc",)
    home = env.get("HOME", "")
    return (home, (".cache", "autoalloc")) if os.path.isabs(home) else None


def open_dir(create: bool, env: Mapping[str, str] = os.environ) -> int:
    """A descriptor of the cache directory, checked as the module says at each use (a few
    system calls); raises Refused, or OSError (missing when not ``create``, unreadable)."""
    where = location(env)
    if where is None:
        raise Refused("no cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path")
    base, names = where
    if create and names == ("autoalloc",) and not os.path.lexists(base):  # HOME is never made
        base, names = os.path.dirname(base), (os.path.basename(base), *names)
    fd = _owned(os.open(base, _BASE_FLAGS), base)  # HOME itself may be a link (/home -> ...)
    try:
        for i, name in enumerate(names):
            base = os.path.join(base, name)
            sub = _step(fd, name, base, create, private=i == len(names) - 1)
            os.close(fd)
            fd = sub
        _claim(fd, base)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _claim(fd: int, path: str) -> None:
    """Use the directory ``fd`` only when its ``CACHEDIR.TAG`` says it is a cache, or when it
    holds nothing but autoalloc's files (then tag it); else raise Refused."""
    try:
        if safefile.read(TAG, 4096, dir_fd=fd, nofollow=True)[0].startswith(SIGNATURE):
            return
    except OSError:  # absent, or not a file: look at what the directory holds
        pass
    others = sorted(name for name in os.listdir(fd) if _ours(name, fd) is None)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise Refused(f"{path} was not made by autoalloc (no {TAG}) and holds other files "
                      f"({shown}): no cache there; move them, or set XDG_CACHE_HOME elsewhere")
    try:
        _write_new(fd, TAG, SIGNATURE + b"\n# autoalloc's cache: https://bford.info/cachedir/\n")
    except OSError:  # another process tagged it meanwhile, a read-only disk: used as it is
        pass


def run_dir(kind: str, env: Mapping[str, str] = os.environ) -> str:
    """A new directory for one run of ``ab`` or ``bench`` (``kind``) when ``--out`` is not
    given, e.g. ``~/.cache/autoalloc/ab/20261201-153012-k2j4``: in the cache directory, made
    0700 and checked as it is; else in the temporary directory. Never inside the project."""
    import tempfile
    import time

    try:
        fd = open_dir(True, env)
        try:
            root, names = location(env) or ("", ())
            base = os.path.join(root, *names, kind)
            os.close(_step(fd, kind, base, True, private=True))
        finally:
            os.close(fd)
    except OSError:  # no cache directory of ours (HOME unreachable, another user's): /tmp
        base = tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base)


def _step(parent: int, name: str, where: str, create: bool, private: bool) -> int:
    """Open the directory ``name`` in ``parent`` (made if missing and ``create``); ``private``:
    it must be writable by nobody else."""
    try:
        fd = _owned(os.open(name, _DIR_FLAGS, dir_fd=parent), where)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=parent)  # 0700 whatever the umask (XDG)
        except FileExistsError:  # another process made it meanwhile
            pass
        fd = _owned(os.open(name, _DIR_FLAGS, dir_fd=parent), where)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EMLINK):  # EMLINK: a link, on FreeBSD
            raise
        # A symbolic link (~/.cache on a scratch disk): followed only when it is this user's,
        # in a directory nobody else can write, so that nobody else chooses where it points.
        link = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if link.st_uid != os.geteuid() or os.fstat(parent).st_mode & _OTHERS_WRITE:
            raise Refused(f"{where} is a symbolic link that another user may change") from None
        fd = _owned(os.open(name, _BASE_FLAGS, dir_fd=parent), where)
    mode = os.fstat(fd).st_mode
    if private and mode & _OTHERS_WRITE:
        os.close(fd)
        raise Refused(f"{where} is writable by others (mode {stat.S_IMODE(mode):04o}); "
                      f"`chmod go-w {where}` lets autoalloc use it")  # fmt: skip
    return fd


def _owned(fd: int, where: str) -> int:
    """``fd``, when what it opened belongs to this process's effective user (else closed)."""
    uid = os.fstat(fd).st_uid
    if uid != os.geteuid():
        os.close(fd)
        raise Refused(f"{where} belongs to uid {uid}, not to this user (uid {os.geteuid()})")
    return fd


# -- the files -------------------------------------------------------------------------------


def read(name: str) -> bytes:
    """What the entry ``name`` holds after ``MAGIC``, when it is a regular file of this user
    that nobody else can write; raises OSError or ValueError (not autoalloc's alone)."""
    fd = open_dir(create=False)
    try:
        data, st = safefile.read(name, MAX_BYTES, dir_fd=fd, nofollow=True)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid() or st.st_mode & _OTHERS_WRITE or not data.startswith(MAGIC):
        raise ValueError(f"{name} is not autoalloc's alone")
    return data[len(MAGIC) :]


def write(name: str, data: bytes) -> None:
    """The entry ``name`` holds ``data``, whole (written aside, renamed over), unless it is
    too large or a file of that name is not autoalloc's; a new entry tidies the directory
    when it is full or holds temporary files. Raises OSError."""
    if len(MAGIC) + len(data) > MAX_BYTES:
        return
    fd = open_dir(create=True)
    try:
        new = name not in (listed := os.listdir(fd))
        if not new and _ours(name, fd) is None:
            return  # someone else's file by that name: left as it is
        temp = f"{name}.{os.getpid()}{TEMP}"
        try:
            _write_new(fd, temp, MAGIC + data)
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            _unlink(temp, fd)
            raise
        if new and (len(listed) >= MAX_ENTRIES or any(n.endswith(TEMP) for n in listed)):
            _tidy(fd)  # rarely: only a new entry can take the room, or find another's leftovers
    finally:
        os.close(fd)


def _write_new(where: int, name: str, data: bytes) -> None:
    """A new file ``name`` (0600) in ``where`` holding ``data``; FileExistsError if present."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=where)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _unlink(name: str, where: int) -> None:
    try:
        os.unlink(name, dir_fd=where)
    except OSError:
        pass


def _ours(name: str, where: int) -> os.stat_result | None:
    """The status of ``name`` in ``where`` when it is autoalloc's: named as an entry or a
    temporary file, a regular file, beginning with ``MAGIC``."""
    import re  # only when listing: a new entry, a directory not tagged, describe, clear

    if not re.fullmatch(r"[a-z][a-z0-9-]*-[0-9a-f]{8}\.pickle(\.[0-9]+\.tmp)?", name):
        return None
    try:
        fd = os.open(name, safefile.OPEN_FLAGS | _NOFOLLOW, dir_fd=where)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return st if stat.S_ISREG(st.st_mode) and os.read(fd, len(MAGIC)) == MAGIC else None
    except OSError:
        return None
    finally:
        os.close(fd)


def files(where: int) -> list[tuple[str, os.stat_result]]:
    """autoalloc's entries and temporary files in the directory ``where``, nothing else."""
    found = ((name, _ours(name, where)) for name in os.listdir(where))
    return [(name, st) for name, st in found if st is not None]


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
            _unlink(name, where)
    if len(entries) > MAX_ENTRIES:
        entries.sort()
        for _, name in entries[: len(entries) - MAX_ENTRIES * 3 // 4]:
            _unlink(name, where)


def describe(env: Mapping[str, str] = os.environ) -> dict:
    """Where the cache is (``autoalloc cache``, ``doctor``), whether the hook can use it (and
    why not), its entries and their bytes."""
    where = location(env)
    path = None if where is None else os.path.join(where[0], *where[1])
    out = {"path": path, "used": False, "reason": None, "entries": 0, "bytes": 0,
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
        out["reason"] = str(exc) if isinstance(exc, Refused) else f"{path}: {exc.strerror}"
        return out
    try:
        found = files(fd)
    finally:
        os.close(fd)
    entries = sum(not name.endswith(TEMP) for name, _ in found)
    out.update(used=True, entries=entries, temporary=len(found) - entries,
               bytes=sum(st.st_size for _, st in found))  # fmt: skip
    return out


def clear(env: Mapping[str, str] = os.environ) -> int:
    """Remove autoalloc's entries and temporary files (nothing else); how many. Raises
    Refused or OSError where ``describe`` says it is not used."""
    try:
        fd = open_dir(create=False, env=env)
    except FileNotFoundError:
        return 0
    try:
        found = files(fd)
        for name, _ in found:
            _unlink(name, fd)
        return len(found)
    finally:
        os.close(fd)
