"""What counts as the program asking for a module (``autoalloc.evidence``).

In process: own files and library files, the names a held value stands for, stubs that never
ran (``importlib.util.LazyLoader``, a lazy package's placeholders), what a lazy package loaded
on use. End to end (real torch, the real hook): the same modules imported by a library at its
own import, by the program's script, inside a function of the program that returned before
the optimizer, held in a configuration dictionary, or pending behind a LazyLoader. The real
libraries' own code (transformers, datasets, SpeechBrain, NeMo) runs in
tests/test_real_libraries.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
import types
from pathlib import Path

import pytest

from autoalloc import evidence, scan
from tests.helpers import PROBE, Sandbox, assert_applied, assert_untouched

LIBS = scan.library_dirs(["/usr/lib/python3.11", "/venv/lib/python3.11/site-packages/"])


@pytest.mark.parametrize(
    ("path", "own"),
    [
        ("/home/me/proj/train.py", True),
        ("/usr/lib/python3.11/json/__init__.py", False),
        ("/venv/lib/python3.11/site-packages/soundfile.py", False),
        ("/home/me/proj/.venv/lib/python3.11/site-packages/x.py", False),  # any site-packages
        ("/usr/lib/python3/dist-packages/numpy/__init__.py", False),
        ("<frozen importlib._bootstrap>", False),
        ("<string>", False),
        (None, False),
        ("/usr/lib/python3.11x/mine.py", True),  # a directory's prefix is not the directory
    ],
)
def test_own_files(path: str | None, own: bool) -> None:
    assert evidence.is_own_file(path, LIBS) is own


class _Model:
    pass


def _fn() -> None:
    pass


def test_names_a_held_value_stands_for() -> None:
    assert list(evidence.names_of(os)) == ["os"]
    here = __name__
    assert list(evidence.names_of(_Model)) == [here, f"{here}._Model", "tests._Model"]
    assert list(evidence.names_of(_Model())) == [here, f"{here}._Model", "tests._Model"]
    assert list(evidence.names_of(_fn))[:2] == [here, f"{here}._fn"]
    assert list(evidence.names_of(3)) == [] and list(evidence.names_of("soundfile")) == []
    from json.decoder import JSONDecoder

    assert "json.JSONDecoder" in evidence.names_of(JSONDecoder)  # the package's public alias


def test_held_looks_one_level_into_containers() -> None:
    namespace = {"hparams": {"tokenizer": _Model(), "n": 3, "deep": {"x": os}}, "cfg": [os]}
    names = set(evidence.held(namespace))
    assert f"{__name__}._Model" in names and "os" in names  # the list holds os itself
    assert set(evidence.held({"deep": {"x": {"y": sys}}})) == set()  # two levels: not looked at
    assert "os" in set(evidence.held({"ns": types.SimpleNamespace(m=os)}))

    class Lazy(dict):  # as transformers' model tables: reading a value loads a module
        def values(self):  # type: ignore[override]
            raise AssertionError("read through the subclass")

    assert "os" not in set(evidence.held({"table": Lazy(a=os)}))  # not read, nothing loaded


def test_a_lazy_loader_module_that_never_ran_is_not_an_import(tmp_path: Path) -> None:
    (tmp_path / "lazymod_never.py").write_text("VALUE = 1\n")
    spec = importlib.util.spec_from_file_location("lazymod_never", tmp_path / "lazymod_never.py")
    assert spec is not None and spec.loader is not None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    modules = {"lazymod_never": module}
    assert evidence.pending(module) and list(evidence.names_of(module)) == []
    assert evidence.stubs(modules) == {"lazymod_never"}
    assert module.VALUE == 1  # first use: its code runs
    assert not evidence.pending(module) and evidence.stubs(modules) == set()


class _LazyModule(types.ModuleType):
    """Shaped like transformers' lazy package (``transformers.utils.import_utils``)."""


def test_a_lazy_packages_placeholders_and_what_it_loaded_on_use() -> None:
    top, models = _LazyModule("transformers"), types.ModuleType("transformers.models")
    whisper, gpt2 = _LazyModule("transformers.models.whisper"), _LazyModule("transformers.models.gpt2")
    modules = {
        "transformers": top,
        "transformers.models": models,
        "transformers.models.whisper": whisper,  # a placeholder: nothing of it ever ran
        "transformers.models.gpt2": gpt2,
        "transformers.models.gpt2.modeling_gpt2": types.ModuleType("m"),  # used
        # read by an auto class's table (run_clm.py's AutoModelForCausalLM): not a use
        "transformers.models.whisper.configuration_whisper": types.ModuleType("c"),
    }
    assert evidence.stubs(modules) == {"transformers.models.whisper"}  # its configuration only
    assert evidence.executed("transformers", modules)  # a top-level package's code ran
    used = evidence.loaded_on_use(modules)
    assert {"transformers", "transformers.models.gpt2", "transformers.models.gpt2.modeling_gpt2"} <= used.keys()
    assert "transformers.models.whisper" not in used


def test_supported_names_need_evidence() -> None:
    said = {"transformers.models.wav2vec2.modeling_wav2vec2.Wav2Vec2ForCTC": "own.py:3",
            "soundfile": "own.py:1"}
    used = {"transformers.models.whisper": "transformers.models.whisper.x was loaded on use"}
    found = evidence.supported(
        ["soundfile", "transformers", "transformers.models.wav2vec2", "sentencepiece",
         "transformers.models.whisper"], said, used)
    assert found["soundfile"] == "own.py:1"
    assert found["transformers.models.wav2vec2"].endswith("(own.py:3)")
    assert "transformers" in found and "sentencepiece" not in found
    assert "transformers.models.whisper" in found


# End to end. ``site-packages/``: a directory of installed code, as a venv's is. The stand-ins
# are empty packages: what matters is which code imports them.
# The optimizer built by a module of the program's own: the script's source alone does not
# show the training, so the run decides at the first optimizer, from its evidence.
TRAIN = """
import torch, trainer
model = torch.nn.Linear(4, 2)
opt = trainer.optimizer(model)
"""


def test_uses_are_names_inside_loaded_real_modules(tmp_path: Path) -> None:
    """What only the program's code shows (``torch.nn.CTCLoss``, ``evaluate.load:wer``) is a
    name inside a loaded module that is no module itself; a lazy package's names are not (its
    own loading tells), nor a module's names while the module is not loaded at all."""
    lazy = type("_LazyModule", (types.ModuleType,), {})("transformers")
    modules = {"torch": types.ModuleType("torch"), "torch.nn": types.ModuleType("torch.nn"),
               "evaluate": types.ModuleType("evaluate"), "transformers": lazy}
    names = {"torch.nn.CTCLoss", "torch.nn", "evaluate.load:wer", "jiwer",
             "transformers.models", "torchmetrics.text.WordErrorRate"}
    assert evidence.attributes(names, modules) == {"torch.nn.CTCLoss", "evaluate.load:wer"}
    (tmp_path / "tgt.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    own = {name: types.ModuleType(name) for name in ("tgt", "pkg", "df")}
    own["tgt"].__file__ = str(tmp_path / "tgt.py")
    own["pkg"].__file__ = str(tmp_path / "pkg" / "__init__.py")
    own["df"].__file__ = "/venv/lib/python3.11/site-packages/df/__init__.py"  # the library
    entry = types.SimpleNamespace(path=str(tmp_path / "train.py"))
    # a package beside the script may be a library's copy: only a module file is surely own
    assert evidence.own_named({"tgt", "pkg.x", "df", "soundfile"}, own, entry) == {"tgt"}


def _library(sandbox: Sandbox, body: str) -> dict[str, str]:
    """A library ``textstack`` whose import runs ``body``, beside a stand-in ``jiwer``."""
    site = sandbox.work / "lib" / "site-packages"
    sandbox.write(site / "textstack" / "__init__.py", body)
    sandbox.write(site / "jiwer" / "__init__.py", "")
    sandbox.write("trainer.py", "import torch\n\n\ndef optimizer(model):\n"
                  "    return torch.optim.AdamW(model.parameters(), lr=1e-3)\n")
    return {"PYTHONPATH": str(site), "AUTOALLOC_DEBUG": "1"}


def test_a_librarys_own_imports_are_not_the_programs(sandbox: Sandbox) -> None:
    """soundfile and jiwer imported by a library at its own import (as transformers'
    audio_utils and datasets' config import soundfile): a text-only trainer stays untouched;
    the same modules imported by the script: it applies."""
    env = _library(sandbox, "import soundfile, jiwer\n")
    sandbox.script("text_train.py", "import textstack\n" + TRAIN)
    result = sandbox.run(["text_train.py"], env=env)
    assert_untouched(result)
    assert "evidence of what the program uses: none" in result.stderr
    sandbox.script("speech_train.py", "import textstack, soundfile, jiwer\n" + TRAIN)
    result = sandbox.run(["speech_train.py"], env=env)
    assert_applied(result, "speech-training")
    assert "soundfile: " in result.stderr and "speech_train.py" in result.stderr


@pytest.mark.slow  # the import seen as it happens; test_a_librarys_own_imports covers the rest
def test_an_own_import_in_a_function_that_returned_counts(sandbox: Sandbox) -> None:
    """The program imports soundfile inside a helper that has returned before the optimizer
    is built: nothing holds it, but the watcher saw the program's own line import it."""
    env = _library(sandbox, "")
    body = "import torch, jiwer\ndef load():\n    import soundfile\n    return 1\nload()\n"
    sandbox.script("own.py", body + TRAIN)
    result = sandbox.run(["own.py"], env=env)
    assert_applied(result, "speech-training")
    assert "own.py:3" in result.stderr  # the line that imported it


@pytest.mark.slow  # a configuration's objects; the quick test above covers the mechanism
def test_a_configurations_objects_count(sandbox: Sandbox) -> None:
    """The library imported soundfile and jiwer; the program holds a jiwer object in its
    configuration (as SpeechBrain's hparams hold a tokenizer) and a soundfile function."""
    env = _library(sandbox, "import soundfile, jiwer\n")
    sandbox.write(sandbox.work / "lib" / "site-packages" / "jiwer" / "__init__.py",
                  "class Scorer:\n    pass\n")
    body = ("import sys, textstack\nfrom soundfile import read\n"
            "hparams = {'wer': sys.modules['jiwer'].Scorer(), 'lr': 0.1}\n")
    sandbox.script("own.py", body + TRAIN)
    result = sandbox.run(["own.py"], env=env)
    assert_applied(result, "speech-training")
    assert "jiwer: " in result.stderr and "soundfile: " in result.stderr


@pytest.mark.slow  # in process: test_a_lazy_loader_module_that_never_ran_is_not_an_import
def test_a_librarys_lazy_loader_module_is_not_the_programs(sandbox: Sandbox) -> None:
    """A library puts soundfile into sys.modules behind importlib's LazyLoader; torch's own
    import machinery then runs its code (dynamo walks sys.modules): still not the program's."""
    body = """
        import importlib.util, sys
        spec = importlib.util.find_spec("soundfile")
        spec.loader = importlib.util.LazyLoader(spec.loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules["soundfile"] = module
        spec.loader.exec_module(module)
    """
    env = _library(sandbox, textwrap.dedent(body))
    sandbox.script("own.py", "import textstack, jiwer\n" + TRAIN)
    result = sandbox.run(["own.py"], env=env)
    assert_untouched(result)
    assert "evidence of what the program uses: jiwer: " in result.stderr



@pytest.mark.slow  # an installed trainer run by -m; the script cases above are quick
def test_an_installed_package_run_with_dash_m_is_the_programs_own(sandbox: Sandbox) -> None:
    """``python -m asrtrain.main`` where asrtrain is installed (site-packages): its own imports
    are the program's; the library it imports (textstack) is not."""
    env = _library(sandbox, "import soundfile, jiwer\n")
    site = sandbox.work / "lib" / "site-packages"
    sandbox.write(site / "asrtrain" / "__init__.py", "")
    sandbox.write(site / "asrtrain" / "main.py", "import soundfile, jiwer\n" + TRAIN)
    sandbox.write(site / "texttrain" / "__init__.py", "")
    sandbox.write(site / "texttrain" / "main.py", "import textstack\n" + TRAIN)
    result = sandbox.run(["-m", "asrtrain.main"], env=env)
    assert result.returncode == 0, result.stderr
    assert "apply rule speech-training" in result.stderr
    result = sandbox.run(["-m", "texttrain.main"], env=env)
    assert result.returncode == 0, result.stderr
    assert "evidence of what the program uses: none" in result.stderr


# Where the program's own code asked, whatever form it has. Each decided at the first
# optimizer: the optimizer is built by an own module, so the script's source alone does not
# decide before torch starts.
TRAINER = "import torch\n\n\ndef build():\n    return torch.optim.AdamW(torch.nn.Linear(4, 2).parameters())\n"
CELL = "import soundfile\nimport jiwer\nimport trainer\noptimizer = trainer.build()\n"


@pytest.mark.parametrize(
    "form",
    ["dash-c", "zipapp", "thread", pytest.param("notebook", marks=pytest.mark.slow)],
)
def test_the_programs_own_imports_count_whatever_form_its_code_has(
    sandbox: Sandbox, form: str
) -> None:
    """A function of ``python -c`` code; a function of a zipped module (zipapp) called before
    ``import torch``; ``Thread(target=importlib.import_module, ...)``; a notebook's cell run
    in ``__main__``: each imports soundfile for the program, as the same plain script does."""
    env = _library(sandbox, "")
    sandbox.write("trainer.py", TRAINER)
    load = "def load():\n    import soundfile\n\n\n"
    if form == "dash-c":
        code = "import torch, jiwer, trainer\n" + load + "load()\noptimizer = trainer.build()\n"
        result = sandbox.run(["-c", code + PROBE], env=env)
    elif form == "zipapp":
        import zipfile

        with zipfile.ZipFile(sandbox.work / "app.pyz", "w") as app:
            app.writestr("loader.py", load)
            app.writestr("__main__.py", "import loader\nloader.load()\nimport torch, jiwer\n"
                         "import trainer\noptimizer = trainer.build()\n" + PROBE)
        result = sandbox.run(["app.pyz"], env={**env, "PYTHONPATH": f"{env['PYTHONPATH']}:."})
    elif form == "thread":
        body = ("import importlib, threading\nimport torch, jiwer, trainer\n"
                "t = threading.Thread(target=importlib.import_module, args=('soundfile',))\n"
                "t.start()\nt.join()\noptimizer = trainer.build()\n")
        sandbox.script("own.py", body)
        result = sandbox.run(["own.py"], env=env)
    else:
        body = (f"import __main__, torch\nCELL = {CELL!r}\n"
                "exec(compile(CELL, '<ipython-input-1-5a1b>', 'exec'), __main__.__dict__)\n")
        sandbox.script("kernel.py", body)
        result = sandbox.run(["kernel.py"], env=env)
    assert_applied(result, "speech-training")
    assert "soundfile: " in result.stderr, result.stderr


def test_an_own_module_named_like_a_library_is_the_programs(sandbox: Sandbox) -> None:
    """An own ``tgt.py`` (or ``df.py``) beside the script is not the TextGrid (DeepFilterNet)
    library of other audio work: speech-to-text training keeps its option."""
    env = _library(sandbox, "")
    sandbox.write("trainer.py", TRAINER)
    sandbox.write("tgt.py", "def tier(x):\n    return x\n")
    sandbox.script("own.py", "import torch, soundfile, jiwer, trainer\nimport tgt\n"
                   "optimizer = trainer.build()\n")
    assert_applied(sandbox.run(["own.py"], env=env), "speech-training")
    explained = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "own.py"], env=env)
    assert "stays off" not in explained.stdout.splitlines()[0], explained.stdout
