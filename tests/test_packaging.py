"""The wheel carries the hook files, and a fresh venv with the wheel installed runs the hook."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO, Sandbox, probe_result

NEMO = "NeMo/examples/asr/speech_to_text_finetune.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    (path,) = out.glob("autoalloc-*.whl")
    return path


def test_wheel_contents(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {"autoalloc.pth", "autoalloc.start", "autoalloc/_startup.py", "autoalloc/builtin.toml",
                "autoalloc/wrappers.toml"} <= names
        assert zf.read("autoalloc.pth") == (REPO / "autoalloc.pth").read_bytes()
        assert zf.read("autoalloc.start") == b"_autoalloc_startup:main\n"
        # the startup modules once more at the top level: what the .pth line imports, and
        # what that imports at the first lookup of torch
        assert zf.read("_autoalloc_startup.py") == (REPO / "autoalloc" / "_startup.py").read_bytes()
        assert zf.read("_autoalloc_loader.py") == (REPO / "autoalloc" / "_loader.py").read_bytes()
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
        for name in ("autoalloc.pth", "autoalloc.start", "_autoalloc_startup.py", "_autoalloc_loader.py"):
            assert f"\n{name}," in "\n" + record  # so that uninstall removes it
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    hard = [r for r in requires if "extra ==" not in r]
    assert hard == ["Requires-Dist: platformdirs>=3", "Requires-Dist: tomli>=1.1; python_version < '3.11'"]
    assert any("torch==2.13.0" in r and "extra == 'test'" in r for r in requires)
    assert not any(r.startswith("Requires-Dist: torch") and "extra" not in r for r in requires)


def test_editable_install_of_the_test_venv_has_the_hook() -> None:
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert (purelib / "autoalloc.pth").read_bytes() == (REPO / "autoalloc.pth").read_bytes()
    assert (purelib / "autoalloc.start").exists()
    assert any(p.name.startswith("_editable_impl_autoalloc") for p in purelib.glob("*.pth"))
    # An editable install copies the top-level startup modules: reinstall after changing them.
    for name in ("_startup", "_loader"):
        copy = (purelib / f"_autoalloc{name}.py").read_bytes()
        assert copy == (REPO / "autoalloc" / f"{name}.py").read_bytes(), "pip install -e . again"


@pytest.mark.slow
def test_fresh_venv_with_the_wheel_runs_the_hook(wheel: Path, sandbox: Sandbox) -> None:
    venv = sandbox.root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # autoalloc from the wheel, with its dependency resolved by pip; torch borrowed from the
    # test venv through a plain path entry (that site-packages' own .pth files are not run).
    subprocess.run([py, "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True)
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    torch_dir = os.path.dirname(os.path.dirname(__import__("torch").__file__))
    Path(site, "zz_borrowed_torch.pth").write_text(torch_dir + "\n")
    assert Path(site, "autoalloc.pth").exists() and Path(site, "autoalloc.start").exists()

    sandbox.script(NEMO)
    result = sandbox.run([NEMO], python=py)
    assert result.returncode == 0, result.stderr
    probe = probe_result(result.stdout)
    assert probe["getter"] == "expandable_segments:True"
    assert probe["applied"] == "nemo-asr-train;expandable_segments:True"
    assert result.stderr == ""
    where = subprocess.run(  # not from the checkout: `-c` puts the working directory first
        [py, "-c", "import autoalloc as a, _autoalloc_startup as s; print(a.__file__, s.__file__)"],
        capture_output=True, text=True, cwd=sandbox.root,
    )
    files = [f"{site}/autoalloc/__init__.py", f"{site}/_autoalloc_startup.py"]
    assert where.stdout.split() == files
    # uninstalling removes the hook files
    subprocess.run([py, "-m", "pip", "uninstall", "-q", "-y", "autoalloc"], check=True, capture_output=True)
    for name in ("autoalloc.pth", "autoalloc.start", "_autoalloc_startup.py", "_autoalloc_loader.py"):
        assert not Path(site, name).exists(), name
    again = sandbox.run([NEMO], python=py)
    assert again.returncode == 0 and probe_result(again.stdout)["getter"] == "" and again.stderr == ""
