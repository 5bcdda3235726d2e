"""How autoalloc speaks: ``AutoallocWarning`` for what to fix, ``AUTOALLOC_DEBUG`` traces.

Warnings point at the user's code (the ``import torch`` line, the setter call), never at
autoalloc's or importlib's frames, and never raise into the host program, even under
``-W error``.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections.abc import Iterable

from autoalloc.envvars import DEBUG_VAR, WARNED_VAR, global_rank, node_speaker, truthy

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class AutoallocWarning(Warning):
    """A warning from autoalloc; filter with ``-W ignore:autoalloc`` (by message).

    Not a ``UserWarning``: training jobs often run with ``-W ignore::UserWarning`` (or the same
    in ``PYTHONWARNINGS``) to quiet their libraries, and a broken policy file or a conflict
    with the user's own allocator settings, said once per job, must not vanish with them.
    """


def closest(word: object, choices: Iterable[str]) -> str | None:
    """The one of ``choices`` closest to ``word`` (a likely typo of it), or None."""
    if not isinstance(word, str):
        return None
    import difflib  # only when there is a mistake to report

    return next(iter(difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)), None)


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """`` — did you mean 'x'?`` for the closest of ``choices`` to ``word``, or ``""``."""
    return meaning(closest(word, choices))


def meaning(meant: str | None) -> str:
    """`` — did you mean 'x'?`` for ``meant`` found by ``closest``, or ``""`` for None."""
    return f" \N{EM DASH} did you mean {meant!r}?" if meant else ""


def debug_enabled() -> bool:
    return truthy(os.environ.get(DEBUG_VAR))


def printable(text: str) -> str:
    """``text`` on one line, with every character that is not printable escaped.

    Messages name files, keys and directories that come from any cloned repository: a
    newline, a terminal escape sequence or a bidi override there must not reach the
    terminal as such.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def debug(message: str) -> None:
    """One line to stderr when ``AUTOALLOC_DEBUG`` is on."""
    if debug_enabled():
        say(message)


def say(message: str) -> None:
    """One line to stderr, printable (a closed or broken stderr: nothing)."""
    try:
        sys.stderr.write(f"autoalloc: {printable(message)}\n")
        sys.stderr.flush()
    except Exception:
        pass


_IMPORTLIB_DIR = os.path.dirname(getattr(importlib, "__file__", None) or "<no importlib file>")


def _is_internal(filename: str) -> bool:
    # the start-up modules also ship top-level, beside the package
    return filename.startswith(
        ("<frozen importlib", PACKAGE_DIR + os.sep, _IMPORTLIB_DIR + os.sep)
    ) or os.path.basename(filename) in ("_autoalloc_startup.py", "_autoalloc_loader.py")


def user_frame(skip: tuple[str, ...] = ()) -> tuple[int, str]:
    """The first frame above our caller that is the user's: the ``stacklevel`` that makes a
    ``warnings.warn`` in our caller land on it, and its ``file:line``.

    autoalloc's and importlib's frames are never the user's; ``skip`` names more: directories
    (ending in a path separator, e.g. torch's) and file names (a ``@deprecated`` wrapper's).
    """
    dirs = tuple(s for s in skip if s.endswith(os.sep))
    names = {s for s in skip if not s.endswith(os.sep)}
    frame = sys._getframe(1)
    level = 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not (_is_internal(name) or name.startswith(dirs) or os.path.basename(name) in names):
            return level, f"{name}:{frame.f_lineno}"
        frame = frame.f_back
        name = frame.f_code.co_filename if frame else ""
        if not ("importlib" in name and "_bootstrap" in name):  # not counted by warnings.warn
            level += 1
    return 1, "<unknown>"


_OWN_CATEGORIES = ("autoalloc.AutoallocWarning", "autoalloc.messages.AutoallocWarning")
_options_applied = False


def apply_warnoptions() -> None:
    """Honour ``-W``/``PYTHONWARNINGS`` options that name ``AutoallocWarning`` (once).

    Python parses those options before site-packages is on ``sys.path``, so it cannot
    import the category and drops such an option ("Invalid -W option ignored"); applied
    now, they filter our warnings as the user meant. ``-W ignore:autoalloc`` (by message)
    needs no import and works from the start.
    """
    global _options_applied
    if _options_applied:
        return
    _options_applied = True
    for option in getattr(sys, "warnoptions", None) or ():
        try:
            if [part.strip() for part in option.split(":")][2] in _OWN_CATEGORIES:
                warnings._setoption(option)  # type: ignore[attr-defined]
        except Exception:
            pass


def not_yet_said(messages: list[str], mark: bool = True) -> list[str]:
    """The messages no process of this job has warned about yet; marks them as said (unless
    ``mark`` is False: a multi-node agent leaves them to its workers).

    ``AUTOALLOC_WARNED`` carries a short digest of each warning to child processes, so a
    bad policy file or a conflict is reported once per job, not once per worker.
    """
    import zlib

    said = os.environ.get(WARNED_VAR, "").split(",")
    fresh = []
    for message in messages:
        digest = format(zlib.crc32(message.encode("utf-8", "surrogateescape")), "08x")
        if digest not in said:
            said.append(digest)
            fresh.append(message)
    if fresh and mark:
        os.environ[WARNED_VAR] = ",".join(d for d in said if d)
    return fresh


def warn(
    message: str, stacklevel: int | None = None, skip: tuple[str, ...] = (), node: bool = False
) -> None:
    """Emit one ``AutoallocWarning`` whose text starts with ``autoalloc:`` (on global rank 0).

    ``node``: a warning from what this node reads for itself (its environment, its policy
    files, its torch), which global rank 0, on another node, cannot see: the first process of
    each further node says it too, naming its node.
    """
    try:
        # Every rank of a job that a launcher started on its own (srun, mpirun, torchrun)
        # decides the same, so only global rank 0 speaks, as distributed trainers do.
        rank = global_rank()
        speaker = node_speaker() if rank and node else None
        if rank and speaker is None:
            debug(f"rank {rank}, not warning (rank 0 does): {message}")
            return
        apply_warnoptions()
        message = printable(message)
        if not message.startswith("autoalloc:"):
            message = f"autoalloc: {message}"
        if speaker is not None:
            host = printable(os.uname().nodename if hasattr(os, "uname") else "?")
            rest = message[len("autoalloc:"):].lstrip()
            message = f"autoalloc: on node {speaker} ({host}) of this job: {rest}"
        level = user_frame(skip)[0] if stacklevel is None else stacklevel + 1
        warnings.warn(message, AutoallocWarning, stacklevel=level)
    except Exception:  # `-W error` must not turn our advice into the host's crash
        pass


SHORT = 60  # characters of a user's value a message quotes


def shortened(value: object, limit: int = SHORT) -> str:
    """``value`` quoted for a message, as ``repr`` does, but short whatever its size.

    Policy keys, environment values and paths come from the user or from any repository: a
    900 KB key must not become a 1.8 MB warning. A longer string keeps its first ``limit``
    characters and says how long it was.
    """
    if isinstance(value, str) and len(value) > limit:
        return printable(repr(value[:limit])[:-1] + "...'") + f" ({len(value)} characters)"
    text = repr(value)
    if len(text) > limit + 2:
        text = text[: limit - 1] + "..."
    return printable(text)
