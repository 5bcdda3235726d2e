"""One pipeline decides for the hook, ``explain`` and ``doctor``.

End to end, case by case: a real program with the hook (which decides at ``import torch``)
asks ``autoalloc.status()`` (doctor's report) for the decision it records, and ``explain``
is asked about the same command, environment and working directory: they agree. In
process: ``plan()`` and ``explain()`` on a missing ``AUTOALLOC_CONFIG``, the launcher
hand-off, ``--import``; end to end, the warning a missing ``AUTOALLOC_CONFIG`` gives once
per job, and ``autoalloc check`` failing on it.
"""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass, field

import pytest

from autoalloc import entrypoint, sources
from autoalloc.explain import explain, render
from autoalloc.plan import plan, utf8_entry
from autoalloc.torchinfo import TorchInfo
from tests.helpers import NEMO, Sandbox, autoalloc_warnings

CUDA = TorchInfo("2.14.1", cuda="13.0")


REPORT = textwrap.dedent(
    """
    import json
    import torch
    import autoalloc
    decision = autoalloc.status().as_dict()["decision"]
    print("DOCTOR " + json.dumps(decision))
    """
)


@dataclass(frozen=True)
class Case:
    script: str
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    imports: tuple[str, ...] = ()  # trigger modules the script imports before torch


MISSING = "<root>/no-such-policy.toml"
CASES = {
    "matching": Case(NEMO),
    "non-matching": Case("tools/other.py"),
    "disabled-by-env": Case(NEMO, env={"AUTOALLOC_DISABLE": "1"}),
    "enabled-false": Case(NEMO, files={"autoalloc.toml": "enabled = false\n"}),
    "skip-rule": Case("NeMo/examples/asr/transcribe_speech.py"),
    "env-conflict": Case(NEMO, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}),
    "override": Case(
        NEMO,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
        files={"autoalloc.toml": 'on_conflict = "override"\n'},
    ),
    "missing-autoalloc-config": Case("tools/other.py", env={"AUTOALLOC_CONFIG": MISSING}),
    "import-trigger": Case(
        "notebooks/run.py",
        files={
            "site/nemo/__init__.py": "",
            "site/nemo/collections/__init__.py": "",
            "site/nemo/collections/asr/__init__.py": "",
            # the built-in toolkit trigger waits for an optimizer: a rule that fires at the import
            "autoalloc.toml": '[[rules]]\nname = "nb"\nimports = ["nemo.collections.asr"]\n',
        },
        imports=("nemo.collections.asr",),
    ),
}
COMPARED = ("action", "rule", "rule_source", "read_var", "value", "writes", "unsets", "warnings")


# Each case is one more decision kind on which they agree: two in the quick run, all with --full.
QUICK = ("matching", "non-matching")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in QUICK else pytest.mark.slow) for n in CASES]
)
def test_hook_explain_and_doctor_agree(sandbox: Sandbox, name: str) -> None:
    case = CASES[name]
    for path, text in case.files.items():
        sandbox.write(path, text)
    env = {k: v.replace("<root>", str(sandbox.root)) for k, v in case.env.items()}
    if any(path.startswith("site/") for path in case.files):
        env["PYTHONPATH"] = str(sandbox.work / "site")
    body = "".join(f"import {module}\n" for module in case.imports) + REPORT
    sandbox.write(case.script, body)
    result = sandbox.run([case.script], env=env)
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("DOCTOR "))
    doctor = json.loads(line.split(" ", 1)[1])

    full_env = {**sandbox.env, **env}
    explained = explain(["python", case.script], full_env, str(sandbox.work), case.imports)
    said = explained["decision"]
    if doctor is None:  # AUTOALLOC_DISABLE: the startup hook did not even arm, nor reads layers
        assert said["action"] == "disabled" and said["reason"] == "AUTOALLOC_DISABLE is set"
        assert "decision:     disabled (AUTOALLOC_DISABLE is set)" in render(explained)
        assert explained["layers"] == []
        return
    assert {k: doctor[k] for k in COMPARED} == {k: said[k] for k in COMPARED}
    assert doctor["entry_point"] == said["entry_point"]


def world_env(sandbox: Sandbox, **extra: str) -> dict[str, str]:
    return {**sandbox.env, **extra}


def test_missing_autoalloc_config_is_an_error_layer(sandbox: Sandbox) -> None:
    missing = str(sandbox.root / "nope.toml")
    env = world_env(sandbox, AUTOALLOC_CONFIG=missing)
    entry = entrypoint.parse(["python", "-c", "pass"])
    result = plan(entry, env, str(sandbox.work), CUDA)
    layer = next(s for s in result.policy.layers if s.layer == "env")
    assert (layer.path, layer.status) == (missing, "error")
    assert result.decision.action == "none"
    assert [w for w in result.decision.warnings if missing in w] == [
        f"autoalloc: ignoring the env policy {missing}: "
        "AUTOALLOC_CONFIG names a file that does not exist"
    ]


def test_launcher_hand_off_and_imports(sandbox: Sandbox) -> None:
    sandbox.write(NEMO, "")
    cwd = str(sandbox.work)
    launcher = entrypoint.parse(
        ["python", "-m", "torch.distributed.run", "--nproc_per_node=2", NEMO], cwd
    )
    result = plan(launcher, sandbox.env, cwd, CUDA)
    assert result.workers is not None and result.decided_for.target.endswith(NEMO)
    assert result.decision.action == "apply" and result.decision.rule == "nemo-asr-train"
    code = entrypoint.parse(["python", "-c", "pass"], cwd)
    assert plan(code, sandbox.env, cwd, CUDA).decision.action == "none"
    assert plan(code, sandbox.env, cwd, CUDA, ["nemo.collections.asr"]).decision.action == "none"
    nemo = plan(code, sandbox.env, cwd, CUDA, ["nemo.collections.asr"], trains=True).decision
    assert nemo.action == "apply" and nemo.trigger == "nemo.collections.asr"
    report = explain(["python", "-c", "pass"], env=sandbox.env, cwd=cwd, imported=["vllm"])
    assert report["decision"]["action"] == "skip" and report["imported"] == ["vllm"]


def test_imports_torch_means_every_torch_process(sandbox: Sandbox) -> None:
    sandbox.write("autoalloc.toml", '[[rules]]\nname = "all-torch"\nimports = ["torch"]\n')
    code = entrypoint.parse(["python", "-c", "pass"], str(sandbox.work))
    decision = plan(code, sandbox.env, str(sandbox.work), CUDA).decision
    assert (decision.action, decision.rule, decision.trigger) == ("apply", "all-torch", "torch")


def test_surrogate_escaped_paths_match_as_utf8() -> None:
    raw = "/w/train" + "".join(chr(0xDC00 + b) for b in "é🎤".encode()) + ".py"
    entry = entrypoint.EntryPoint("script", raw, (raw,), raw, raw)
    fixed = utf8_entry(entry)
    assert fixed.target == fixed.path == fixed.realpath == "/w/train\u00e9\U0001f3a4.py"
    assert fixed.args == (fixed.path,)
    assert (
        utf8_entry(entrypoint.EntryPoint("script", "/w/\udcff.py")).target == "/w/\udcff.py"
    )  # not UTF-8


def test_cwd_below_an_unsearchable_directory_is_traced_not_warned(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory on the way that cannot be searched (chmod 000, not root): no warning."""
    locked = sandbox.root / "locked"
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if str(path).startswith(str(locked) + os.sep):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setenv("AUTOALLOC_DEBUG", "1")
    entry = entrypoint.EntryPoint("code")
    policy = sources.load(entry, sandbox.env, str(locked / "work"))
    project = next(s for s in policy.layers if s.layer == "project")
    assert project.status == "missing"
    assert "cannot examine" in capsys.readouterr().err


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root searches any directory"
)
def test_cwd_below_chmod_000_end_to_end(sandbox: Sandbox) -> None:
    work = sandbox.root / "locked" / "work"
    work.mkdir(parents=True)
    code = f"import os; os.chdir({str(work)!r}); os.chmod('..', 0); import torch"
    try:
        result = sandbox.run(["-c", code], cwd=sandbox.root)
    finally:
        work.parent.chmod(0o755)
    assert result.returncode == 0 and autoalloc_warnings(result.stderr) == [], result.stderr


@pytest.mark.slow  # once per job: test_e2e_core::test_a_bad_policy_file_warns_once_per_job
def test_missing_autoalloc_config_warns_once_per_job(sandbox: Sandbox) -> None:
    missing = str(sandbox.root / "nope.toml")
    child = sandbox.script("child.py")
    parent = sandbox.script(
        "parent.py",
        "import subprocess, sys\nimport torch\n"
        f"subprocess.run([sys.executable, {str(child)!r}], check=True)\n",
        probe=False,
    )
    result = sandbox.run([str(parent)], env={"AUTOALLOC_CONFIG": missing})
    assert result.returncode == 0, result.stderr
    warned = autoalloc_warnings(result.stderr)
    assert len(warned) == 1 and missing in warned[0] and "does not exist" in warned[0], (
        result.stderr
    )


def test_check_fails_on_a_missing_autoalloc_config(sandbox: Sandbox) -> None:
    missing = str(sandbox.root / "nope.toml")
    result = sandbox.run(["-m", "autoalloc", "check"], env={"AUTOALLOC_CONFIG": missing})
    assert result.returncode == 1
    assert f"error  {missing}: AUTOALLOC_CONFIG names a file that does not exist" in result.stdout
    named = sandbox.write("named.toml", '[[rules]]\nname = "a"\nscripts = ["x.py"]\n')
    ok = sandbox.run(["-m", "autoalloc", "check"], env={"AUTOALLOC_CONFIG": str(named)})
    assert ok.returncode == 0 and f"ok     {named}" in ok.stdout


def test_explain_import_option(sandbox: Sandbox) -> None:
    result = sandbox.run(
        [
            "-m",
            "autoalloc",
            "explain",
            "--json",
            "--import",
            "vllm",
            "--import",
            "nemo.collections.asr",
            "--",
            "python",
            "-c",
            "pass",
        ]
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["imported"] == ["nemo.collections.asr", "vllm"]
    assert data["decision"]["action"] == "skip"  # llm-serving comes first in match order
