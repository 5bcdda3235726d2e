"""Find and read the policy layers: built-in < site < user < project < ``AUTOALLOC_CONFIG``.

Discovery is small functions of paths (like pytest's ``findpaths``); reading is careful,
because a project file can come from any cloned repository: regular files only (a FIFO
would block, a device could do anything), opened without blocking and checked again on
the open descriptor, at most ``MAX_BYTES`` read, and a project file is used only when it
and its directory are owned by this user or root (like git's ``safe.directory``) unless it
is below a trusted directory. Any failure becomes a layer status with a message instead
of an exception.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence

from autoalloc.entrypoint import EntryPoint
from autoalloc.policy import LayerConfig, LayerStatus, Policy, PolicyError, Source, compose, validate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older interpreters in CI
    import tomli as tomllib

MAX_BYTES = 1 << 20
PROJECT_FILES = ("autoalloc.toml", "pyproject.toml")
BUILTIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin.toml")


class LayerError(Exception):
    """A layer file that exists but cannot be used."""


def site_path() -> str:
    import platformdirs

    return os.path.join(platformdirs.site_config_dir("autoalloc"), "config.toml")


def user_path() -> str:
    import platformdirs

    return os.path.join(platformdirs.user_config_dir("autoalloc"), "config.toml")


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


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def _check_regular(st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise LayerError("is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise LayerError("is not a regular file")
    if st.st_size > MAX_BYTES:
        raise LayerError(f"is larger than {MAX_BYTES // 1024} KiB")


def read_file(path: str) -> tuple[bytes, os.stat_result]:
    """A policy file's bytes and the ``fstat`` of what was read.

    Raises FileNotFoundError when absent (or a parent is not a directory), LayerError
    when unusable. The path is checked before opening (no FIFO or device is ever opened)
    and the descriptor again after (the file cannot be swapped in between); at most
    ``MAX_BYTES + 1`` bytes are read, whatever the file claims.
    """
    try:
        _check_regular(os.stat(path))
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except OSError as exc:
        raise LayerError(f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # an embedded NUL in the path
        raise LayerError(f"cannot read: {exc}") from None
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except OSError as exc:
        raise LayerError(f"cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        _check_regular(st)
        chunks = []
        size = 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise LayerError(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise LayerError(f"is larger than {MAX_BYTES // 1024} KiB")
    return b"".join(chunks), st


def read_bytes(path: str) -> bytes:
    """A policy file's bytes; raises FileNotFoundError when absent, LayerError when unusable."""
    return read_file(path)[0]


def parse_toml(data: bytes) -> dict:
    """TOML from bytes; a UTF-8 BOM is tolerated. Raises LayerError."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LayerError(f"is not UTF-8 (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LayerError(f"is not valid TOML: {exc}") from None
    except RecursionError:
        raise LayerError("is not valid TOML: nested too deeply") from None
    except Exception as exc:  # e.g. ValueError for an integer of more than 4300 digits
        raise LayerError(f"is not valid TOML: {type(exc).__name__}: {exc}") from None


def policy_table(path: str, data: bytes) -> dict | None:
    """The autoalloc table of a file: the whole document, or ``[tool.autoalloc]`` of a pyproject.toml."""
    if os.path.basename(path) != "pyproject.toml":
        return parse_toml(data)
    if b"autoalloc" not in data:  # cheap pre-check: most pyproject.toml files are not ours
        return None
    tool = parse_toml(data).get("tool")
    if not isinstance(tool, dict) or "autoalloc" not in tool:
        return None
    return tool["autoalloc"]


def trusted_dirs(env: Mapping[str, str], configs: Sequence[LayerConfig]) -> list[str]:
    """Directories whose project files are used even when another user owns them.

    From ``AUTOALLOC_TRUSTED_DIRS`` and the ``trusted_dirs`` of the user, site and
    ``AUTOALLOC_CONFIG`` files (a project file cannot set it). ``*`` trusts everything; a
    relative entry is ignored, since it would trust whatever the working directory is.
    """
    dirs = []
    for entry in [*env.get("AUTOALLOC_TRUSTED_DIRS", "").split(os.pathsep), *(d for c in configs for d in c.trusted_dirs)]:
        if entry == "*":
            dirs.append(entry)
            continue
        try:
            expanded = os.path.expanduser(entry)
        except Exception:
            continue
        if entry and os.path.isabs(expanded):
            dirs.append(expanded)
    return dirs


def _owned(st: os.stat_result, euid: int) -> bool:
    return st.st_uid in (euid, 0)


def is_trusted(path: str, trusted: Sequence[str], st: os.stat_result | None = None) -> bool:
    """Whether a project file may be used: it (``st``: the ``fstat`` of what was read) and
    its directory are owned by this user or root, or it lies below a trusted directory."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # no ownership model to check against
        return True
    euid = geteuid()
    try:
        owned = _owned(st if st is not None else os.stat(path), euid) and _owned(os.stat(os.path.dirname(path) or "."), euid)
    except (OSError, ValueError):
        owned = False
    if owned:
        return True
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    for entry in trusted:
        if entry == "*":
            return True
        try:
            base = os.path.realpath(entry)
        except (OSError, ValueError):
            continue
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


_UNTRUSTED = (
    "it or its directory is owned by another user; ignored "
    "(trust it with AUTOALLOC_TRUSTED_DIRS or trusted_dirs in your user config)"
)


def _find(start: str | None, trusted: Sequence[str] | None) -> tuple[str, dict | None, str, str] | None:
    """The nearest project policy: ``(path, table or None, status, message)``.

    ``trusted`` None: no ownership check. An untrusted ``autoalloc.toml`` is not parsed;
    an untrusted ``pyproject.toml`` is parsed only to see whether it has our table.
    """
    if not start:
        return None
    for directory in ancestors(start):
        for name in PROJECT_FILES:
            path = os.path.join(directory, name)
            try:
                data, st = read_file(path)
                if trusted is not None and not is_trusted(path, trusted, st):
                    if name == "pyproject.toml":
                        try:
                            if policy_table(path, data) is None:
                                continue
                        except LayerError:
                            pass
                    return path, None, "untrusted", _UNTRUSTED
                table = policy_table(path, data)
            except FileNotFoundError:
                continue
            except LayerError as exc:
                return path, None, "error", str(exc)
            if table is not None:
                return path, table, "found", ""
    return None


def find_project(start: str | None) -> tuple[str, dict | None, str] | None:
    """The nearest project policy: ``(path, table or None, error message)``.

    ``autoalloc.toml`` wins over ``pyproject.toml`` in the same directory; a
    ``pyproject.toml`` without ``[tool.autoalloc]`` does not count.
    """
    found = _find(start, None)
    return None if found is None else (found[0], found[1], found[3])


def _load_file(layer: str, path: str, allow_trust: bool) -> tuple[LayerStatus, LayerConfig | None]:
    try:
        table = policy_table(path, read_bytes(path))
    except FileNotFoundError:
        return LayerStatus(layer, path, "missing"), None
    except LayerError as exc:
        return LayerStatus(layer, path, "error", str(exc)), None
    if table is None:
        return LayerStatus(layer, path, "missing", "no [tool.autoalloc] table"), None
    return _validated(layer, path, table, allow_trust)


def _validated(layer: str, path: str, table: object, allow_trust: bool) -> tuple[LayerStatus, LayerConfig | None]:
    try:
        config = validate(table, Source(layer, path), allow_trust)
    except PolicyError as exc:
        return LayerStatus(layer, path, "error", str(exc)), None
    return LayerStatus(layer, path, "found"), config


def _location(layer: str, locate) -> tuple[str | None, LayerStatus | None]:
    try:
        return locate(), None
    except Exception as exc:  # e.g. no HOME and no passwd entry: no such layer (explain shows why)
        return None, LayerStatus(layer, None, "missing", f"cannot locate: {exc}")


def load(entry: EntryPoint, env: Mapping[str, str], cwd: str | None) -> Policy:
    """Read every layer for this entry point and compose them."""
    statuses: list[LayerStatus] = []
    configs: list[LayerConfig] = []

    def add(status: LayerStatus, config: LayerConfig | None) -> None:
        statuses.append(status)
        if config is not None:
            configs.append(config)

    add(*_load_file("builtin", BUILTIN_PATH, False))
    for layer, locate in (("site", site_path), ("user", user_path)):
        path, failure = _location(layer, locate)
        if path and not os.path.isabs(path):
            # HOME unset for a uid without a passwd entry (containers): "~/.config/..." would be
            # read from the working directory, i.e. from whatever repository is there.
            add(LayerStatus(layer, path, "missing", "not an absolute path (is HOME set?)"), None)
            continue
        add(*(_load_file(layer, path, True) if path else (failure, None)))
    env_path = env.get("AUTOALLOC_CONFIG") or None
    env_result = _load_file("env", env_path, True) if env_path else (LayerStatus("env", None, "unset"), None)
    trusted = trusted_dirs(env, [*configs, *([env_result[1]] if env_result[1] else [])])
    found = _find(project_start(entry, cwd), trusted)
    if found is None:
        add(LayerStatus("project", None, "missing"), None)
    else:
        path, table, status, message = found
        if status != "found":
            add(LayerStatus("project", path, status, message), None)
        else:
            add(*_validated("project", path, table, False))
    add(*env_result)
    return compose(configs, statuses)
