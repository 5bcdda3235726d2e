"""Where the policy files are and which of them are read, in order; nothing here parses one.

Functions of paths, like pytest's ``findpaths``: the built-in files beside this module
(``wrappers.toml`` only for a command it may name: ``may_wrap``); the site and user files
where platformdirs says, as ``layercache`` remembers it (``config_file``); the project
search from the script's directory, else the working directory (``project_start``),
through ``PROJECT_FILES`` in each directory up to the root (``project_candidates``), an
``autoalloc.toml`` leaving the ``pyproject.toml`` beside it unread (``beside``); another
user's project file only below a trusted directory (``is_trusted``, like git's
``safe.directory``). The file system is looked at through the ``stat`` given (``os.stat``
by default); ``sources`` reads what is found.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import TRUSTED_DIRS_VAR
from autoalloc.policy import LayerConfig

# Project file names, in the order they are tried in each directory.
PROJECT_FILES = ("autoalloc.toml", "pyproject.toml")
PYPROJECT_OWN = (b"build-system", b"project", b"tool", b"dependency-groups")  # schema's
BUILTIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin.toml")
WRAPPERS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrappers.toml")
Stat = Callable[[str], os.stat_result]
Locate = Callable[[], "str | None"]  # a site or user file, or None: none can be there
Examined = Literal["present", "absent", "blocked"]


def project_start(entry: EntryPoint, cwd: str | None) -> str | None:
    """Where the project search starts: the script's directory, else the working directory."""
    if entry.kind == "script" and entry.path:
        return os.path.dirname(entry.path)
    return cwd


def ancestors(start: str) -> Iterator[str]:
    """``start`` and each parent up to the file-system root (nothing for a relative ``start``
    when the working directory is gone)."""
    try:
        current = os.path.abspath(start)
    except OSError:
        return
    while True:
        yield current
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def project_candidates(start: str | None) -> Iterator[str]:
    """The project files to try, nearest first: ``PROJECT_FILES`` in each of ``ancestors``."""
    for directory in ancestors(start) if start else ():
        for name in PROJECT_FILES:
            yield os.path.join(directory, name)


def off_pyproject(data: bytes) -> bool:
    """Whether a key stands before the first table, or a table not of pyproject.toml's own
    (``PYPROJECT_OWN``): where autoalloc's keys pasted without [tool.autoalloc] land."""
    lines = [line.strip() for line in data.splitlines() if line.strip()[:1] not in (b"", b"#")]
    tables = (line.strip(b"[ ").split(b"]")[0].split(b".")[0] for line in lines if line[:1] == b"[")
    first = lines[0][:1] if lines else b"["
    return first != b"[" or any(t.strip(b" \"'") not in PYPROJECT_OWN for t in tables)


def beside(path: str) -> str | None:
    """The ``pyproject.toml`` whose ``[tool.autoalloc]`` table an ``autoalloc.toml`` at
    ``path`` leaves unread (None: ``path`` is another file)."""
    if os.path.basename(path) != "autoalloc.toml":
        return None
    return os.path.join(os.path.dirname(path), "pyproject.toml")


def shadow_note(of_pyproject: bool = False) -> str:
    """What a run, ``explain`` and ``check`` say about a ``[tool.autoalloc]`` never read: in
    the autoalloc.toml's message (one file named per message), or in the pyproject.toml's."""
    whose = "Its" if of_pyproject else "The pyproject.toml beside it has a"
    return (
        f"{whose} [tool.autoalloc] table, which is ignored: autoalloc.toml in the same "
        "directory wins (move that table into autoalloc.toml, or delete autoalloc.toml)."
    )


def examine(path: str, stat: Stat | None = None) -> Examined:
    """``blocked`` when a permission on the way keeps ``path`` from being examined at all.

    ``stat`` needs only search permission on the directories above: a project candidate
    it cannot reach is not a broken file of the user's (the working directory may sit
    below a directory the user cannot read), so it is traced, not warned about. ``absent``
    lets the project search skip a candidate without opening it (it looks at two names in
    every directory up to the root, at every ``import torch``).
    """
    try:
        (stat or os.stat)(path)
    except PermissionError:
        return "blocked"
    except (FileNotFoundError, NotADirectoryError):
        return "absent"
    except (OSError, ValueError):
        pass  # another failure, which reading the file reports
    return "present"


def config_file(locate: Locate, stat: Stat | None = None) -> tuple[str | None, str]:
    """The site or user file that ``locate`` names (None: it says none can be there), and why
    no file of the user's can be there ("": one may be)."""
    try:
        path = locate()
    except Exception as exc:  # e.g. no HOME and no passwd entry: no such layer (explain shows why)
        return None, f"cannot locate: {exc}"
    if path is None:
        return None, ""
    if not os.path.isabs(path):
        # HOME unset for a uid without a passwd entry (containers): "~/.config/..." would be
        # read from the working directory, i.e. from whatever repository is there.
        return path, "not an absolute path (is HOME set?)"
    if examine(path, stat) == "blocked":
        # HOME or XDG_CONFIG_HOME below a directory this user cannot enter (`docker run
        # --user 1000` on an image whose HOME is /root): no file the user could have written.
        return path, "cannot be examined: a directory on the way is not searchable by this user"
    return path, ""


def trusted_dirs(env: Mapping[str, str], configs: Sequence[LayerConfig]) -> list[str]:
    """Directories whose project files are used even when another user owns them.

    From ``AUTOALLOC_TRUSTED_DIRS`` and the ``trusted_dirs`` of the user, site and
    ``AUTOALLOC_CONFIG`` files (a project file cannot set it). ``*`` trusts everything; a
    relative entry is ignored, since it would trust whatever the working directory is.
    """
    dirs = []
    for entry in [
        *env.get(TRUSTED_DIRS_VAR, "").split(os.pathsep),
        *(d for c in configs for d in c.trusted_dirs),
    ]:
        try:
            expanded = entry if entry == "*" else os.path.expanduser(entry)
        except Exception:
            continue
        if entry == "*" or (entry and os.path.isabs(expanded)):
            dirs.append(expanded)
    return dirs


def is_trusted(
    path: str, trusted: Sequence[str], st: os.stat_result | None = None, stat: Stat | None = None
) -> bool:
    """Whether a project file may be used: it (``st``: the ``fstat`` of what was read) and
    its directory are owned by this user or root, or it lies below a trusted directory."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # no ownership model to check against
        return True
    owners, stat = (geteuid(), 0), stat or os.stat
    try:
        owned = (st or stat(path)).st_uid in owners
        owned = owned and stat(os.path.dirname(path) or ".").st_uid in owners
    except (OSError, ValueError):
        owned = False
    if owned:
        return True
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    for entry in trusted:
        try:
            base = "" if entry == "*" else os.path.realpath(entry).rstrip(os.sep)
        except (OSError, ValueError):
            continue
        if entry == "*" or real == base or real.startswith(base + os.sep):
            return True
    return False


@functools.lru_cache(maxsize=1)
def _builtin_wrappers_text() -> str:
    try:
        with open(WRAPPERS_PATH, encoding="utf-8") as f:
            return f.read()
    except (OSError, ValueError):
        return ""


def may_wrap(entry: EntryPoint) -> bool:
    """Whether a built-in wrapper could be ``entry``: its module, command or file name is
    quoted in the table. Most programs are not wrappers, and reading the text is much
    cheaper than parsing the table, which ``builtin_wrappers()`` does only when this says so.

    Assumes what the schema does not require: wrappers.toml writes each module and command
    pattern as a literal in double quotes (``"name"``), and each script pattern's last
    segment too (``"name"``, ``".../name"``); a glob there would never be found, and its
    wrapper never taken off (``test_wrappers`` checks the table)."""
    if entry.kind in ("module", "command"):
        name = entry.target
    elif entry.kind == "script":
        name = os.path.basename(entry.path.rstrip("/"))
    else:
        return False
    text = _builtin_wrappers_text()
    return bool(name) and (f'"{name}"' in text or f'/{name}"' in text)
