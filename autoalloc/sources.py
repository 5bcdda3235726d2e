"""Find and read the policy layers: built-in < site < user < project < ``AUTOALLOC_CONFIG``.

Where the files are, and which may be used, is ``layerpaths``'; reading is careful, because
a project file can come from any cloned repository: ``safefile`` reads regular files only,
at most ``MAX_BYTES``. Any failure becomes a layer status with its reason instead of an
exception; what is said of a file used in part is a note on its layer, rendered where it is
shown (``LayerStatus.message``). A validated layer is remembered by its exact bytes, in the
process and across processes (``layercache``); the wrappers are taken off by ``plan``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from autoalloc import layercache, layerpaths, messages, safefile, wrappers
from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import CONFIG_VAR
from autoalloc.globs import RulePatterns
from autoalloc.layerpaths import BUILTIN_PATH, WRAPPERS_PATH, may_wrap, project_start, shadow_note
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
    unknown_switches,
    walked,
)
from autoalloc.records import replace

MAX_BYTES = 1 << 20


class LayerError(Exception):
    """A layer file that exists but cannot be used."""


class TooLarge(LayerError):
    """A layer file over ``MAX_BYTES``."""


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


# Headers of autoalloc's tables that a pyproject.toml may hold at its top level by mistake
# (the README's example pasted below [tool.autoalloc]): such a file is parsed too.
_PASTED = (b"[[rules]]", b"[allocator]")
# [tool.autoalloc] misspelled (``_misnamed``): such a file is parsed too.
_MISNAMED = (b"auto-alloc", b"auto_alloc")


def _pyproject(data: bytes) -> tuple[object, list[str]]:
    """A pyproject.toml's ``[tool.autoalloc]`` table (None: it has none) and a sentence for
    each autoalloc table or key where autoalloc does not read it.

    Parsed only when it names autoalloc (or ``_MISNAMED``) as a key (``_as_key``), holds one
    of ``_PASTED``, or names autoalloc beside keys off pyproject's own (``layerpaths``);
    one not valid TOML is not ours (None) unless it names ours: LayerError.
    """
    mentioned = b"autoalloc" in data
    named = any(_as_key(data, name) for name in (b"autoalloc", *_MISNAMED))
    pasted = any(h in data for h in _PASTED) or (mentioned and layerpaths.off_pyproject(data))
    if not named and not pasted:
        return None, []
    try:
        document = parse_toml(data)
    except LayerError:
        if named:
            raise
        return None, []
    from autoalloc import schema  # only for a pyproject.toml that may be ours

    found = [*_misnamed(document), *(p.sentence() for p in schema.misplaced(document, mentioned))]
    tool = document.get("tool")
    if not isinstance(tool, dict) or "autoalloc" not in tool:
        return None, found
    return tool["autoalloc"], found


def _as_key(data: bytes, name: bytes) -> bool:
    """Whether ``name`` occurs where TOML may have it as a key: anywhere but in a quoted value
    ending before ``,`` ``]`` or the line's end off a header line (``"autoalloc>=0.3",``,
    ``["torch", "autoalloc"]``: a dependency). Errs towards yes (a comment, a broken line)."""
    at = data.find(name)
    while at >= 0:
        start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
        line = data[start : end if end >= 0 else len(data)]
        quote, after = data[at - 1 : at] if at > start else b"", at - start + len(name)
        if quote not in (b'"', b"'") or line.lstrip()[:1] == b"[" or quote not in line[after:]:
            return True  # not in a quoted value, or on a header line
        if line[line.index(quote, after) + 1 :].strip()[:1] not in (b",", b"]", b"", b"#"):
            return True  # a quoted key
        at = data.find(name, at + 1)
    return False


def _misnamed(document: dict) -> list[str]:
    """A sentence for each table meant as ``[tool.autoalloc]`` under another name, which
    autoalloc does not read: ``[tool.auto-alloc]``, ``[tool.auto_alloc]``, ``[autoalloc]``
    at the top level (or only its ``[[autoalloc.rules]]``)."""
    tool = document.get("tool")
    tables = {f"tool.{n}": tool[n] for n in ("auto-alloc", "auto_alloc")
              if isinstance(tool, dict) and n in tool}  # fmt: skip
    if "autoalloc" in document:
        tables["autoalloc"] = document["autoalloc"]
    out = []
    for name, table in tables.items():
        wrote, right = f"[{name}]", "[tool.autoalloc]"
        if isinstance(table, dict) and list(table) == ["rules"]:
            wrote, right = f"[[{name}.rules]]", "[[tool.autoalloc.rules]]"
        out.append(f"{wrote} in pyproject.toml is not read by autoalloc: write {right}. "
                   "It is ignored.")  # fmt: skip
    return out


def pyproject_problems(path: str, data: bytes) -> list[str]:
    """The autoalloc tables and keys a pyproject.toml that has a [tool.autoalloc] table holds
    where autoalloc does not read them (a sentence each; none for another file)."""
    if os.path.basename(path) != "pyproject.toml":
        return []
    try:
        return _pyproject(data)[1]
    except LayerError:
        return []


def policy_table(path: str, data: bytes) -> object:
    """The autoalloc table of a file (None: a pyproject.toml without one). Raises LayerError."""
    return _table(path, data)[0]


def _table(path: str, data: bytes) -> tuple[object, tuple[str, ...]]:
    """``policy_table``, and the notes of what else reading found (parsed once): the whole
    document, or a pyproject.toml's ``[tool.autoalloc]``; one without it but with autoalloc
    tables or keys elsewhere raises LayerError: a policy meant, and not read."""
    if os.path.basename(path) != "pyproject.toml":
        return parse_toml(data), ()
    table, found = _pyproject(data)
    if table is None and found:
        raise LayerError(f"it has no [tool.autoalloc] table. {' '.join(found)}")
    return table, tuple(found)


def _project_table(path: str, data: bytes) -> tuple[object, tuple[str, ...]]:
    """``_table`` for a project candidate; a ``pyproject.toml`` that names autoalloc where
    TOML has a key, and has no ``[tool.autoalloc]`` table, is remembered as such across
    processes (``layercache``, by its exact bytes), so that no process parses it again."""
    if os.path.basename(path) != "pyproject.toml" or not _as_key(data, b"autoalloc"):
        return _table(path, data)  # parsed anyway, or not at all (_pyproject)
    if layercache.get("no-table", (path,), data) is True:
        return None, ()
    found = _table(path, data)
    if found[0] is None:
        layercache.put("no-table", (path,), data, True)
    return found


def shadowed_table(path: str) -> str | None:
    """The ``pyproject.toml`` beside an ``autoalloc.toml`` when it has a ``[tool.autoalloc]``
    table, which is then never read (None: there is none, or it is not one)."""
    sibling = layerpaths.beside(path)
    try:
        found = sibling and _table(sibling, read_file(sibling)[0])[0] is not None
        return sibling if found else None
    except (FileNotFoundError, LayerError):
        return None


MAX_SCAN = 16 << 20  # bytes of a pyproject.toml over MAX_BYTES searched for "autoalloc"


def _passed_over(path: str, exc: LayerError) -> LayerStatus | None:
    """A pyproject.toml that ``read_file`` refused: not autoalloc's until it is seen to be.

    None: a large one that does not name autoalloc within ``MAX_SCAN`` bytes (the search
    goes on, nothing to say: a pyproject.toml that large is a generated one); an ``error``
    layer for a large one that does (a broken policy, as an autoalloc.toml would be); else
    ``skipped``: it cannot be inspected (a FIFO, a device, a directory, no read permission,
    larger than ``MAX_SCAN``), which explain and check mention, and a run does not: such a
    file is seldom a policy, and the search goes on upward."""
    try:
        if isinstance(exc, TooLarge) and b"autoalloc" in safefile.read(path, MAX_SCAN)[0]:
            return LayerStatus("project", path, "error", str(exc))
        if isinstance(exc, TooLarge):
            return None
    except (OSError, ValueError):
        pass  # larger still, or unreadable: it cannot be told
    why = f"{exc}; not inspected for a [tool.autoalloc] table, and passed over"
    return LayerStatus("project", path, "skipped", why)


def _project_candidate(path: str, trusted: Sequence[str] | None) -> LayerStatus | None:
    """The project layer from ``path``, or None when the search goes on past it (a
    ``skipped`` layer too: the search goes on, and says why)."""
    examined = layerpaths.examine(path)
    if examined == "blocked":
        messages.debug(f"cannot examine {path} (a directory on the way is not searchable): skipped")
    if examined != "present":
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
        if trusted is not None and not layerpaths.is_trusted(path, trusted, st):
            # Another user's pyproject.toml is looked at only to see whether it has our table.
            try:
                if _project_table(path, data)[0] is None:
                    return None
            except LayerError:
                pass
            why = ("it or its directory is owned by another user; ignored (trust it with "
                   "AUTOALLOC_TRUSTED_DIRS or trusted_dirs in your user config)")
            return LayerStatus("project", path, "untrusted", why)
        return _layer("project", path, data, False, _project_table)
    except LayerError as exc:
        return LayerStatus("project", path, "error", str(exc))


def _find(
    start: str | None, trusted: Sequence[str] | None
) -> tuple[LayerStatus | None, tuple[LayerStatus, ...]]:
    """The nearest project policy (``trusted`` None: no ownership check), and the
    pyproject.toml files passed over on the way because they cannot be inspected."""
    skipped: list[LayerStatus] = []
    for path in layerpaths.project_candidates(start):
        found = _project_candidate(path, trusted)
        if found is not None and found.status == "skipped":
            skipped.append(found)
        elif found is not None:
            return found, tuple(skipped)
    return None, tuple(skipped)


# What a cached layer may hold besides plain data (``layercache`` builds nothing else).
_LAYER_RECORDS = (LayerConfig, Rule, Source, wrappers.Wrapper, RulePatterns)
# The one memo of validated layers in a process, above the disk cache: a later decision of
# the same process (an import trigger, the first optimizer) reads each file again and, for
# the same bytes, neither unpickles nor parses it again.
_LAYERS: dict[tuple, tuple[bytes, LayerStatus]] = {}
_LAYERS_MAX = 16


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
    found = LayerStatus(layer, path, hit[0], notes=tuple(hit[1]), config=hit[2], data=data)
    _remember(key, data, found)
    return found


def load_file(layer: LayerName, path: str, allow_trust: bool = True) -> LayerStatus:
    """One named layer file, read and validated."""
    try:
        found = _layer(layer, path, read_file(path)[0], allow_trust)
    except FileNotFoundError:
        return LayerStatus(layer, path, "missing")
    except LayerError as exc:
        return LayerStatus(layer, path, "error", str(exc))
    return found or LayerStatus(layer, path, "missing", "no [tool.autoalloc] table")


def _layer(
    layer: LayerName, path: str, data: bytes, allow_trust: bool, tables: Callable = _table
) -> LayerStatus | None:
    """The layer validated from a file's bytes, or remembered from them (None: a
    pyproject.toml without our table). Raises LayerError."""
    cached = _cached(layer, path, allow_trust, data)
    if cached is not None:
        return cached
    twin = functools.partial(walked, Source(layer, path))
    config = layercache.released(data, twin) if path == BUILTIN_PATH and not allow_trust else None
    notes: tuple = ()
    if config is None:
        table, notes = tables(path, data)
        if table is None:
            return None
        try:
            config, problems = salvage(table, Source(layer, path), allow_trust)
        except PolicyError as exc:
            return LayerStatus(layer, path, "error", str(exc))
        notes = (*notes, *problems)  # a file used in part is "found", with a note of each
    done = LayerStatus(layer, path, "found", config=config, data=data, notes=notes)
    if data:
        key = _layer_key(layer, path, allow_trust)
        _remember(key, data, done)
        layercache.put("layer", key, data, ("found", done.notes, config))
    return done


def _config_dir_layer(layer: LayerName, locate: layerpaths.Locate) -> LayerStatus:
    path, why = layerpaths.config_file(locate)
    return LayerStatus(layer, path, "missing", why) if why or not path else load_file(layer, path)


def _env_layer(env: Mapping[str, str]) -> LayerStatus:
    path = env.get(CONFIG_VAR) or None
    if path is None:
        return LayerStatus("env", None, "unset")
    read = load_file("env", path)
    if read.status == "missing" and not read.reason:
        # Named by the user, so its absence is a mistake to report, not a layer to skip.
        why = f"{CONFIG_VAR} names a file that does not exist"
        return replace(read, status="error", reason=why)
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


def read_layers(entry: EntryPoint, env: Mapping[str, str], cwd: str | None) -> list[LayerStatus]:
    """Every layer for this entry point, lowest first."""
    # 1. built-in rules, shipped as package data
    builtin = load_file("builtin", BUILTIN_PATH, allow_trust=False)
    if builtin.config is not None and may_wrap(entry):  # the wrapper table beside them
        table = builtin.config.wrappers + builtin_wrappers()
        builtin = replace(builtin, config=replace(builtin.config, wrappers=table))
    # 2. site and 3. user config files (platformdirs)
    site = _config_dir_layer("site", lambda: layercache.config_path("site"))
    user = _config_dir_layer("user", lambda: layercache.config_path("user"))
    # 5. AUTOALLOC_CONFIG is read before the project layer, although it ranks above it: its
    # trusted_dirs, like the user's and the site's, decide whether a project file owned by
    # another user may be used, so it must be known before the project search.
    named = _env_layer(env)
    configs = [r.config for r in (site, user, named) if r.config is not None]
    # 4. project: the nearest autoalloc.toml or pyproject.toml [tool.autoalloc] upward
    found, skipped = _find(project_start(entry, cwd), layerpaths.trusted_dirs(env, configs))
    project = found or LayerStatus("project", None, "missing")
    if project.path and shadowed_table(project.path):
        project = replace(project, aside=shadow_note())
    # the pyproject.toml files passed over come after the project layer, not to be taken
    # for it; they hold no configuration
    return _noted([builtin, site, user, project, *skipped, named])


def _noted(layers: list[LayerStatus]) -> list[LayerStatus]:
    """The layers, lowest first, with their references to lower layers' module sets expanded
    (``modulesets.link``), and a note of each such reference that no layer up to it defines
    and of each ``disable``/``enable`` that names no rule of any layer (a typo)."""
    configs = [layer.config for layer in layers if layer.config is not None]
    switching = any(c.disable or c.enable for c in configs)
    if not switching and not any(c.pending for c in configs):
        return layers  # the usual case: no names to check, the sets a file uses are at hand
    if any(c.pending for c in configs):
        from autoalloc import modulesets

        linked = [(c, tuple(p.sentence() for p in found)) for c, found in modulesets.link(configs)]
    else:
        linked = [(c, ()) for c in configs]
    known = {rule.name for c in configs for rule in c.rules}
    known.update(wrapper.name for c in configs for wrapper in c.wrappers)
    out, each = [], iter(linked)
    for layer in layers:
        if layer.config is not None:
            config, unset = next(each)
            typos = unknown_switches(config, known, wrapper_names) if switching else []
            layer = replace(layer, config=config, notes=(*typos, *unset, *layer.notes))
        out.append(layer)
    return out


def wrapper_names() -> frozenset[str]:  # disable removes a built-in wrapper too
    return frozenset(wrapper.name for wrapper in builtin_wrappers())


def load(entry: EntryPoint, env: Mapping[str, str], cwd: str | None) -> Policy:
    """Read every layer for this entry point and compose them."""
    layers = read_layers(entry, env, cwd)
    return compose([r.config for r in layers if r.config is not None], layers)
