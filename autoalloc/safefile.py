"""Read a file that anyone may have put there: a regular file, whole, without blocking.

The one careful reader of autoalloc (policy layers, the layer cache's entries, torch's
``version.py``, ``ab``'s reports). The path is checked before it is opened, so that no FIFO
or device is ever opened; it is opened without blocking and without becoming a controlling
terminal; the open descriptor is checked again (a file swapped in between is seen); and at
most ``limit + 1`` bytes are read whatever the file claims, so that a file growing under the
reader is refused rather than cut. It imports only ``os`` and ``stat``, which every Python
process has loaded before ``site`` runs.
"""

from __future__ import annotations

import os
import stat

OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO without a writer: opens at once, never hangs
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class NotRegular(OSError):
    """Not a regular file (``mode``: what it is)."""

    def __init__(self, mode: int) -> None:
        super().__init__("a directory, not a file" if stat.S_ISDIR(mode) else "not a regular file")
        self.mode = mode


class TooLarge(OSError):
    """More than the reader's limit."""


def _check(st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(st.st_mode)
    if st.st_size > limit:
        raise TooLarge(f"larger than {limit} bytes")


def read(
    path: str,
    limit: int,
    *,
    dir_fd: int | None = None,
    nofollow: bool = False,
) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` (relative to ``dir_fd`` when given) and the
    ``fstat`` of what was read. ``nofollow``: a symbolic link is refused (``OSError``).

    Raises NotRegular, TooLarge, or the ``OSError`` of the ``stat``, ``open`` or ``read``
    (``FileNotFoundError`` when absent); ``ValueError`` for a path with a NUL character.
    """
    _check(os.stat(path, dir_fd=dir_fd, follow_symlinks=not nofollow), limit)
    fd = os.open(path, OPEN_FLAGS | (_NOFOLLOW if nofollow else 0), dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        _check(st, limit)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise TooLarge(f"larger than {limit} bytes")
    return b"".join(chunks), st
