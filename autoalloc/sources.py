"""Find and read the policy layers: built-in < site < user < project < ``AUTOALLOC_CONFIG``.

Discovery is small functions of paths (like pytest's ``findpaths``); reading is careful,
because a project file can come from any cloned repository: regular files only (a FIFO
would block), at most ``MAX_BYTES``, owned by this user or root unless trusted, and any
failure becomes a layer status with a message instead of an exception.
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
    """``start`` and each parent up to the file-system root."""
    current = os.path.abspath(start)
    while True:
        yield current
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def read_bytes(path: str) -> bytes:
    """A policy file's bytes; raises FileNotFoundError when absent, LayerError when unusable."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise LayerError(f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise LayerError("is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise LayerError("is not a regular file")
    if st.st_size > MAX_BYTES:
        raise LayerError(f"is larger than {MAX_BYTES // 1024} KiB")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise LayerError(f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise LayerError(f"is larger than {MAX_BYTES // 1024} KiB")
    return data


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
    """Directories whose project files are used even when another user owns them."""
    dirs = [d for d in env.get("AUTOALLOC_TRUSTED_DIRS", "").split(os.pathsep) if d]
    for config in configs:
        dirs.extend(config.trusted_dirs)
    return dirs


def is_trusted(path: str, trusted: Sequence[str]) -> bool:
    """Owned by this user or root (like git's safe.directory), or below a trusted directory."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # no ownership model to check against
        return True
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return False
    if owner in (geteuid(), 0):
        return True
    real = os.path.realpath(path)
    for entry in trusted:
        if entry == "*":
            return True
        base = os.path.realpath(os.path.expanduser(entry))
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def find_project(start: str | None) -> tuple[str, dict | None, str] | None:
    """The nearest project policy: ``(path, table or None, error message)``.

    ``autoalloc.toml`` wins over ``pyproject.toml`` in the same directory; a
    ``pyproject.toml`` without ``[tool.autoalloc]`` does not count.
    """
    if not start:
        return None
    for directory in ancestors(start):
        for name in PROJECT_FILES:
            path = os.path.join(directory, name)
            try:
                data = read_bytes(path)
                table = policy_table(path, data)
            except FileNotFoundError:
                continue
            except LayerError as exc:
                return path, None, str(exc)
            if table is not None:
                return path, table, ""
    return None


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
    except Exception as exc:  # platformdirs on a strange system: report, go on
        return None, LayerStatus(layer, None, "error", f"cannot locate: {exc}")


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
        add(*(_load_file(layer, path, True) if path else (failure, None)))
    env_path = env.get("AUTOALLOC_CONFIG") or None
    env_result = _load_file("env", env_path, True) if env_path else (LayerStatus("env", None, "unset"), None)
    trusted = trusted_dirs(env, [*configs, *([env_result[1]] if env_result[1] else [])])
    found = find_project(project_start(entry, cwd))
    if found is None:
        add(LayerStatus("project", None, "missing"), None)
    else:
        path, table, error = found
        if error:
            add(LayerStatus("project", path, "error", error), None)
        elif not is_trusted(path, trusted):
            add(
                LayerStatus(
                    "project",
                    path,
                    "untrusted",
                    "owned by another user; ignored (trust it with AUTOALLOC_TRUSTED_DIRS or trusted_dirs in your user config)",
                ),
                None,
            )
        else:
            add(*_validated("project", path, table, False))
    add(*env_result)
    return compose(configs, statuses)
