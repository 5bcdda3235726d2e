"""Fixtures and collection hooks; what tests share that is not a fixture is in helpers.py.

End-to-end tests start real interpreters of the test venv, where autoalloc is installed
with its startup hook, and ask torch itself what it read. ``AUTOALLOC_TORCH_CUDA_PYTHON``
names a second interpreter with torch 2.14.1 (CUDA build) and autoalloc installed; tests
parametrized over ``torch_python`` run on it too when it is set, and skip it otherwise.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from autoalloc.envvars import RANK_VARS
from tests.helpers import TORCH_PYTHONS, Sandbox, clean_env


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background of a non-interactive shell inherits SIGINT ignored, and
    # so would every program a test starts: give them Ctrl-C as a terminal gives it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        help="also run the tests marked slow and the large sample sizes (what CI runs)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --full (or a -m naming slow), tests marked slow are deselected."""
    if config.getoption("--full") or "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def full(pytestconfig: pytest.Config) -> bool:
    """Whether this is the full run (--full): large samples instead of quick ones."""
    return bool(pytestconfig.getoption("--full"))


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    box = Sandbox(tmp_path)
    for d in (box.home, box.work, box.user_config.parent.parent, box.site_config.parent.parent):
        d.mkdir(parents=True, exist_ok=True)
    box.env = clean_env(tmp_path)
    return box


@pytest.fixture(params=TORCH_PYTHONS)
def torch_python(request: pytest.FixtureRequest) -> str:
    """An interpreter with autoalloc's hook installed: torch 2.13 CPU, and 2.14.1 CUDA when available."""
    return request.param


@pytest.fixture
def isolated_home(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """This process reads its policy as a sandboxed one would: the sandbox's HOME and empty
    user and site config directories, and no AUTOALLOC_*, PYTORCH_* or rank variable."""
    for key in list(os.environ):
        if key.startswith(("AUTOALLOC_", "PYTORCH_")) or key in RANK_VARS:
            monkeypatch.delenv(key)
    for key in ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS"):
        monkeypatch.setenv(key, sandbox.env[key])
    return sandbox
