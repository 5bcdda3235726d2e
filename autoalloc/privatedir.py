"""Open, or make, a directory of this user's below ``XDG_CACHE_HOME`` or ``HOME``, never
writing where another user has a say (the layer cache's directory, ``ab``'s output).

The directory is reached from its base one name at a time: each must belong to this user
(the effective uid: root whose ``HOME`` is a user's, as under ``sudo -E``, is refused), a
symbolic link is followed only when it is this user's in a directory nobody else can write,
and the last one must be writable by nobody else. What is missing below the base is created
with mode 0700 whatever the umask; a missing ``XDG_CACHE_HOME`` is made too, ``HOME`` never
is. The caller then opens every file relative to the descriptor so checked, never by path.
POSIX only. Imports only what every Python process has loaded before ``site`` runs.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping

from autoalloc import safefile

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BASE_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_DIR_FLAGS = _BASE_FLAGS | getattr(os, "O_NOFOLLOW", 0)
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
# The directories this process checked name by name, by path: (device, inode). A later use
# opens the path and checks that it is that same directory, still private.
_CHECKED: dict[str, tuple[int, int]] = {}


class Refused(OSError):
    """The directory is not one this process may use; the text says why."""


def cache_location(env: Mapping[str, str] = os.environ) -> tuple[str, tuple[str, ...]] | None:
    """Where autoalloc's cache directory is: a base directory that must exist
    (``XDG_CACHE_HOME``, else ``HOME``) and the names below it; None without an absolute
    one, or off POSIX."""
    if os.name != "posix":
        return None
    base = env.get("XDG_CACHE_HOME", "")
    if os.path.isabs(base):
        return base, ("autoalloc",)
    home = env.get("HOME", "")
    return (home, (".cache", "autoalloc")) if os.path.isabs(home) else None


def open_cache_dir(create: bool, env: Mapping[str, str] = os.environ) -> int:
    """A descriptor of autoalloc's cache directory (``cache_location``), checked; raises
    Refused, or OSError (missing when not ``create``, unreadable)."""
    where = cache_location(env)
    if where is None:
        raise Refused("no cache directory: neither XDG_CACHE_HOME nor HOME is an absolute path")
    base, names = where
    return open_checked(base, names, create, xdg=names == ("autoalloc",))


def open_checked(base: str, names: tuple[str, ...], create: bool, xdg: bool) -> int:
    """A descriptor of ``base``/``names``, checked (see the module's docstring); ``xdg``:
    ``base`` is ``XDG_CACHE_HOME``, made when missing and ``create``. Raises Refused, or
    OSError (missing when not ``create``, unreadable)."""
    path = os.path.join(base, *names)
    known = _CHECKED.get(path)
    if known is not None:
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError:
            fd = -1
        if fd >= 0:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == known and safefile.is_private(st):
                return fd
            os.close(fd)
    fd = _walk_below(base, names, create, xdg)
    st = os.fstat(fd)
    _CHECKED[path] = (st.st_dev, st.st_ino)
    return fd


def make_private(path: str, env: Mapping[str, str] = os.environ) -> None:
    """Make ``path``, under ``XDG_CACHE_HOME`` or ``HOME``, through directories of this user
    only, what is missing with mode 0700. Raises Refused (outside both, or refused) or
    OSError."""
    for var in ("XDG_CACHE_HOME", "HOME"):
        base = env.get(var, "")
        if os.path.isabs(base) and path.startswith(base.rstrip("/") + "/"):
            names = tuple(n for n in os.path.relpath(path, base).split("/") if n)
            if ".." not in names:
                os.close(_walk_below(base, names, True, xdg=var == "XDG_CACHE_HOME"))
                return
    raise Refused(f"{path} is neither under XDG_CACHE_HOME nor under HOME")


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
