"""What tests share that is not a fixture: paths, the torch probe, assertions, ``Sandbox``.

Imported by test modules (``from tests.helpers import ...``); fixtures live in
``conftest.py``, which pytest loads itself and no test module imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from autoalloc import policy, sources
from autoalloc.envvars import RANK_VARS
from autoalloc.policy import LayerConfig, LayerStatus, Policy, PolicyError, Source, compose

REPO = Path(__file__).resolve().parents[1]


def find_project(start: str | None) -> LayerStatus | None:
    """The nearest project policy searched upward from ``start``, without ownership checks
    (the project layer of ``sources.read_layers`` without the files passed over)."""
    return sources._find(start, None)[0]


def validate(data: object, source: Source, allow_trust: bool = False) -> LayerConfig:
    """A parsed policy document checked strictly: PolicyError for its first mistake (the
    package salvages what it can instead: ``policy.salvage``)."""
    config, problems = policy._layer(data, source, allow_trust)
    if problems:
        raise PolicyError(problems[0].text)
    return config
PY = sys.executable
CUDA_PY = os.environ.get("AUTOALLOC_TORCH_CUDA_PYTHON", "")
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

# Prints, as one JSON line, what torch itself read (the getter freezes the config, so it is
# called only here, after the decision) and the allocator variables of the environment.
PROBE = textwrap.dedent(
    """
    import json as _json, os as _os, sys as _sys
    import torch as _torch
    ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    _report = {
        "getter": _torch._C._accelerator_getAllocatorSettings(),
        "env": {k: _os.environ.get(k) for k in ALLOC_VARS},
        "applied": _os.environ.get("AUTOALLOC_APPLIED"),
        "cuda_build": _torch.version.cuda is not None,
    }
    if _torch.version.cuda is not None:
        _s = _torch.cuda.memory._snapshot()["allocator_settings"]
        _report["snapshot_expandable_segments"] = _s["expandable_segments"]
        _report["snapshot_max_split_size"] = _s["max_split_size"]
    # one write: ranks and workers may share the pipe
    _sys.stdout.write("AUTOALLOC_PROBE " + _json.dumps(_report) + "\\n")
    _sys.stdout.flush()
    """
)


def probe_result(stdout: str) -> dict:
    """The JSON the PROBE printed (the last one, for scripts that probe twice)."""
    lines = [line for line in stdout.splitlines() if line.startswith("AUTOALLOC_PROBE ")]
    assert lines, f"probe did not run; stdout was:\n{stdout}"
    return json.loads(lines[-1].split(" ", 1)[1])


ES = "expandable_segments:True"
# Laid out like NeMo's CTC trainer: the built-in rule nemo-asr-train matches it.
NEMO = "NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py"


def assert_applied(result: subprocess.CompletedProcess[str], rule: str | None = None, expected: str = ES) -> dict:
    """The process ran cleanly and torch read ``expected`` (applied by ``rule``, when given)."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == expected, result.stderr
    assert probe["env"]["PYTORCH_CUDA_ALLOC_CONF"] == expected
    if rule is not None:
        assert probe["applied"] == f"{rule};{expected}"
    if probe["cuda_build"]:  # torch 2.14.1 CUDA: what the CUDA allocator itself parsed
        assert probe["snapshot_expandable_segments"] is (ES in expected)
    return probe


def assert_untouched(result: subprocess.CompletedProcess[str]) -> dict:
    """The process ran cleanly and autoalloc left torch's allocator variables alone."""
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == "", probe
    assert probe["env"] == dict.fromkeys(ALLOC_VARS)
    assert probe["applied"] is None
    if probe["cuda_build"]:
        assert probe["snapshot_expandable_segments"] is False
    return probe


def autoalloc_warnings(stderr: str) -> list[str]:
    """The AutoallocWarning lines of a process's stderr."""
    return [line for line in stderr.splitlines() if "AutoallocWarning" in line]


@dataclass
class Sandbox:
    """An isolated world for one test: HOME, XDG dirs, a project directory and a clean env."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def user_config(self) -> Path:
        return self.root / "xdg-config" / "autoalloc" / "config.toml"

    @property
    def site_config(self) -> Path:
        return self.root / "xdg-site" / "autoalloc" / "config.toml"

    def write(self, relpath: str | Path, text: str, base: Path | None = None) -> Path:
        path = (base or self.work) / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    def user_policy(self, text: str) -> Path:
        return self.write(self.user_config, text, base=Path("/"))

    def site_policy(self, text: str) -> Path:
        return self.write(self.site_config, text, base=Path("/"))

    def script(self, relpath: str, body: str = "", probe: bool = True) -> Path:
        """A script under the project directory that (by default) imports torch and probes."""
        return self.write(relpath, textwrap.dedent(body) + (PROBE if probe else ""))

    def run(
        self,
        args: list[str],
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        python: str = PY,
        input: str | None = None,
        timeout: float = 180,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**self.env, **(env or {})}
        full_env = {k: v for k, v in full_env.items() if v is not None}
        return subprocess.run(
            [python, *args] if python else args,
            cwd=cwd or self.work,
            env=full_env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def clean_env(root: Path) -> dict[str, str]:
    """os.environ without anything that would change autoalloc's or torch's allocator
    behaviour, plus a fixed HOME and config directories, and one OpenMP thread (below)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AUTOALLOC_", "PYTORCH_", "PYTHON", "XDG_", "TORCH_"))
        and k not in ("VIRTUAL_ENV", *RANK_VARS)  # a distributed job's rank > 0 would silence warnings
    }
    env.update(
        HOME=str(root / "home"),
        XDG_CONFIG_HOME=str(root / "xdg-config"),
        XDG_CONFIG_DIRS=str(root / "xdg-site"),
        PYTHONIOENCODING="utf-8",
        # torch's first-import numpy probe and friends must not be mistaken for our output.
        TORCH_CPP_LOG_LEVEL="ERROR",
        # One OpenMP thread: the tests start many interpreters at once on few cores, where the
        # spinning threads of each `import torch` took a third of its CPU time.
        OMP_NUM_THREADS="1",
    )
    return env


TORCH_PYTHONS = [
    pytest.param(PY, id="torch-2.13-cpu"),
    pytest.param(
        CUDA_PY,
        id="torch-2.14.1-cuda",
        marks=[
            pytest.mark.cuda_build,
            pytest.mark.skipif(not CUDA_PY, reason="AUTOALLOC_TORCH_CUDA_PYTHON is not set (scripts/test.sh --full sets it)"),
        ],
    ),
]


def policy_of(**toml: object) -> Policy:
    """The policy of one project file (``/w/autoalloc.toml``) holding ``toml``."""
    return compose([validate(dict(toml), Source("project", "/w/autoalloc.toml"))])
