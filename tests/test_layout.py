"""The package's layout: the start-up module's names agree with the package's, and imports
point down (start-up → decision → application / measurement, with the tools beside).

Read from the source with ``ast``, counting imports made inside functions too: a lazy
import is still a dependency, and a loop of lazy imports is still a loop.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from autoalloc import _loader, _startup, envvars

PACKAGE = Path(__file__).resolve().parent.parent / "autoalloc"

# Lowest first; a module may import its own part or a lower one.
LEAVES = {"envvars", "records", "messages", "torchinfo", "globs", "entrypoint", "selfimports",
          "counters", "problems", "modulesets", "safefile", "cachedir", "version"}
DECISION = {
    "allocconf", "schema", "wrappers", "policy", "layercache", "sources", "match", "decide", "plan",
    "evidence", "scan", "layerpaths",
}
APPLICATION = {"hook", "late", "guards", "training", "adaptive"}
TOOLS = {"", "__main__", "cli", "explain", "doctor", "bench.__main__"}
# The hook owns the report recorder (it installs it when AUTOALLOC_REPORT asks for a report).
WIRED = {("hook", "ab.recorder")}
# Arrows still to remove (none left).
PENDING: set[tuple[str, str]] = set()


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name relative to ``autoalloc`` ("" the package)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports, at module level or inside functions."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = [p for p in package[: len(package) - node.level + 1] if p]
                base = ".".join(["autoalloc", *up] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            short = target[len("autoalloc."):] if target.startswith("autoalloc.") else ""
            while short and short not in known:
                short = short.rpartition(".")[0]
            if short and short != name:
                found.add(short)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    edges = {name: imports(name, path, set(found)) for name, path in found.items()}
    for name, target in PENDING:
        edges[name].discard(target)
    return edges


STARTUP = {"_startup": _startup, "_loader": _loader}  # armed at start-up, and what it loads


def part(name: str) -> int:
    if name in STARTUP:
        return 0
    for level, names in enumerate((LEAVES, DECISION, APPLICATION), start=1):
        if name in names:
            return level
    if name in TOOLS:
        return 5
    if name.startswith(("ab", "bench")):
        return 4  # measurement
    raise AssertionError(f"autoalloc.{name} belongs to no part of the layout: add it here")


def test_every_module_has_a_part() -> None:
    for name in modules():
        part(name)


def allowed(name: str, target: str) -> bool:
    """Whether ``name`` may import ``target``: its own part or a lower one."""
    if (name, target) in WIRED:
        return True
    if name == "_startup":
        return False  # it imports _autoalloc_loader, the top-level copy of _loader
    if name == "_loader":
        return target == "hook"  # lazily, when torch executes
    low, high = sorted((part(name), part(target)))
    if part(target) == 0 or (low, high) == (3, 4):
        return False  # nothing imports the start-up module; application and measurement: beside
    return part(target) <= part(name)


def test_imports_point_down() -> None:
    """No arrow back up: decision never imports application, measurement or tools, and so on."""
    edges = graph()
    upward = [f"{a} -> {b}" for a in edges for b in sorted(edges[a]) if not allowed(a, b)]
    assert upward == []


def test_no_import_loop() -> None:
    """No loop of modules importing each other (the start-up module's lazy import aside)."""
    edges = graph()
    edges["_startup"] = set()
    loops = []
    for start in edges:
        stack, seen = [(start, (start,))], set()
        while stack:
            name, route = stack.pop()
            for target in edges[name]:
                if target == start:
                    loops.append(" -> ".join((*route, start)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, (*route, target)))
    assert loops == []


@pytest.mark.parametrize("name", sorted(STARTUP))
def test_startup_copies_of_the_names_agree(name: str) -> None:
    """``_startup`` and ``_loader`` keep their own copies (they import nothing of the package
    before torch executes): the same values."""
    own = {k: v for k, v in vars(STARTUP[name]).items() if k.endswith("_VAR")}
    assert own and all(getattr(envvars, k) == v for k, v in own.items()), own
    literals = {
        node.value
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and str(node.value).startswith("AUTOALLOC_")
    }
    named = {v for k, v in vars(envvars).items() if k.endswith("_VAR")}
    assert literals and literals <= named, literals - named


@pytest.mark.parametrize("name", sorted(STARTUP))
def test_startup_names_the_variables_it_reads_and_only_those(name: str) -> None:
    """Each ``*_VAR`` of ``_startup`` and ``_loader`` is read there, and a variable is always
    read by its name, never typed again as a literal (a copy that nothing reads drifts
    unnoticed)."""
    tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
    defined = {k for k in vars(STARTUP[name]) if k.endswith("_VAR")}
    used = {
        node.id for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    assert defined - used == set()
    # a flag's truth, where the module has no truthy() of its own, is envvars'
    assigned = {
        id(node.value) for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
    }
    typed = [
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and str(node.value).startswith("AUTOALLOC_")
        and id(node) not in assigned
    ]
    assert typed == []
    imported = {
        alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    imported.discard("autoalloc")  # the package itself, at `import torch` only
    intro = (ast.get_docstring(tree) or "").split("\n\n")[1]
    assert all(f"``{name}``" in intro for name in imported), (imported, intro)


@pytest.mark.parametrize("value", [None, "", "1", "0", " TRUE ", "yes", "On", "no", "2", "off"])
def test_startup_truthy_agrees(value: str | None) -> None:
    assert _startup.truthy(value) == envvars.truthy(value)


@pytest.mark.parametrize(
    ("environ", "rank"),
    [
        ({}, None),
        ({"RANK": "0"}, 0),
        ({"RANK": "3", "SLURM_PROCID": "0"}, 3),
        ({"SLURM_PROCID": "2"}, 2),
        ({"OMPI_COMM_WORLD_RANK": "1"}, 1),
        ({"PMI_RANK": "5"}, 5),
        ({"RANK": "x"}, None),
    ],
)
def test_one_global_rank_for_warnings_reports_and_progress(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], rank: int | None
) -> None:
    """Warnings (rank 0 speaks), report names and the ab progress file read the same rank."""
    from autoalloc.ab import recorder

    for name in envvars.REPORTED_RANK_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert envvars.global_rank() == rank
    recorded = envvars.rank_vars()
    if rank is not None:
        assert envvars.global_rank(recorded) == rank
        path = recorder.report_path("/x/report.json", 1, recorded)
        assert path == ("/x/report.json" if rank == 0 else f"/x/report-rank{rank}.json")


def test_test_modules_take_helpers_from_helpers_not_conftest() -> None:
    """Fixtures live in conftest.py, which pytest loads; what modules import is in helpers.py."""
    tests = Path(__file__).resolve().parent
    importing = [
        path.name
        for path in sorted(tests.rglob("*.py"))
        if path.name != "conftest.py"
        and re.search(r"^\s*(from\s+(tests)?\.?conftest\s|import\s+tests\.conftest)",
                      path.read_text(encoding="utf-8"), re.MULTILINE)
    ]
    assert importing == []


def _sys_modules_keys(tree: ast.AST) -> list[ast.expr]:
    """The keys of every ``sys.modules[KEY]`` and ``sys.modules.get/pop/setdefault(KEY)``."""
    def is_sys_modules(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "modules" and \
            isinstance(node.value, ast.Name) and node.value.id == "sys"

    keys = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_sys_modules(node.value):
            keys.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "pop", "setdefault") and \
                is_sys_modules(node.func.value) and node.args:
            keys.append(node.args[0])
    return keys


def test_no_module_of_autoalloc_reaches_another_through_sys_modules() -> None:
    """autoalloc's modules reach each other by import (which the layout above sees), never by
    a lookup in ``sys.modules``; a module may look itself up (``__name__``: the start-up
    module is its own finder), and look up the program's modules and torch's."""
    for name, path in modules().items():
        for key in _sys_modules_keys(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(key, ast.Constant):
                assert not str(key.value).startswith(("autoalloc", "_autoalloc")), (name, key.value)
            else:
                text = ast.unparse(key)
                assert text == "__name__", f"{name}: sys.modules[{text}] may be autoalloc's own"


def test_module_state_is_not_rebound_with_global() -> None:
    """Module state that changes lives on an object (the hook's ``State``): at most two
    ``global`` statements in the package, each a one-shot flag of its own module."""
    found = [
        (name, node.names)
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Global)
    ]
    assert len(found) <= 2, found
