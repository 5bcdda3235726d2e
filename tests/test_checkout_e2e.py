"""The built-in import fallback on real torch: outside a toolkit checkout it applies to a
program that imports the toolkit and builds an optimizer; inside one (recognised by the file
at its root, whatever the folder is called) the script rules alone decide, so a tool there
that imports the toolkit is left alone."""

from __future__ import annotations

import pytest

from tests.helpers import PROBE, Sandbox, assert_applied, assert_untouched

# A stand-in for NeMo's package: importing its ASR collection imports torch, as the real one does.
NEMO_PACKAGE = {
    "nemo/__init__.py": "",
    "nemo/package_info.py": "__version__ = '0'\n",
    "nemo/collections/__init__.py": "",
    "nemo/collections/asr/__init__.py": "import torch\n",
}
# it imports the toolkit and trains (the fallback holds only then)
TOOL = (
    "import nemo.collections.asr, torch\n"
    "torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())\n" + PROBE
)


def _checkout(sandbox: Sandbox, folder: str) -> None:
    for path, text in NEMO_PACKAGE.items():
        sandbox.write(f"{folder}/{path}", text)


@pytest.mark.slow  # a variant of test_own_script_importing_the_toolkit_gets_the_fallback
def test_tool_inside_a_renamed_checkout_is_left_alone(sandbox: Sandbox) -> None:
    _checkout(sandbox, "nemo-2.4-fork")
    sandbox.write("nemo-2.4-fork/scripts/speech_recognition/estimate_duration_bins.py", TOOL)
    result = sandbox.run(
        ["scripts/speech_recognition/estimate_duration_bins.py"],
        cwd=sandbox.work / "nemo-2.4-fork",
        env={"PYTHONPATH": str(sandbox.work / "nemo-2.4-fork")},
    )
    assert_untouched(result)
    assert result.stderr == ""


def test_own_script_importing_the_toolkit_gets_the_fallback(sandbox: Sandbox) -> None:
    _checkout(sandbox, "NeMo")
    sandbox.write("my_project/finetune_mine.py", TOOL)
    result = sandbox.run(
        ["my_project/finetune_mine.py"], env={"PYTHONPATH": str(sandbox.work / "NeMo")}
    )
    assert_applied(result, "asr-toolkit-imports")
