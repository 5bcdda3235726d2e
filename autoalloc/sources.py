"""Find and read the policy layers: built-in < site < user < project < ``AUTOALLOC_CONFIG``.

Discovery is small functions of paths (like pytest's ``findpaths``); reading is careful,
because a project file can come from any cloned repository: ``safefile`` reads regular
files only, at most ``MAX_BYTES``, and a project file is used only when it and its
directory are owned by this user or root (like git's ``safe.directory``) unless it is below
a trusted directory. Any failure becomes a layer status with a message instead of an
exception. A validated layer is remembered by its exact bytes, in the process and across
processes (``layercache``); the wrappers are taken off by ``plan``, not here.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

from autoalloc import layercache, messages, safefile, wrappers
from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import CONFIG_VAR, TRUSTED_DIRS_VAR
from autoalloc.globs import RulePatterns
from autoalloc.policy import (
    LayerConfig,
    LayerName,
    LayerStatus,
    Policy,
    PolicyError,
    Rule,
    Source,
    compose,
    salvage,
    summarize,
    unknown_switches,
)
from autoalloc.records import replace

MAX_BYTES = 1 << 20
BUILTIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "builtin.toml")
WRAPPERS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrappers.toml")


class LayerError(Exception):
    """A layer file that exists but cannot be used."""


class TooLarge(LayerError):
    """A layer file over ``MAX_BYTES``."""


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


def read_file(path: str) -> tuple[bytes, os.stat_result]:
    """A policy file's bytes and the ``fstat`` of what was read (``safefile``).

    Raises FileNotFoundError when absent (or a parent is not a directory), LayerError
    when unusable.
    """
    try:
        return safefile.read(path, MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(path) from None
    except safefile.TooLarge:
        raise TooLarge(f"larger than {MAX_BYTES // 1024} KiB") from None
    except safefile.NotRegular as exc:
        raise LayerError(str(exc)) from None
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL in the path
        raise LayerError(f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def read_bytes(path: str) -> bytes:
    """A policy file's bytes; raises FileNotFoundError when absent, LayerError when unusable."""
    return read_file(path)[0]


def parse_toml(data: bytes) -> dict:
    """TOML from bytes; a UTF-8 BOM is tolerated. Raises LayerError."""
    if sys.version_info >= (3, 11):  # imported here: a layer found in the cache needs no parser
        import tomllib
    else:  # pragma: no cover - exercised on older interpreters in CI
        import tomli as tomllib
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LayerError(f"not UTF-8 (byte {exc.start})") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LayerError(f"not valid TOML: {exc}") from None
    except RecursionError:
        raise LayerError("not valid TOML: nested too deeply") from None
    except Exception as exc:  # e.g. ValueError for an integer of more than 4300 digits
        raise LayerError(f"not valid TOML: {type(exc).__name__}: {exc}") from None
    return table


def _whole_document(data: bytes) -> tuple[object, tuple[str, ...]]:
    return parse_toml(data), ()


# Headers of autoalloc's tables that a pyproject.toml may hold at its top level by mistake
# (the README's example pasted below [tool.autoalloc]): such a file is parsed too.
_PASTED = (b"[[rules]]", b"[allocator]")


def _pyproject(data: bytes) -> tuple[object, list[str]]:
    """A pyproject.toml's ``[tool.autoalloc]`` table (None: it has none) and a sentence for
    each autoalloc key at its top level, where autoalloc does not read it.

    Parsed only when it names autoalloc or holds one of ``_PASTED``: most pyproject.toml
    files are not ours. One that does not name autoalloc and is not valid TOML is not ours
    either (None); one that names autoalloc raises LayerError.
    """
    mentioned = b"autoalloc" in data
    if not mentioned and not any(header in data for header in _PASTED):
        return None, []
    try:
        document = parse_toml(data)
    except LayerError:
        if mentioned:
            raise
        return None, []
    from autoalloc import schema  # only for a pyproject.toml that may be ours

    found = [p.sentence() for p in schema.misplaced(document, mentioned)]
    tool = document.get("tool")
    if not isinstance(tool, dict) or "autoalloc" not in tool:
        return None, found
    return tool["autoalloc"], found


def _tool_autoalloc(data: bytes) -> tuple[object, tuple[str, ...]]:
    """The ``[tool.autoalloc]`` table (None: none) and a sentence for each autoalloc key at the
    top level. Raises LayerError when there is no table but such keys: a policy meant, and
    not read."""
    table, found = _pyproject(data)
    if table is None and found:
        raise LayerError(f"it has no [tool.autoalloc] table. {' '.join(found)}")
    return table, tuple(found)


def pyproject_problems(path: str, data: bytes) -> list[str]:
    """The autoalloc keys at the top level of a pyproject.toml that has a [tool.autoalloc]
    table (a sentence each; none for another file)."""
    if os.path.basename(path) != "pyproject.toml":
        return []
    try:
        return _pyproject(data)[1]
    except LayerError:
        return []


# Project file names, in the order they are tried in each directory, and how each holds
# the policy: the whole document, or the [tool.autoalloc] table (with what else was found).
LOADERS: dict[str, Callable[[bytes], tuple[object, tuple[str, ...]]]] = {
    "autoalloc.toml": _whole_document,
    "pyproject.toml": _tool_autoalloc,
}
PROJECT_FILES = tuple(LOADERS)


def policy_table(path: str, data: bytes) -> object:
    """The autoalloc table of a file (None: a pyproject.toml without one). Raises LayerError."""
    return _table(path, data)[0]


def _table(path: str, data: bytes) -> tuple[object, tuple[str, ...]]:
    """``policy_table``, and the notes of what else reading found (parsed once)."""
    return LOADERS.get(os.path.basename(path), _whole_document)(data)


def _project_table(path: str, data: bytes) -> tuple[object, tuple[str, ...]]:
    """``_table`` for a project candidate; a ``pyproject.toml`` that mentions autoalloc
    without a ``[tool.autoalloc]`` table (a dependency list) is remembered as such across
    processes (``layercache``, by its exact bytes), so that no process parses it again."""
    if os.path.basename(path) != "pyproject.toml" or b"autoalloc" not in data:
        return _table(path, data)  # parsed anyway, or not at all (_tool_autoalloc)
    if layercache.get("no-table", (path,), data) is True:
        return None, ()
    found = _table(path, data)
    if found[0] is None:
        layercache.put("no-table", (path,), data, True)
    return found


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
        owned = _owned(st if st is not None else os.stat(path), euid) and _owned(
            os.stat(os.path.dirname(path) or "."), euid
        )
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


def shadow_note(of_pyproject: bool = False) -> str:
    """What a run, ``explain`` and ``check`` say about a ``[tool.autoalloc]`` never read: in
    the autoalloc.toml's message (one file named per message), or in the pyproject.toml's."""
    whose = "Its" if of_pyproject else "The pyproject.toml beside it has a"
    return (
        f"{whose} [tool.autoalloc] table, which is ignored: autoalloc.toml in the same "
        "directory wins (move that table into autoalloc.toml, or delete autoalloc.toml)."
    )


def shadowed_table(path: str) -> str | None:
    """The ``pyproject.toml`` beside an ``autoalloc.toml`` when it has a ``[tool.autoalloc]``
    table, which is then never read (None: there is none, or it is not one)."""
    if os.path.basename(path) != "autoalloc.toml":
        return None
    sibling = os.path.join(os.path.dirname(path), "pyproject.toml")
    try:
        return sibling if _tool_autoalloc(read_bytes(sibling))[0] is not None else None
    except (FileNotFoundError, LayerError):
        return None


Examined = Literal["present", "absent", "blocked"]


def _examine(path: str) -> Examined:
    """``blocked`` when a permission on the way keeps ``path`` from being examined at all.

    ``stat`` needs only search permission on the directories above: a project candidate
    it cannot reach is not a broken file of the user's (the working directory may sit
    below a directory the user cannot read), so it is traced, not warned about. ``absent``
    lets the project search skip a candidate without opening it (it looks at two names in
    every directory up to the root, at every ``import torch``).
    """
    try:
        os.stat(path)
    except PermissionError:
        messages.debug(f"cannot examine {path} (a directory on the way is not searchable): skipped")
        return "blocked"
    except (FileNotFoundError, NotADirectoryError):
        return "absent"
    except (OSError, ValueError):
        pass  # another failure, which read_file reports
    return "present"


MAX_SCAN = 16 << 20  # bytes of a pyproject.toml over MAX_BYTES searched for "autoalloc"


def _scan(path: str) -> bool | None:
    """Whether a regular file larger than ``MAX_BYTES`` names autoalloc, read a chunk at a
    time up to ``MAX_SCAN`` bytes (None: it cannot be told, the file being larger still or
    unreadable). A pyproject.toml that large is a generated one, never autoalloc's."""
    word = b"autoalloc"
    try:
        fd = os.open(path, safefile.OPEN_FLAGS)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SCAN:
            return None
        tail, size = b"", 0
        while size <= MAX_SCAN:
            chunk = os.read(fd, MAX_BYTES)
            if not chunk:
                return False
            if word in tail + chunk:
                return True
            tail, size = chunk[-len(word):], size + len(chunk)
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _passed_over(path: str, exc: LayerError) -> LayerStatus | None:
    """A pyproject.toml that ``read_file`` refused: not autoalloc's until it is seen to be.

    None: a large one that does not name autoalloc (the search goes on, nothing to say); an
    ``error`` layer for a large one that does (a broken policy, as an autoalloc.toml would
    be); else ``skipped``: it cannot be inspected (a FIFO, a device, a directory, no read
    permission, larger than ``MAX_SCAN``), which explain and check mention, and a run does
    not: such a file is seldom a policy, and the search goes on upward."""
    if isinstance(exc, TooLarge):
        named = _scan(path)
        if named is not None:
            return LayerStatus("project", path, "error", str(exc)) if named else None
    why = f"{exc}; not inspected for a [tool.autoalloc] table, and passed over"
    return LayerStatus("project", path, "skipped", why)


def _project_candidate(path: str, trusted: Sequence[str] | None) -> LayerStatus | None:
    """The project layer from ``path``, or None when the search goes on past it (a
    ``skipped`` layer too: the search goes on, and says why)."""
    if _examine(path) != "present":
        return None
    try:
        data, st = read_file(path)
    except FileNotFoundError:
        return None
    except LayerError as exc:
        if os.path.basename(path) == "pyproject.toml":
            return _passed_over(path, exc)
        return LayerStatus("project", path, "error", str(exc))
    try:
        if trusted is not None and not is_trusted(path, trusted, st):
            # Another user's pyproject.toml is looked at only to see whether it has our table.
            try:
                if _project_table(path, data)[0] is None:
                    return None
            except LayerError:
                pass
            return LayerStatus("project", path, "untrusted", _UNTRUSTED)
        cached = _cached("project", path, False, data)
        if cached is not None:
            return cached
        table, notes = _project_table(path, data)
    except LayerError as exc:
        return LayerStatus("project", path, "error", str(exc))
    if table is None:
        return None
    return LayerStatus("project", path, "found", table=table, data=data, notes=notes)


def _find(
    start: str | None, trusted: Sequence[str] | None
) -> tuple[LayerStatus | None, tuple[LayerStatus, ...]]:
    """The nearest project policy (``trusted`` None: no ownership check), and the
    pyproject.toml files passed over on the way because they cannot be inspected."""
    skipped: list[LayerStatus] = []
    if not start:
        return None, ()
    for directory in ancestors(start):
        for name in LOADERS:
            found = _project_candidate(os.path.join(directory, name), trusted)
            if found is not None and found.status == "skipped":
                skipped.append(found)
            elif found is not None:
                return found, tuple(skipped)
    return None, tuple(skipped)


def find_project(start: str | None) -> LayerStatus | None:
    """The nearest project policy searched upward from ``start``, without ownership checks.

    ``autoalloc.toml`` wins over ``pyproject.toml`` in the same directory; a
    ``pyproject.toml`` without ``[tool.autoalloc]`` does not count, nor one that cannot be
    inspected. Unlike the project layer of ``read_layers``, its message does not name the
    table the winner leaves unread.
    """
    return _find(start, None)[0]


# What a cached layer may hold besides plain data (``layercache`` builds nothing else).
_LAYER_RECORDS = (LayerConfig, Rule, Source, wrappers.Wrapper, RulePatterns)
# The one memo of validated layers in a process, above the disk cache: a later decision of
# the same process (an import trigger, the first optimizer) reads each file again and, for
# the same bytes, neither unpickles nor parses it again.
_LAYERS: dict[tuple, tuple[bytes, LayerStatus]] = {}
_LAYERS_MAX = 16


def _validated(read: LayerStatus, allow_trust: bool) -> LayerStatus:
    if read.status != "found" or read.config is not None:
        return read
    try:
        source = Source(read.layer, read.path or "")
        config, problems = salvage(read.table, source, allow_trust)
    except PolicyError as exc:
        return replace(read, status="error", message=str(exc))
    problems = (*read.notes, *problems)
    # A file used in part is "found", with a message saying what was left out.
    done = replace(read, config=config, message=summarize(problems), table=None, notes=())
    if read.data and read.path:
        key = _layer_key(read.layer, read.path, allow_trust)
        _remember(key, read.data, done)
        value = (done.status, done.message, config)
        layercache.put("layer", key, read.data, value, _LAYER_RECORDS)
    return done


def _layer_key(layer: LayerName, path: str, allow_trust: bool) -> tuple:
    """What a validated layer depends on besides its bytes (HOME: ``~`` in patterns)."""
    return (layer, path, allow_trust, os.environ.get("HOME"))


def _remember(key: tuple, data: bytes, layer: LayerStatus) -> None:
    if len(_LAYERS) >= _LAYERS_MAX:  # a process reading many projects' policies: stay small
        del _LAYERS[next(iter(_LAYERS))]
    _LAYERS[key] = (data, layer)


def _cached(layer: LayerName, path: str, allow_trust: bool, data: bytes) -> LayerStatus | None:
    """The layer validated from exactly these bytes, earlier in this process or by an
    earlier process (``layercache``)."""
    key = _layer_key(layer, path, allow_trust)
    known = _LAYERS.get(key)
    if known is not None and known[0] == data:
        return known[1]
    hit = layercache.get("layer", key, data, _LAYER_RECORDS)
    if not isinstance(hit, tuple) or len(hit) != 3 or not isinstance(hit[2], LayerConfig):
        return None
    found = LayerStatus(layer, path, hit[0], hit[1], config=hit[2], data=data)
    _remember(key, data, found)
    return found


def load_file(layer: LayerName, path: str, allow_trust: bool = True) -> LayerStatus:
    """One named layer file, read and validated."""
    try:
        data = read_bytes(path)
        cached = _cached(layer, path, allow_trust, data)
        if cached is not None:
            return cached
        table, notes = _table(path, data)
    except FileNotFoundError:
        return LayerStatus(layer, path, "missing")
    except LayerError as exc:
        return LayerStatus(layer, path, "error", str(exc))
    if table is None:
        return LayerStatus(layer, path, "missing", "no [tool.autoalloc] table")
    found = LayerStatus(layer, path, "found", table=table, data=data, notes=notes)
    return _validated(found, allow_trust)


def _config_dir_layer(layer: LayerName, locate: Callable[[], str]) -> LayerStatus:
    try:
        path = locate()
    except Exception as exc:  # e.g. no HOME and no passwd entry: no such layer (explain shows why)
        return LayerStatus(layer, None, "missing", f"cannot locate: {exc}")
    if not os.path.isabs(path):
        # HOME unset for a uid without a passwd entry (containers): "~/.config/..." would be
        # read from the working directory, i.e. from whatever repository is there.
        return LayerStatus(layer, path, "missing", "not an absolute path (is HOME set?)")
    if _examine(path) == "blocked":
        # HOME or XDG_CONFIG_HOME below a directory this user cannot enter (`docker run
        # --user 1000` on an image whose HOME is /root): no file the user could have written.
        why = "cannot be examined: a directory on the way is not searchable by this user"
        return LayerStatus(layer, path, "missing", why)
    return load_file(layer, path)


def _env_layer(env: Mapping[str, str]) -> LayerStatus:
    path = env.get(CONFIG_VAR) or None
    if path is None:
        return LayerStatus("env", None, "unset")
    read = load_file("env", path)
    if read.status == "missing" and not read.message:
        # Named by the user, so its absence is a mistake to report, not a layer to skip.
        return replace(
            read, status="error", message=f"{CONFIG_VAR} names a file that does not exist"
        )
    return read


@functools.lru_cache(maxsize=1)
def builtin_wrappers() -> tuple[wrappers.Wrapper, ...]:
    """The built-in wrapper table (``wrappers.toml``), read as a layer file and so remembered
    across processes as the built-in rules are (a launcher's process would otherwise parse
    it on every start). Empty if it cannot be read, and a wrapper that is not valid is left
    out, which never happens in an intact installation (``test_wrappers`` checks it) and
    must not stop the decision."""
    read = load_file("builtin", WRAPPERS_PATH, allow_trust=False)
    return read.config.wrappers if read.status == "found" and read.config is not None else ()


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


def read_layers(entry: EntryPoint, env: Mapping[str, str], cwd: str | None) -> list[LayerStatus]:
    """Every layer for this entry point, lowest first."""
    # 1. built-in rules, shipped as package data
    builtin = load_file("builtin", BUILTIN_PATH, allow_trust=False)
    if builtin.config is not None and may_wrap(entry):  # the wrapper table beside them
        table = builtin.config.wrappers + builtin_wrappers()
        builtin = replace(builtin, config=replace(builtin.config, wrappers=table))
    # 2. site and 3. user config files (platformdirs)
    site = _config_dir_layer("site", layercache.site_path)
    user = _config_dir_layer("user", layercache.user_path)
    # 5. AUTOALLOC_CONFIG is read before the project layer, although it ranks above it: its
    # trusted_dirs, like the user's and the site's, decide whether a project file owned by
    # another user may be used, so it must be known before the project search.
    named = _env_layer(env)
    trusted = trusted_dirs(env, [r.config for r in (site, user, named) if r.config is not None])
    # 4. project: the nearest autoalloc.toml or pyproject.toml [tool.autoalloc] upward
    found, skipped = _find(project_start(entry, cwd), trusted)
    project = LayerStatus("project", None, "missing") if found is None else found
    project = with_shadow(_validated(project, allow_trust=False))
    # the pyproject.toml files passed over come after the project layer, not to be taken
    # for it; they hold no configuration
    return with_unknown_switches(with_module_sets([builtin, site, user, project, *skipped, named]))


def with_module_sets(layers: list[LayerStatus]) -> list[LayerStatus]:
    """The layers, lowest first, with their references to lower layers' module sets expanded
    (``modulesets.link``); a layer that refers to a set no layer up to it defines says so in its
    message: a run warns once, explain and check show it."""
    if not any(layer.config is not None and layer.config.pending for layer in layers):
        return layers  # the usual case: the sets a file uses are its own or the built-in ones
    from autoalloc import modulesets

    linked = iter(modulesets.link([layer.config for layer in layers if layer.config is not None]))
    out = []
    for layer in layers:
        if layer.config is not None:
            config, problems = next(linked)
            if problems:
                found = " ".join(p.sentence() for p in problems)
                rest = layer.message or "The rest of the file applies."
                layer = replace(layer, message=f"{found} {rest}")
            layer = replace(layer, config=config)
        out.append(layer)
    return out


def with_unknown_switches(layers: list[LayerStatus]) -> list[LayerStatus]:
    """The layers, each whose ``disable`` or ``enable`` names no rule of any layer (a typo)
    with a message saying so: a run warns once, explain and check show it."""
    configs = [layer.config for layer in layers if layer.config is not None]
    if not any(c.disable or c.enable for c in configs):
        return layers
    known = {rule.name for c in configs for rule in c.rules}
    known.update(wrapper.name for c in configs for wrapper in c.wrappers)

    def wrapper_names() -> set[str]:  # disable removes a built-in wrapper too
        return {wrapper.name for wrapper in builtin_wrappers()}

    out = []
    for layer in layers:
        config = layer.config
        found = unknown_switches(config, known, wrapper_names) if config is not None else []
        if found and layer.status == "found":
            rest = layer.message or "The rest of the file applies."
            layer = replace(layer, message=f"{' '.join(found)} {rest}")
        out.append(layer)
    return out


def with_shadow(layer: LayerStatus) -> LayerStatus:
    """The project layer, its message naming the ``[tool.autoalloc]`` table it leaves unread."""
    shadowed = shadowed_table(layer.path) if layer.path else None
    if shadowed is None:
        return layer
    return replace(layer, message=f"{layer.message} {shadow_note()}".strip())


def load(entry: EntryPoint, env: Mapping[str, str], cwd: str | None) -> Policy:
    """Read every layer for this entry point and compose them."""
    layers = read_layers(entry, env, cwd)
    return compose([r.config for r in layers if r.config is not None], layers)
