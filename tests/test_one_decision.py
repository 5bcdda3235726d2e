"""The hook, ``explain`` and ``doctor`` give the same decision, case by case.

Each case runs a real program with the hook (which decides at ``import torch``), asks
``autoalloc.status()`` (doctor's report) in that program for the decision it records, and
asks ``explain`` about the same command, environment and working directory.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field

import pytest

from autoalloc.explain import explain
from tests.conftest import NEMO, Sandbox

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
        },
        imports=("nemo.collections.asr",),
    ),
}
COMPARED = ("action", "rule", "rule_source", "read_var", "value", "writes", "unsets", "warnings")


@pytest.mark.parametrize("name", list(CASES))
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
    if doctor is None:  # AUTOALLOC_DISABLE: the startup hook did not even arm
        assert said["action"] == "disabled" and said["reason"] == "AUTOALLOC_DISABLE is set"
        return
    assert {k: doctor[k] for k in COMPARED} == {k: said[k] for k in COMPARED}
    assert doctor["entry_point"] == said["entry_point"]
