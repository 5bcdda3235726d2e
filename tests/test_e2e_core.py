"""End to end: real interpreters of the test venv, the real hook, real torch; torch says what it read."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from autoalloc import _startup
from autoalloc.explain import explain
from tests.helpers import (
    ES,
    NEMO,
    PROBE,
    Sandbox,
    assert_applied,
    assert_untouched,
    autoalloc_warnings,
    probe_result,
)


def test_builtin_rule_by_script_path(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.script(NEMO)
    result = sandbox.run([NEMO], python=torch_python)
    probe = assert_applied(result)
    assert probe["applied"] == "nemo-asr-train;expandable_segments:True"
    assert result.stderr == ""


@pytest.mark.slow  # a -m module end to end: test_launch_styles' ESPnet module; the user layer: below
def test_user_rule_by_module(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.user_policy('[[rules]]\nname = "mine"\nmodules = ["myproj.train*"]\n')
    sandbox.write("myproj/__init__.py", "")
    sandbox.script("myproj/train_ctc.py")
    assert_applied(sandbox.run(["-m", "myproj.train_ctc"], python=torch_python))


def test_project_rule_by_console_script(sandbox: Sandbox) -> None:
    sandbox.write(
        "pyproject.toml",
        '[project]\nname = "p"\n\n[tool.autoalloc]\n[[tool.autoalloc.rules]]\nname = "cli"\ncommands = ["my-train"]\n',
    )
    sandbox.write("myproj/__init__.py", "")
    sandbox.write("myproj/cli.py", "def main():\n" + "".join(f"    {line}\n" for line in PROBE.strip().splitlines()))
    import sys

    wrapper = sandbox.write(
        "bin/my-train",
        f"#!{sys.executable}\nimport re\nimport sys\nsys.path.insert(0, {str(sandbox.work)!r})\n"
        "from myproj.cli import main\nif __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n",
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    assert_applied(sandbox.run([str(wrapper)], python=""))


def test_non_matching_process_is_untouched_and_silent(sandbox: Sandbox, torch_python: str) -> None:
    result = sandbox.run(["-c", PROBE], python=torch_python)
    assert_untouched(result)
    assert result.stderr == ""


def armed() -> bool:
    return any(getattr(f, "autoalloc_watcher", False) for f in sys.meta_path)


DISABLE_SPELLINGS = ("1", "true", "YES", " on ")


@pytest.mark.hook
@pytest.mark.parametrize("value", [*DISABLE_SPELLINGS, "0", "", "no"])
def test_disable_spellings_arm_no_watcher(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """What the startup hook does with each spelling (one interpreter below proves the wiring)."""
    others = [f for f in sys.meta_path if not getattr(f, "autoalloc_watcher", False)]
    monkeypatch.setattr(sys, "meta_path", others)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # a loaded torch: nothing armed either
    monkeypatch.delenv("AUTOALLOC_ORIGINAL", raising=False)
    monkeypatch.setenv("AUTOALLOC_DISABLE", value)
    _startup.main()
    assert armed() is (value not in DISABLE_SPELLINGS)


def test_disable_env_and_enabled_false(sandbox: Sandbox, full: bool) -> None:
    sandbox.script(NEMO)
    assert_untouched(sandbox.run([NEMO], env={"AUTOALLOC_DISABLE": "YES"}))
    if not full:  # enabled = false end to end: test_untrusted's trusted foreign project
        return
    sandbox.write("NeMo/autoalloc.toml", "enabled = false\n")
    result = sandbox.run([NEMO])
    assert_untouched(result)
    assert result.stderr == ""


LAYER_RULE = '[[rules]]\nname = "asr"\nscripts = ["train_asr.py"]\n'


def gc_threshold(value: float) -> str:
    return f"[allocator]\ngarbage_collection_threshold = {value}\n"


@pytest.fixture
def in_process(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """The sandbox, with this process's HOME and XDG variables (platformdirs reads os.environ)."""
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS"):
        monkeypatch.setenv(name, sandbox.env[name])
    return sandbox


def decision(sandbox: Sandbox, script: Path, env: dict[str, str] | None = None) -> dict:
    """What the hook would decide for ``python script``, computed in process."""
    full_env = {**sandbox.env, **(env or {})}
    return explain(["python", str(script)], env=full_env, cwd=str(sandbox.work))["decision"]


def test_each_layer_wins_over_the_one_below(in_process: Sandbox) -> None:
    """The decision in process, one layer added at a time (the hook's own run: the test below)."""
    sandbox = in_process
    script = sandbox.script("train_asr.py")

    def decided(env: dict[str, str] | None = None) -> dict:
        return decision(sandbox, script, env)

    sandbox.site_policy(LAYER_RULE + gc_threshold(0.1))
    assert decided()["value"] == f"{ES},garbage_collection_threshold:0.1"
    sandbox.user_policy(gc_threshold(0.2))
    assert decided()["value"] == f"{ES},garbage_collection_threshold:0.2"
    sandbox.write("autoalloc.toml", gc_threshold(0.3))
    assert decided()["value"] == f"{ES},garbage_collection_threshold:0.3"
    env_file = sandbox.write(sandbox.root / "env.toml", gc_threshold(0.4), base=Path("/"))
    env = {"AUTOALLOC_CONFIG": str(env_file)}
    assert decided(env)["value"] == f"{ES},garbage_collection_threshold:0.4"
    # rules too: a higher layer's skip beats the lower layer's apply
    env_file.write_text('[[rules]]\nname = "no"\nscripts = ["train_asr.py"]\naction = "skip"\n')
    assert decided(env)["action"] == "skip"


def test_every_layer_present_the_environment_file_wins(sandbox: Sandbox) -> None:
    sandbox.script("train_asr.py")
    sandbox.site_policy(LAYER_RULE + gc_threshold(0.1))
    sandbox.user_policy(gc_threshold(0.2))
    sandbox.write("autoalloc.toml", gc_threshold(0.3))
    env_file = sandbox.write(sandbox.root / "env.toml", gc_threshold(0.4), base=Path("/"))
    result = sandbox.run(["train_asr.py"], env={"AUTOALLOC_CONFIG": str(env_file)})
    assert_applied(result, "asr", expected=f"{ES},garbage_collection_threshold:0.4")


def test_existing_options_are_merged(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.script(NEMO)
    result = sandbox.run([NEMO], env={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.7"}, python=torch_python)
    assert_applied(result, expected=f"garbage_collection_threshold:0.7,{ES}")
    assert result.stderr == ""
    result = sandbox.run([NEMO], env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, python=torch_python)
    probe = assert_applied(result, expected=f"max_split_size_mb:512,{ES}")
    if probe["cuda_build"]:
        assert probe["snapshot_max_split_size"] == 512 * 1024 * 1024
    (warning,) = autoalloc_warnings(result.stderr)  # the max_split_size_mb caveat, once
    assert "max_split_size_mb" in warning


@pytest.mark.slow  # test_conflicts keeps one (and test_pipeline's env-conflict case, full run)
def test_explicit_false_is_kept_unless_override(sandbox: Sandbox, torch_python: str) -> None:
    script = sandbox.script(NEMO)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    result = sandbox.run([NEMO], env=env, python=torch_python)
    assert_applied(result, expected="expandable_segments:False")
    (warning,) = autoalloc_warnings(result.stderr)
    assert f"{script}:" in warning and "keeping expandable_segments:False" in warning
    sandbox.write("NeMo/autoalloc.toml", 'on_conflict = "override"\n')
    result = sandbox.run([NEMO], env=env, python=torch_python)
    assert_applied(result)
    assert result.stderr == ""


TRIGGER_PKG = {"asrkit/__init__.py": "", "asrkit/data.py": "LOADED = True\n"}


@pytest.mark.slow  # test_launch_styles::test_lhotse_import_rule_applies_before_torch_loads
def test_import_trigger_before_torch(sandbox: Sandbox) -> None:
    sandbox.user_policy('[[rules]]\nname = "kit"\nimports = ["asrkit.data"]\n')
    for path, text in TRIGGER_PKG.items():
        sandbox.write(path, text)
    result = sandbox.run(["-c", "import asrkit.data\n" + PROBE], env={"AUTOALLOC_DEBUG": "1"})
    probe = assert_applied(result)
    assert probe["applied"] == "kit;expandable_segments:True"
    assert "runtime setter" not in result.stderr


def test_import_trigger_after_torch_uses_the_setter(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.user_policy('[[rules]]\nname = "kit"\nimports = ["asrkit.data"]\n')
    for path, text in TRIGGER_PKG.items():
        sandbox.write(path, text)
    code = "import torch\nimport asrkit.data\n" + PROBE
    result = sandbox.run(
        ["-c", code],
        env={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6", "AUTOALLOC_DEBUG": "1"},
        python=torch_python,
    )
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    # the full merged string went to the setter (each setter call resets the keys it omits)
    assert probe["getter"] == f"garbage_collection_threshold:0.6,{ES}"
    assert "via the runtime setter" in result.stderr
    if probe["cuda_build"]:
        assert probe["snapshot_expandable_segments"] is True
    # ... and children inherit it through the environment
    assert probe["env"]["PYTORCH_CUDA_ALLOC_CONF"] == f"garbage_collection_threshold:0.6,{ES}"


CHILDREN = """
import os, subprocess, sys, torch
from torch.utils.data import DataLoader, Dataset

class DS(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "", torch._C._accelerator_getAllocatorSettings()

def main():
    seen = set()
    loader = DataLoader(DS(), batch_size=1, num_workers=2, multiprocessing_context="spawn")
    for env_value, getter in loader:
        seen.add((env_value[0], getter[0]))
    print("WORKERS", sorted(seen))
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch._C._accelerator_getAllocatorSettings())"],
                         capture_output=True, text=True)
    print("CHILD", out.stdout.strip(), "STDERR", repr(out.stderr))

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_children_inherit_without_a_second_warning(sandbox: Sandbox) -> None:
    sandbox.write(NEMO, CHILDREN)
    result = sandbox.run([NEMO], env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    assert result.returncode == 0, result.stderr
    assert "WORKERS [('expandable_segments:False', 'expandable_segments:False')]" in result.stdout
    assert "CHILD expandable_segments:False STDERR ''" in result.stdout
    assert len(autoalloc_warnings(result.stderr)) == 1
    result = sandbox.run([NEMO])
    assert f"WORKERS [('{ES}', '{ES}')]" in result.stdout and f"CHILD {ES} STDERR ''" in result.stdout
    assert result.stderr == ""


BAD_POLICIES = [
    ("enabled = [unclosed\n", "not valid TOML"),
    ("enabled = 'yes'\n", "enabled must be true or false"),
    ("surprise = 1\n", "unknown key 'surprise'"),
    ("[allocator]\nexpandable_segments = 'True'\n", "allocator.expandable_segments"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_POLICIES)
def test_bad_policy_is_skipped_with_one_warning(
    in_process: Sandbox, text: str, fragment: str
) -> None:
    """In process, each kind of bad file (one real interpreter below)."""
    bad = in_process.write("NeMo/autoalloc.toml", text)
    decided = decision(in_process, in_process.script(NEMO))
    assert (decided["action"], decided["rule"], decided["value"]) == ("apply", "nemo-asr-train", ES)
    (warning,) = decided["warnings"]
    assert str(bad) in warning and fragment in warning


@pytest.mark.slow  # in process above; test_hostile and test_a_bad_policy_file_warns_once_per_job run one
def test_bad_policy_costs_one_warning(sandbox: Sandbox) -> None:
    text, fragment = BAD_POLICIES[0]
    bad = sandbox.write("NeMo/autoalloc.toml", text)
    sandbox.write(NEMO, PROBE + "raise SystemExit(3)\n")
    result = sandbox.run([NEMO])
    assert result.returncode == 3
    assert_applied_probe = probe_result(result.stdout)
    assert assert_applied_probe["getter"] == ES  # the layer is skipped, the built-in rule still applies
    (warning,) = autoalloc_warnings(result.stderr)
    assert str(bad) in warning and fragment in warning
    assert "Traceback" not in result.stderr


def test_debug_trace(sandbox: Sandbox, full: bool) -> None:
    sandbox.script(NEMO)
    result = sandbox.run([NEMO], env={"AUTOALLOC_DEBUG": "1"})
    lines = [line for line in result.stderr.splitlines() if line.startswith("autoalloc: ")]
    assert any("apply rule nemo-asr-train" in line for line in lines)
    if not full:  # the trace of "none" is read in the quick run by test_hostile's argv test
        return
    other = sandbox.run(["-c", "import torch"], env={"AUTOALLOC_DEBUG": "1"})
    assert "autoalloc: code: none (no rule matches)" in other.stderr


def test_isolated_mode_is_respected(sandbox: Sandbox) -> None:
    sandbox.script(NEMO)
    assert_untouched(sandbox.run(["-I", str(sandbox.work / NEMO)]))


def test_hook_imports_nothing_at_startup(sandbox: Sandbox) -> None:
    result = sandbox.run(["-X", "importtime", "-c", "pass"], env={"PYTHONDONTWRITEBYTECODE": "1"})
    lines = [line.split("|")[-1] for line in result.stderr.splitlines() if line.startswith("import time:")]
    index = next(i for i, name in enumerate(lines) if name.strip() == "_autoalloc_startup")
    depth = len(lines[index]) - len(lines[index].lstrip())
    nested = []
    for name in reversed(lines[:index]):
        if len(name) - len(name.lstrip()) <= depth:
            break
        nested.append(name.strip())
    assert nested == []  # one module, not even the autoalloc package
    assert os.path.basename(lines[index + 1].strip()) != "autoalloc"


SPAWNS_INFERENCE = """
import os, subprocess, sys, torch
out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "transcribe_speech.py")],
                     capture_output=True, text=True)
print(out.stdout, end="")
print("CHILD_STDERR", repr(out.stderr))
"""


@pytest.mark.slow  # the restore of test_disable_in_a_child_restores_what_the_parent_found, by a rule
def test_inference_child_of_a_training_job_gets_the_users_variables_back(sandbox: Sandbox) -> None:
    sandbox.write(NEMO, SPAWNS_INFERENCE)
    sandbox.script("NeMo/examples/asr/asr_ctc/transcribe_speech.py")
    result = sandbox.run([NEMO], env={"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.5"})
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == "garbage_collection_threshold:0.5"
    assert probe["env"] == {"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_HIP_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.5"}
    assert probe["applied"] is None
    assert "CHILD_STDERR ''" in result.stdout


def test_a_bad_policy_file_warns_once_per_job(sandbox: Sandbox) -> None:
    sandbox.write("autoalloc.toml", "enabled = [unclosed\n")
    code = (
        "import subprocess, sys, torch\n"
        "subprocess.run([sys.executable, '-c', 'import torch'])\n"
        "subprocess.run([sys.executable, '-c', 'import torch'], env={k: v for k, v in __import__('os').environ.items() if k != 'AUTOALLOC_WARNED'})\n"
    )
    result = sandbox.run(["-c", code])
    assert result.returncode == 0
    # the parent and its first child share the job's memory of the warning; the child that lost it warns again
    assert len(autoalloc_warnings(result.stderr)) == 2


def test_disable_in_a_child_restores_what_the_parent_found(sandbox: Sandbox) -> None:
    code = (
        "import os, subprocess, sys, torch\n"
        "env = dict(os.environ, AUTOALLOC_DISABLE='1')\n"
        f"out = subprocess.run([sys.executable, '-c', {PROBE!r}], env=env, capture_output=True, text=True)\n"
        "print(out.stdout, end='')\n"
    )
    sandbox.write(NEMO, code)
    result = sandbox.run([NEMO], env={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.5"})
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == "garbage_collection_threshold:0.5"
    assert probe["env"]["PYTORCH_ALLOC_CONF"] is None and probe["applied"] is None
