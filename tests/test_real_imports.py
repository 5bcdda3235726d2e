"""autoalloc acts on imports that happen, never on probes, and survives odd surroundings.

End to end on the real torch of the test venv (fake trigger packages are written into the
sandbox and found through ``PYTHONPATH``): a ``find_spec`` probe costs nothing and says
nothing; a failed ``try: import x`` fires no trigger; autoalloc's own imports are not the
program's; ``imports = ["torch"]``; the spec still pickles; a mock torch is never
configured; a FIFO ``torch/version.py`` does not hang; surrogate-escaped script paths.
"""

from __future__ import annotations

import os
import textwrap

import pytest

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

FAKE_NEMO = {
    "site/nemo/__init__.py": "",
    "site/nemo/collections/__init__.py": "",
    "site/nemo/collections/asr/__init__.py": "",
}


# The built-in toolkit triggers wait for an optimizer too: these tests watch an import of their own.
TRIGGERS = '[[rules]]\nname = "toolkit-imports"\nimports = ["nemo.collections.asr", "icefall"]\n'


def with_site(sandbox: Sandbox, files: dict[str, str]) -> dict[str, str]:
    """Write ``files`` (paths under ``site/``) and return the env that puts ``site`` on sys.path."""
    for path, text in files.items():
        sandbox.write(path, text)
    return {"PYTHONPATH": str(sandbox.work / "site")}


def test_find_spec_probe_costs_nothing_and_says_nothing(sandbox: Sandbox) -> None:
    sandbox.write("autoalloc.toml", "this is [not toml\n")  # a broken policy: a decision would warn
    code = textwrap.dedent(
        """
        import importlib.util, os, sys
        before = set(sys.modules)
        spec = importlib.util.find_spec("torch")
        assert spec is not None and spec.origin.endswith("__init__.py")
        print("NEW", sorted(m for m in set(sys.modules) - before if m.startswith("autoalloc")))
        print("ENV", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), os.environ.get("AUTOALLOC_APPLIED"))
        """
    )
    sandbox.write(NEMO, code, base=sandbox.work)
    result = sandbox.run([NEMO])
    assert result.returncode == 0, result.stderr
    assert "NEW []" in result.stdout and "ENV None None" in result.stdout
    assert result.stderr == ""


@pytest.mark.slow  # test_startup_watcher's loader test pickles the spec end to end
def test_the_spec_pickles_before_and_after_import(sandbox: Sandbox) -> None:
    code = textwrap.dedent(
        """
        import importlib.util, pickle
        probed = importlib.util.find_spec("torch")
        assert type(probed.loader).__module__ == "_autoalloc_loader", type(probed.loader)
        assert pickle.loads(pickle.dumps(probed)).name == "torch"
        import torch
        assert pickle.loads(pickle.dumps(torch.__spec__)).origin == torch.__spec__.origin
        assert torch.__loader__ is torch.__spec__.loader  # the real loader is back
        print("PICKLED")
        """
    )
    script = sandbox.script(NEMO, code)
    result = sandbox.run([str(script)])
    assert "PICKLED" in result.stdout, result.stderr
    assert_applied(result, "nemo-asr-train")


@pytest.mark.slow  # a failed import fires nothing: test_failed_vllm_probe_does_not_stop_a_later_trigger
def test_failed_optional_import_fires_nothing(sandbox: Sandbox) -> None:
    """``try: import icefall`` with icefall absent: an `imports` trigger stays quiet."""
    sandbox.user_policy(TRIGGERS)
    body = "import torch\ntry:\n    import icefall\nexcept ImportError:\n    pass\n"
    assert_untouched(sandbox.run(["-c", body + PROBE]))


def test_find_spec_of_a_trigger_fires_nothing(sandbox: Sandbox, full: bool) -> None:
    sandbox.user_policy(TRIGGERS)
    env = with_site(sandbox, {"site/icefall/__init__.py": ""})
    body = "import importlib.util, torch\nassert importlib.util.find_spec('icefall')\n"
    assert_untouched(sandbox.run(["-c", body + PROBE], env=env))
    if not full:  # a real import of a trigger fires: test_failed_vllm_probe_does_not_stop_a_later_trigger
        return
    # ... while a real import of the same package does fire
    fired = sandbox.run(["-c", "import torch, icefall\n" + PROBE], env=env)
    assert_applied(fired, "toolkit-imports")


def test_failed_vllm_probe_does_not_stop_a_later_trigger(sandbox: Sandbox) -> None:
    sandbox.user_policy(TRIGGERS)
    env = with_site(sandbox, FAKE_NEMO)
    body = "import torch\ntry:\n    import vllm\nexcept ImportError:\n    pass\n"
    body += "import nemo.collections.asr\n"
    result = sandbox.run(["-c", body + PROBE], env=env)
    assert_applied(result, "toolkit-imports")


def test_autoalloc_own_imports_are_not_the_programs(sandbox: Sandbox) -> None:
    sandbox.write("autoalloc.toml", '[[rules]]\nname = "pd"\nimports = ["platformdirs"]\n')
    assert_untouched(sandbox.run(["-c", "import torch\n" + PROBE]))
    assert_applied(sandbox.run(["-c", "import platformdirs, torch\n" + PROBE]), "pd")


@pytest.mark.slow  # decided in process: test_pipeline::test_imports_torch_means_every_torch_process
def test_imports_torch_matches_every_torch_process(sandbox: Sandbox) -> None:
    sandbox.write("autoalloc.toml", '[[rules]]\nname = "all-torch"\nimports = ["torch"]\n')
    assert_applied(sandbox.run(["-c", "import torch\n" + PROBE]), "all-torch")
    check = sandbox.run(["-m", "autoalloc", "check"])
    assert check.returncode == 0, check.stdout


def test_a_mock_torch_is_never_configured(sandbox: Sandbox) -> None:
    sandbox.user_policy(TRIGGERS)
    env = with_site(sandbox, FAKE_NEMO)
    body = textwrap.dedent(
        """
        import sys
        from unittest import mock
        import torch
        real, fake = torch, mock.MagicMock()
        sys.modules["torch"] = fake
        import nemo.collections.asr
        sys.modules["torch"] = real
        print("MOCK CALLS", fake.mock_calls)
        """
    )
    result = sandbox.run(["-c", body + PROBE], env=env)
    assert result.returncode == 0, result.stderr
    assert "MOCK CALLS []" in result.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_version_file_does_not_hang(sandbox: Sandbox) -> None:
    shadow = sandbox.work / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    os.mkfifo(shadow / "version.py")
    sandbox.write(NEMO, "import torch\nprint('IMPORTED', torch.__file__)\n")
    result = sandbox.run([NEMO], env={"PYTHONPATH": str(shadow.parent)}, timeout=60)
    assert result.returncode == 0 and "IMPORTED" in result.stdout, result.stderr


def test_surrogate_escaped_script_path_matches_like_utf8(sandbox: Sandbox) -> None:
    name = "train\u00e9\U0001f3a4.py"
    sandbox.write("autoalloc.toml", '[[rules]]\nname = "accented"\nscripts = ["train\u00e9*.py"]\n')
    sandbox.script(name)
    # the path as UTF-8 is matched in process (test_pipeline); here the C locale's surrogates
    c_locale = sandbox.run(["-X", "utf8=0", name], env={"LC_ALL": "C", "LANG": "C"})
    assert_applied(c_locale, "accented")
    assert autoalloc_warnings(c_locale.stderr) == []


@pytest.mark.slow  # the restore of a parent's values: test_disable_in_a_child_restores_what_the_parent_found
def test_child_of_a_job_with_an_explicit_equal_value(sandbox: Sandbox) -> None:
    """The documented workaround: without AUTOALLOC_APPLIED, an equal value counts as the user's."""
    script = sandbox.script("serve/vllm_server.py")
    rule = '[[rules]]\nname = "srv"\nscripts = ["vllm_server.py"]\naction = "skip"\n'
    sandbox.write("autoalloc.toml", rule)
    env = {"PYTORCH_CUDA_ALLOC_CONF": ES, "AUTOALLOC_APPLIED": f"nemo-asr-train;{ES}",
           "AUTOALLOC_ORIGINAL": '{"PYTORCH_CUDA_ALLOC_CONF": null}'}
    taken = probe_result(sandbox.run([str(script)], env=env).stdout)
    assert taken["getter"] == ""  # taken for inherited: the user's (absent) value is back
    explicit = sandbox.run([str(script)], env={"PYTORCH_CUDA_ALLOC_CONF": ES})
    assert probe_result(explicit.stdout)["getter"] == ES
