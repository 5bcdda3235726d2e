"""``autoalloc doctor`` and ``autoalloc.status()``: what torch itself reports, end to end.

Golden JSON (paths and versions normalized) for a process a rule matches and one no rule
matches, on torch 2.13 CPU and 2.14.1 CUDA; exit status 1 when the intent is not in
effect; ``status()`` from a training script; the hook not live (``-S``), switched off,
inherited from a parent, and a value that would make ``import torch`` abort.
Regenerate the golden files with ``AUTOALLOC_REGEN_GOLDEN=1`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CUDA_PY, PY, REPO, Sandbox, autoalloc_warnings

GOLDEN = Path(__file__).parent / "golden"
CUDA, ALLOC = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"
DOCTOR_RULE = """\
[allocator]
garbage_collection_threshold = 0.8

[[rules]]
name = "doctor-itself"
modules = ["autoalloc"]
"""


def doctor(sandbox: Sandbox, python: str, env: dict[str, str] | None = None, *args: str):
    return sandbox.run(["-m", "autoalloc", "doctor", *args], env=env, python=python)


def normalize(data: Any, sandbox: Sandbox, report: dict) -> Any:
    """Paths and versions of this machine replaced by placeholders."""
    torch_dir = report["torch"]["path"]
    swaps = [
        (str(sandbox.root), "<SANDBOX>"),
        (os.path.dirname(torch_dir), "<SITE>"),
        (report["autoalloc"]["path"], "<AUTOALLOC>"),
        (report["python"]["executable"], "<PYTHON>"),
        (report["torch"]["version"], "<TORCH>"),
    ]

    def fix(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, str):
            for old, new in swaps:
                value = value.replace(old, new)
        return value

    out = fix(data)
    out["python"]["version"] = "<PY>"
    out["autoalloc"]["version"] = "<VERSION>"
    return out


def check_golden(name: str, result, sandbox: Sandbox) -> dict:
    report = json.loads(result.stdout)
    data = normalize(report, sandbox, report)
    path = GOLDEN / f"doctor_{name}_{report['torch']['flavour']}.json"
    if os.environ.get("AUTOALLOC_REGEN_GOLDEN"):  # review the diff like code
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert data == json.loads(path.read_text()), f"differs from {path.name} (AUTOALLOC_REGEN_GOLDEN=1 rewrites it)"
    return report


def test_doctor_golden_matching_process(sandbox: Sandbox, torch_python: str) -> None:
    """A project rule matches doctor itself: it applies, and torch reports the option."""
    sandbox.write("autoalloc.toml", DOCTOR_RULE)
    result = doctor(sandbox, torch_python, {CUDA: "max_non_split_rounding_mb:64"}, "--json")
    assert result.returncode == 0, result.stderr
    assert autoalloc_warnings(result.stderr) == []
    report = check_golden("matching", result, sandbox)
    assert report["ok"] is True and report["decision"]["rule"] == "doctor-itself"
    assert report["in_effect"]["expandable_segments"]["ok"] is True
    if report["torch"]["flavour"] == "cuda":  # parsed by the CUDA allocator itself
        assert report["in_effect"]["expandable_segments"]["reported_by"] == "snapshot"
        assert report["torch_reports"]["snapshot"]["expandable_segments"] is True
        assert report["torch_reports"]["snapshot"]["garbage_collection_threshold"] == 0.8


def test_doctor_golden_non_matching_process(sandbox: Sandbox, torch_python: str) -> None:
    """No rule matches doctor: nothing to verify, but a matching job here would be told about the conflicts."""
    env = {CUDA: "expandable_segments:False", ALLOC: "garbage_collection_threshold:0.5"}
    result = doctor(sandbox, torch_python, env, "--json")
    assert result.returncode == 0, result.stderr
    report = check_golden("non_matching", result, sandbox)
    assert report["ok"] is True and report["decision"]["action"] == "none" and report["in_effect"] == {}
    job = report["matching_job"]["warnings"]
    assert any("uses only PYTORCH_CUDA_ALLOC_CONF and ignores PYTORCH_ALLOC_CONF" in w for w in job)
    assert any("keeping expandable_segments:False" in w for w in job)


def test_doctor_exits_1_when_the_intent_is_not_in_effect(sandbox: Sandbox) -> None:
    # a value autoalloc cannot parse is left as it is: the rule's expandable_segments never reaches torch
    sandbox.write("autoalloc.toml", DOCTOR_RULE)
    result = doctor(sandbox, PY, {CUDA: "roundup_power2_divisions:[]"}, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["summary"].startswith("NOT in effect: autoalloc meant expandable_segments:True")
    assert report["torch_reports"]["getter"] == "roundup_power2_divisions:[]"
    assert any("cannot parse PYTORCH_CUDA_ALLOC_CONF" in w for w in report["warnings"])


STATUS_SCRIPT = """
import json, warnings
import autoalloc
import torch
first = autoalloc.status()
print("FIRST", json.dumps({"ok": first.ok, "entry": first.decision["entry_point"], "summary": first.summary}))
print(first)
warnings.simplefilter("ignore")
torch.cuda.memory._set_allocator_settings("expandable_segments:False")
second = autoalloc.status()
print("SECOND", json.dumps({"ok": second.ok, "summary": second.summary, "problems": second.problems}))
"""


def test_status_from_a_training_script(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.write("proj/autoalloc.toml", '[[rules]]\nname = "asr"\nscripts = ["train_asr.py"]\n')
    script = sandbox.write("proj/train_asr.py", STATUS_SCRIPT)
    result = sandbox.run([str(script)], python=torch_python)
    assert result.returncode == 0, result.stderr
    first = json.loads(result.stdout.split("FIRST ", 1)[1].splitlines()[0])
    assert first == {"ok": True, "entry": f"script {script}", "summary": "in effect: torch uses expandable_segments:True"}
    assert "OK: in effect: torch uses expandable_segments:True" in result.stdout  # print(status) is the text form
    second = json.loads(result.stdout.split("SECOND ", 1)[1])
    source = "snapshot" if torch_python == CUDA_PY else "getter"
    assert second["ok"] is False
    assert second["summary"] == (
        f"NOT in effect: autoalloc meant expandable_segments:True; torch reports expandable_segments:False ({source})"
    )
    assert f"autoalloc meant expandable_segments:True, but torch reports expandable_segments:False ({source})" in second["problems"]


def test_doctor_hook_not_live_with_dash_S(sandbox: Sandbox) -> None:
    import site

    path = os.pathsep.join([str(REPO), *site.getsitepackages()])
    result = sandbox.run(["-S", "-m", "autoalloc", "doctor", "--json"], env={"PYTHONPATH": path})
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["hook"]["installed"] is True and report["hook"]["live"] is False
    assert report["hook"]["not_live_because"] == ["python -S: .pth files were not processed"]
    assert report["summary"] == "autoalloc's hook is not live in this interpreter"


@pytest.mark.slow  # doctor says why the hook is not live: test_doctor_hook_not_live_with_dash_S
def test_doctor_switched_off(sandbox: Sandbox) -> None:
    result = doctor(sandbox, PY, {"AUTOALLOC_DISABLE": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith("OK: autoalloc is switched off here")
    assert "note:         autoalloc is switched off here: AUTOALLOC_DISABLE is set" in result.stdout


def test_doctor_inside_a_job_checks_what_the_parent_applied(sandbox: Sandbox) -> None:
    applied = {CUDA: "expandable_segments:True", "AUTOALLOC_APPLIED": "asr;expandable_segments:True"}
    result = doctor(sandbox, PY, applied, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["decision"]["action"] == "inherited" and report["decision"]["rule"] == "asr"
    assert report["inherited"] == {
        "rule": "asr", "value": "expandable_segments:True", "torch_reads": CUDA, "current": "expandable_segments:True",
        "intact": True,
    }
    assert report["in_effect"]["expandable_segments"]["ok"] is True and report["ok"] is True
    # someone changed the variable after the parent applied it: the job's intent is gone
    changed = {**applied, CUDA: "max_split_size_mb:64"}
    result = doctor(sandbox, PY, changed, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["inherited"]["intact"] is False
    assert any("changed after autoalloc set it" in p for p in report["problems"])


@pytest.mark.cuda_build
@pytest.mark.skipif(not CUDA_PY, reason="AUTOALLOC_TORCH_CUDA_PYTHON is not set (scripts/test.sh --full sets it)")
def test_doctor_does_not_import_a_torch_that_would_abort(sandbox: Sandbox) -> None:
    result = doctor(sandbox, CUDA_PY, {CUDA: "expandable_segments"}, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["torch_reports"]["imported"] is False and report["torch"]["flavour"] == "cuda"
    assert report["summary"].startswith(
        "torch was not imported: PYTORCH_CUDA_ALLOC_CONF='expandable_segments' makes `import torch` abort on torch 2.14.1"
    )
    assert any("abort `import torch` (SIGABRT)" in w for w in report["matching_job"]["warnings"])


@pytest.mark.hook
def test_status_stays_the_function_after_doctor_is_imported() -> None:
    import autoalloc
    import autoalloc.doctor

    assert autoalloc.status is autoalloc.doctor.status
    assert "status" in autoalloc.__all__ and "doctor" not in autoalloc.__all__
