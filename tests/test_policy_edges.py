"""No policy is ever silently ignored: autoalloc keys at the top level of a pyproject.toml,
a ``[tool.autoalloc]`` table under another name, mistyped rule names in ``disable``/``enable``,
a pyproject.toml that cannot be inspected, ``init`` where a project policy applies already,
a closed pipe, an ``AUTOALLOC_DISABLE`` value that is neither true nor false."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoalloc import cli, envvars, layerpaths, schema, sources
from autoalloc.entrypoint import EntryPoint
from tests.helpers import (
    NEMO,
    PROBE,
    Sandbox,
    assert_applied,
    assert_untouched,
    autoalloc_warnings,
    find_project,
)

# A script that imports torch, then starts a child that imports torch too (one job), then
# probes: a warning is given once per job, not once per process.
JOB = (
    "import subprocess, sys\nimport torch\n"
    "subprocess.run([sys.executable, '-c', 'import torch'], check=True)\n" + PROBE
)


def autoalloc_cmd(
    sandbox: Sandbox, *argv: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return sandbox.run(["-m", "autoalloc", *argv], cwd=cwd)


# ---------------------------------------------------------------- keys in the wrong place

PASTED = """\
[project]
name = "x"

[tool.autoalloc]
disable = ["nemo-asr-trian"]
enable = ["audio_training"]

[[rules]]
name = "my-asr-train"
scripts = ["**/train_asr*.py"]
"""


def test_pasted_rules_and_mistyped_names_are_said_once_per_job(sandbox: Sandbox) -> None:
    sandbox.write("pyproject.toml", PASTED)
    script = sandbox.write(NEMO, JOB)
    run = sandbox.run([str(script)])
    assert_applied(run, "nemo-asr-train")  # the mistyped disable switched nothing off
    (warning,) = autoalloc_warnings(run.stderr)  # parent and child: one job, one warning
    assert "[[rules]] is at the top level of pyproject.toml" in warning
    assert "write [[tool.autoalloc.rules]]" in warning
    assert "'nemo-asr-trian' \N{EM DASH} did you mean 'nemo-asr-train'?" in warning
    assert "'audio_training' \N{EM DASH} did you mean 'audio-training'?" in warning
    check = autoalloc_cmd(sandbox, "check")
    assert check.returncode == 1, check.stdout
    assert "ok " not in check.stdout.split("pyproject.toml")[-1]
    assert "write [[tool.autoalloc.rules]]. Its 1 rule is ignored." in check.stdout
    assert "did you mean 'nemo-asr-train'?" in check.stdout
    explain = autoalloc_cmd(sandbox, "explain", "--", "python", str(script))
    assert "write [[tool.autoalloc.rules]]" in explain.stdout
    assert "did you mean 'audio-training'?" in explain.stdout


def test_top_level_keys_without_a_table_are_a_broken_policy(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(
        'disable = ["hf-asr-examples"]\n[project]\nname = "x"\ndependencies = ["autoalloc"]\n'
        '[allocator]\nexpandable_segments = true\n'
    )
    found = find_project(str(tmp_path))
    assert found is not None and found.status == "error"
    assert "tool.autoalloc.disable = [...]" in found.message
    assert "write [tool.autoalloc.allocator]" in found.message
    # Another tool's top-level [[rules]] in a file that never names autoalloc is not ours.
    path.write_text('[project]\nname = "x"\n[[rules]]\nid = "E1"\n')
    assert find_project(str(tmp_path)) is None
    # ... but autoalloc's rule, pasted without [tool.autoalloc], is.
    path.write_text('[[rules]]\nname = "r"\nscripts = ["a.py"]\n')
    found = find_project(str(tmp_path))
    assert found is not None and "[[tool.autoalloc.rules]]" in found.message


AS_KEY = [  # a pyproject.toml, and what reading it finds: autoalloc named as a key is parsed
    ('[tool.autoalloc]\nenabled = false\n', "table"),
    ('[ tool . "autoalloc" ]\n', "table"),
    ("[[tool.autoalloc.rules]]\n", "table"),
    ('[tool]\nautoalloc = { enabled = false }\n', "table"),
    ('[tool]\n"autoalloc".enabled = false\n', "table"),
    ("tool.autoalloc.enabled = false\n", "table"),
    ('tool = {black = {}, "autoalloc" = {enabled = false}}\n', "table"),
    ('[tool.poetry.dependencies]\nautoalloc = "^0.1"\n', "no table"),  # parsed, remembered
    ("[tool.autoalloc\nnot toml", "broken"),
    ('[tool]\nautoalloc\n', "broken"),
    ('[project]\ndependencies = ["torch", "autoalloc"]\n', "not parsed"),
    ('[project]\ndependencies = [\n  "autoalloc"]\n', "not parsed"),
    ('[project]\ndependencies = [\n  "autoalloc>=0.1",\n  "autoalloc[torch]==0.2",  # ASR\n]\n',
     "not parsed"),
    ('[project]\ndescription = "autoalloc for ASR"\r\n', "not parsed"),
]


@pytest.mark.parametrize("text, found", AS_KEY)
def test_autoalloc_is_read_as_a_key_wherever_toml_could_have_it_so(
    tmp_path: Path, text: str, found: str
) -> None:
    data = text.encode()
    assert sources._as_key(data, b"autoalloc") is (found != "not parsed")
    try:
        table = sources._table(str(tmp_path / "pyproject.toml"), data)[0]
        read = "table" if table is not None else "no table"
    except sources.LayerError:
        read = "broken"
    assert read == found.replace("not parsed", "no table")


PASTED_BESIDE_A_DEPENDENCY = [  # autoalloc named only as a dependency, its keys at the top
    ('disable = ["hf-asr-examples"]\n[project]\ndependencies = ["autoalloc"]\n',
     "tool.autoalloc.disable = [...]"),
    ('# pasted\n\nenabled = false\n[project]\ndependencies = ["autoalloc"]\n',
     "tool.autoalloc.enabled = ..."),
    ('[project]\ndependencies = ["autoalloc"]\n[module_sets]\nmine = ["foo"]\n',
     "write [tool.autoalloc.module_sets]"),
    ('[project]\ndependencies = ["autoalloc"]\n[[wrappers]]\nname = "w"\n',
     "write [[tool.autoalloc.wrappers]]"),
]


@pytest.mark.parametrize(("text", "right"), PASTED_BESIDE_A_DEPENDENCY)
def test_autoalloc_keys_at_the_top_beside_a_dependency_are_a_broken_policy(
    tmp_path: Path, text: str, right: str
) -> None:
    (tmp_path / "pyproject.toml").write_text(text)
    found = find_project(str(tmp_path))
    assert found is not None and found.status == "error" and right in found.message


def test_a_dependency_among_pyprojects_own_tables_is_not_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = ('# a project\n[build-system]\nrequires = ["hatchling"]\n[project]\nname = "x"\n'
            'dependencies = [\n  "autoalloc",\n  "torch",\n]\n[project.optional-dependencies]\n'
            'gpu = ["autoalloc"]\n[ "tool" . black ]\nline-length = 100\n[dependency-groups]\n'
            'dev = ["autoalloc"]\n[[tool.mypy.overrides]]\nmodule = "x"\n')  # fmt: skip
    (tmp_path / "pyproject.toml").write_text(text)
    monkeypatch.setattr(sources, "parse_toml", lambda data: pytest.fail("parsed"))
    assert find_project(str(tmp_path)) is None
    assert layerpaths.PYPROJECT_OWN == tuple(n.encode() for n in schema.PYPROJECT_OWN)


MISNAMED = [
    ('[tool.auto-alloc]\nenabled = false\n', "[tool.auto-alloc]", "write [tool.autoalloc]."),
    ('[tool.auto_alloc]\nenabled = false\n', "[tool.auto_alloc]", "write [tool.autoalloc]."),
    ("[autoalloc]\nenabled = false\n", "[autoalloc]", "write [tool.autoalloc]."),
    ('[[autoalloc.rules]]\nname = "r"\nscripts = ["a.py"]\n', "[[autoalloc.rules]]",
     "write [[tool.autoalloc.rules]]."),
]


@pytest.mark.parametrize(("text", "wrote", "right"), MISNAMED)
def test_a_misnamed_table_is_a_broken_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, wrote: str, right: str
) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n' + text)
    found = find_project(str(tmp_path))
    assert found is not None and found.status == "error"
    assert f"{wrote} in pyproject.toml is not read by autoalloc: {right}" in found.message
    # Beside a [tool.autoalloc] table, the table applies and the other is named.
    path.write_text("[tool.autoalloc]\nenabled = true\n" + text)
    found = find_project(str(tmp_path))
    assert found is not None and found.status == "found" and right in found.message
    (problem,) = sources.pyproject_problems(str(path), path.read_bytes())
    assert right in problem
    # A pyproject.toml that names no spelling of autoalloc is not parsed at all.
    monkeypatch.setattr(sources, "parse_toml", lambda data: pytest.fail("parsed"))
    path.write_text('[project]\nname = "x"\n[tool.black]\nline-length = 100\n')
    assert find_project(str(tmp_path)) is None


def test_a_misnamed_table_is_said_by_check_explain_and_once_per_job(sandbox: Sandbox) -> None:
    sandbox.write("pyproject.toml", '[tool.auto-alloc]\n[[tool.auto-alloc.rules]]\n'
                                    'name = "off"\nscripts = ["**/*.py"]\naction = "skip"\n')
    script = sandbox.write(NEMO, JOB)
    run = sandbox.run([str(script)])
    assert_applied(run, "nemo-asr-train")  # the skip rule is never read
    (warning,) = autoalloc_warnings(run.stderr)  # parent and child: one job, one warning
    said = "[[tool.auto-alloc.rules]] in pyproject.toml is not read by autoalloc: write " \
           "[[tool.autoalloc.rules]]"
    assert said in warning
    check = autoalloc_cmd(sandbox, "check")
    assert check.returncode == 1 and said in check.stdout, check.stdout
    explain = autoalloc_cmd(sandbox, "explain", "--", "python", str(script))
    assert said in explain.stdout


def test_a_disable_naming_a_builtin_rule_or_wrapper_is_no_mistake(tmp_path: Path) -> None:
    (tmp_path / "autoalloc.toml").write_text('disable = ["hf-asr-examples", "tts-train"]\n')
    layers = sources.read_layers(EntryPoint("unknown"), {}, str(tmp_path))
    project = next(layer for layer in layers if layer.layer == "project")
    assert project.status == "found" and project.message == ""
    wrapper = sources.builtin_wrappers()[0].name
    (tmp_path / "autoalloc.toml").write_text(f'disable = ["{wrapper}"]\nenable = ["nope-x"]\n')
    layers = sources.read_layers(EntryPoint("unknown"), {}, str(tmp_path))
    project = next(layer for layer in layers if layer.layer == "project")
    assert "enable: no rule is named 'nope-x'." in project.message
    assert wrapper not in project.message



def test_a_rule_name_mistyped_only_in_case_gets_a_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / "autoalloc.toml").write_text('disable = ["NeMo-ASR-Train"]\n')
    layers = sources.read_layers(EntryPoint("unknown"), {}, str(tmp_path))
    project = next(layer for layer in layers if layer.layer == "project")
    assert "'NeMo-ASR-Train' \N{EM DASH} did you mean 'nemo-asr-train'?" in project.message


def test_enable_given_a_boolean_means_enabled(tmp_path: Path) -> None:
    (tmp_path / "autoalloc.toml").write_text("enable = false\n")
    layers = sources.read_layers(EntryPoint("unknown"), {}, str(tmp_path))
    project = next(layer for layer in layers if layer.layer == "project")
    assert "enable must be a list of rule names \N{EM DASH} did you mean 'enabled'?" in (
        project.message)

# ---------------------------------------------------------------- a pyproject.toml not inspected


def _uninspectable(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:  # larger than the bounded search
        with open(path, "wb") as f:
            f.truncate(sources.MAX_SCAN + 1)


def test_an_uninspectable_pyproject_is_passed_over_silently(sandbox: Sandbox) -> None:
    """A monorepo's skip rule above a package whose pyproject.toml is a FIFO still applies."""
    skip = '[[rules]]\nname = "no-nemo"\nscripts = ["**/speech_to_text_*.py"]\naction = "skip"\n'
    sandbox.write("autoalloc.toml", skip)
    package = sandbox.work / "pkg"
    package.mkdir()
    _uninspectable(package / "pyproject.toml", "fifo")
    script = sandbox.script(f"pkg/{NEMO}")
    run = sandbox.run([str(script)])
    assert_untouched(run)
    assert autoalloc_warnings(run.stderr) == [], run.stderr
    check = autoalloc_cmd(sandbox, "check", cwd=package)
    assert check.returncode == 0, check.stdout
    notes = [line for line in check.stdout.splitlines() if line.startswith("note ")]
    assert len(notes) == 1 and "pkg/pyproject.toml: not a regular file" in notes[0]
    explain = autoalloc_cmd(sandbox, "explain", "--", "python", str(script))
    assert "rule no-nemo" in explain.stdout
    assert "skipped   " + str(package / "pyproject.toml") in explain.stdout


@pytest.mark.parametrize("kind", ["directory", "device", "huge"])
def test_other_uninspectable_pyprojects_do_not_end_the_search(tmp_path: Path, kind: str) -> None:
    (tmp_path / "autoalloc.toml").write_text("enabled = false\n")
    (tmp_path / "pkg").mkdir()
    _uninspectable(tmp_path / "pkg" / "pyproject.toml", kind)
    layers = sources.read_layers(EntryPoint("unknown"), {}, str(tmp_path / "pkg"))
    statuses = [(layer.path, layer.status) for layer in layers if layer.layer == "project"]
    assert statuses == [
        (str(tmp_path / "autoalloc.toml"), "found"),
        (str(tmp_path / "pkg" / "pyproject.toml"), "skipped"),
    ]


def test_a_large_pyproject_is_searched_for_autoalloc(tmp_path: Path) -> None:
    (tmp_path / "autoalloc.toml").write_text("enabled = false\n")
    big = tmp_path / "pkg" / "pyproject.toml"
    big.parent.mkdir()
    filler = b"# " + b"x" * 1000 + b"\n"
    big.write_bytes(b'[project]\nname = "x"\n' + filler * 2000)  # 2 MB, not ours
    found = find_project(str(big.parent))
    assert found is not None and found.path == str(tmp_path / "autoalloc.toml")
    big.write_bytes(filler * 1500 + b"[tool.autoalloc]\n" + filler * 500)  # ours, too large
    found = find_project(str(big.parent))
    assert found is not None and found.path == str(big) and found.status == "error"
    assert "larger than 1024 KiB" in found.message


def test_a_readable_pyproject_with_a_broken_table_stays_a_broken_policy(tmp_path: Path) -> None:
    (tmp_path / "autoalloc.toml").write_text("enabled = false\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text("[tool.autoalloc]\nenabled = \n")
    found = find_project(str(tmp_path / "pkg"))
    assert found is not None and found.status == "error" and "not valid TOML" in found.message


# ---------------------------------------------------------------- init where a policy applies

PYPROJECT_POLICY = '[project]\nname = "x"\n\n[tool.autoalloc]\ndisable = ["hf-asr-examples"]\n'


def test_init_names_the_policy_it_would_hide(sandbox: Sandbox) -> None:
    sandbox.write("pyproject.toml", PYPROJECT_POLICY)
    sub = sandbox.work / "sub"
    sub.mkdir()
    beside = autoalloc_cmd(sandbox, "init")
    assert beside.returncode == 1 and not (sandbox.work / "autoalloc.toml").exists()
    assert f"{sandbox.work / 'pyproject.toml'} holds the project policy here" in beside.stderr
    below = autoalloc_cmd(sandbox, "init", cwd=sub)
    assert below.returncode == 1 and not (sub / "autoalloc.toml").exists()
    assert "--force" in below.stderr and "--into-pyproject" in below.stderr
    forced = autoalloc_cmd(sandbox, "init", "--force", cwd=sub)
    assert forced.returncode == 0, forced.stderr
    text = (sub / "autoalloc.toml").read_text()
    assert "changes nothing" not in text  # it does change something: it says what
    assert f"replaces the project policy\n#   {sandbox.work / 'pyproject.toml'}" in text
    assert sources.parse_toml(text.encode()) == {}


def test_init_into_pyproject_appends_a_commented_section(sandbox: Sandbox) -> None:
    path = sandbox.write("pyproject.toml", '[project]\nname = "x"')  # no final newline
    first = autoalloc_cmd(sandbox, "init", "--into-pyproject")
    assert first.returncode == 0, first.stderr
    text = path.read_text()
    assert sources.parse_toml(text.encode()) == {"project": {"name": "x"}}  # changes nothing
    assert "changes nothing until you uncomment [tool.autoalloc]" in text
    again = autoalloc_cmd(sandbox, "init", "--into-pyproject")
    assert again.returncode == 1 and path.read_text() == text
    # Only a table of that name, or the commented section, counts: not a string naming it.
    path.write_text('[project]\nname = "x"\ndescription = "see [tool.autoalloc] below"\n')
    named = autoalloc_cmd(sandbox, "init", "--into-pyproject")
    assert named.returncode == 0, named.stderr
    assert "# [tool.autoalloc]" in path.read_text()
    # Uncommented, the section is a valid [tool.autoalloc] table in the right places.
    lines = text.splitlines()
    keys = ("# [", "# name", "# scripts", "# action")
    on = [line[2:] if line.startswith(keys) else line for line in lines]
    table = sources.parse_toml("\n".join(on).encode())["tool"]["autoalloc"]
    assert [r["name"] for r in table["rules"]] == ["my-asr-train", "my-inference"]
    assert table["allocator"] == {}


def test_init_writes_the_starter_where_nothing_applies(sandbox: Sandbox) -> None:
    sandbox.write("pyproject.toml", '[project]\nname = "x"\n')
    result = autoalloc_cmd(sandbox, "init")
    assert result.returncode == 0, result.stderr
    text = (sandbox.work / "autoalloc.toml").read_text()
    assert "changes nothing" in text and sources.parse_toml(text.encode()) == {}


# ---------------------------------------------------------------- a closed pipe


@pytest.mark.parametrize("valid", [True, False])
def test_check_into_a_closed_pipe_keeps_its_status(sandbox: Sandbox, valid: bool) -> None:
    sandbox.write("autoalloc.toml", "enabled = false\n" if valid else "enabled = 1\n")
    read, write = os.pipe()
    os.close(read)  # `autoalloc check | head -1` once head has gone
    try:
        result = subprocess.run(
            [sys.executable, "-m", "autoalloc", "check"], cwd=sandbox.work, env=sandbox.env,
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
        )
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == (0 if valid else 1)


def test_main_keeps_the_status_past_a_closed_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    class Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError

        def flush(self) -> None:
            raise BrokenPipeError

        def fileno(self) -> int:
            raise ValueError("no descriptor")

    monkeypatch.setattr(sys, "stdout", Gone())
    monkeypatch.setattr(cli, "_dispatch", lambda argv: print("x") or 3)
    assert cli.main([]) == 3


# ---------------------------------------------------------------- AUTOALLOC_DISABLE values


def test_disable_values() -> None:
    flag, problem = envvars.flag, envvars.disable_problem
    for value in ("1", "true", "YES", " on "):
        assert flag(value) == "on" and problem(value) is None
    for value in (None, "", "0", "False", "no", "OFF"):
        assert flag(value) == "off" and problem(value) is None
    assert flag("2") == "unclear" and "AUTOALLOC_DISABLE='2'" in (problem("2") or "")


def test_an_unclear_disable_value_disables_and_says_so_once(sandbox: Sandbox) -> None:
    script = sandbox.write(NEMO, JOB)
    run = sandbox.run([str(script)], env={"AUTOALLOC_DISABLE": "2"})
    assert_untouched(run)
    (warning,) = autoalloc_warnings(run.stderr)  # parent and child: one job, one warning
    assert "AUTOALLOC_DISABLE='2' is neither true" in warning
    explain = sandbox.run(["-m", "autoalloc", "explain", "--", "python", str(script)],
                          env={"AUTOALLOC_DISABLE": "2"})
    assert "disabled" in explain.stdout and "AUTOALLOC_DISABLE='2'" in explain.stdout
    check = sandbox.run(["-m", "autoalloc", "check"], env={"AUTOALLOC_DISABLE": "2"})
    assert check.returncode == 1 and "AUTOALLOC_DISABLE='2'" in check.stdout
