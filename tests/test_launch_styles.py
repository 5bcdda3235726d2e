"""Every way ASR trainers are launched, end to end: real interpreters, the real hook, real torch.

Each test lays out a checkout the way the toolkit does (in the sandbox's tmp folder),
starts it the way its users do, and asserts what torch itself read (PROBE: the allocator
getter, the environment, ``AUTOALLOC_APPLIED``). Toolkit packages that must be importable
(``espnet2``, ``fairseq_cli``, ``nemo.collections.asr``, ``vllm``, ``torch_memory_saver``)
are small stand-ins with the real module names; torch and lhotse are the real ones.
"""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path

import pytest

from tests.helpers import (
    ES,
    NEMO,
    PROBE,
    PY,
    Sandbox,
    assert_applied,
    assert_untouched,
    autoalloc_warnings,
    probe_result,
)


def stand_in(sandbox: Sandbox, files: dict[str, str], base: str = "site") -> str:
    """Write a stand-in package tree under ``work/<base>``; returns that folder (for PYTHONPATH)."""
    for path, text in files.items():
        sandbox.write(f"{base}/{path}", text)
    return str(sandbox.work / base)


def console_script(sandbox: Sandbox, name: str, module: str, func: str) -> Path:
    """A console-script wrapper as pip writes it (distlib's template), with this venv's python in the shebang."""
    path = sandbox.write(
        f"venv/bin/{name}",
        f"#!{PY}\n"
        "# -*- coding: utf-8 -*-\n"
        "import re\n"
        "import sys\n"
        f"from {module} import {func}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({func}())\n",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def as_function(name: str, body: str) -> str:
    return f"def {name}():\n" + textwrap.indent(body.strip("\n") + "\n", "    ")


def quick_first(cases: list, ids: list[str]) -> list:
    """The first case runs in the quick run, the others (the same claim again) in the full run."""
    return [
        pytest.param(*(case if isinstance(case, tuple) else (case,)), id=name,
                     marks=() if i == 0 else pytest.mark.slow)
        for i, (case, name) in enumerate(zip(cases, ids))
    ]


# ---------------------------------------------------------------- python script.py


@pytest.mark.slow  # test_e2e_core runs this trainer by its relative path in the quick run
def test_nemo_relative_path(sandbox: Sandbox, torch_python: str) -> None:
    sandbox.script(NEMO)
    result = sandbox.run([NEMO, "--config-path=../conf", "--config-name=fastconformer_ctc_bpe", "trainer.devices=1"],
                         python=torch_python)
    assert_applied(result, "nemo-asr-train")
    assert result.stderr == ""


@pytest.mark.slow  # the path forms are decided in process (test_entrypoint)
def test_nemo_absolute_path_unbuffered(sandbox: Sandbox) -> None:
    script = sandbox.script("opt/NeMo/examples/asr/asr_hybrid_transducer_ctc/speech_to_text_hybrid_rnnt_ctc_bpe.py")
    assert_applied(sandbox.run(["-u", str(script), "model.train_ds.use_lhotse=true"], cwd=sandbox.home), "nemo-asr-train")


@pytest.mark.slow  # ./zipformer/train.py from a recipe dir: the symlinked test below
def test_icefall_started_from_the_recipe_dir(sandbox: Sandbox) -> None:
    sandbox.script("icefall/egs/librispeech/ASR/zipformer/train.py")
    recipe = sandbox.work / "icefall/egs/librispeech/ASR"
    args = ["./zipformer/train.py", "--world-size", "1", "--max-duration", "1000"]
    probe = assert_applied(sandbox.run(args, cwd=recipe), "icefall-train")
    # and `autoalloc explain` for the same command line says what the hook did
    cli = str(Path(PY).with_name("autoalloc"))
    report = json.loads(sandbox.run([cli, "explain", "--json", "--", "python", *args], python="", cwd=recipe).stdout)
    assert report["decision"]["rule"] == "icefall-train"
    assert report["decision"]["writes"]["PYTORCH_CUDA_ALLOC_CONF"] == probe["env"]["PYTORCH_CUDA_ALLOC_CONF"]


def test_icefall_symlinked_recipe_and_checkout(sandbox: Sandbox) -> None:
    real = sandbox.script("icefall/egs/librispeech/ASR/zipformer/train.py")
    # other corpora symlink the zipformer dir of librispeech; the path as typed matches
    aishell = sandbox.work / "icefall/egs/aishell/ASR"
    aishell.mkdir(parents=True)
    (aishell / "zipformer").symlink_to(real.parent)
    assert_applied(sandbox.run(["./zipformer/train.py"], cwd=aishell), "icefall-train")
    # an experiment dir that links to the script: only the resolved path matches
    exp = sandbox.work / "exp/run3"
    exp.mkdir(parents=True)
    (exp / "train.py").symlink_to(real)
    assert_applied(sandbox.run(["train.py", "--exp-dir", "."], cwd=exp), "icefall-train")


@pytest.mark.parametrize(
    ("script", "cwd", "argv", "rule"),
    quick_first([
        ("speechbrain/recipes/LibriSpeech/ASR/transformer/train.py", "speechbrain/recipes/LibriSpeech/ASR/transformer",
         ["train.py", "hparams/conformer_small.yaml", "--data_folder", "/data/LibriSpeech"], "speechbrain-asr-train"),
        ("wenet/wenet/bin/train.py", "wenet", ["wenet/bin/train.py", "--config", "conf/train_conformer.yaml",
                                               "--train_engine", "torch_ddp"], "wenet-train"),
        ("transformers/examples/pytorch/speech-recognition/run_speech_recognition_ctc.py",
         "transformers/examples/pytorch/speech-recognition",
         ["run_speech_recognition_ctc.py", "--dataset_name=librispeech_asr", "--group_by_length"], "hf-asr-examples"),
        ("audio/examples/asr/librispeech_conformer_rnnt/train.py", "audio/examples/asr/librispeech_conformer_rnnt",
         ["train.py", "--exp-dir", "./exp", "--librispeech-path", "/data"], "torchaudio-asr-recipes"),
        ("Speech/examples/speechlm2/salm_train.py", "Speech", ["examples/speechlm2/salm_train.py"], "nemo-speechlm2-train"),
    ], ["speechbrain", "wenet", "hf-ctc", "torchaudio", "speechlm2"]),
)
def test_toolkit_scripts(sandbox: Sandbox, script: str, cwd: str, argv: list[str], rule: str) -> None:
    sandbox.script(script)
    assert_applied(sandbox.run(argv, cwd=sandbox.work / cwd), rule)


@pytest.mark.slow  # test_e2e_core and test_silence keep a non-matching run
def test_an_ordinary_train_py_is_untouched(sandbox: Sandbox) -> None:
    sandbox.script("myproject/train.py")
    result = sandbox.run(["myproject/train.py"])
    assert_untouched(result)
    assert result.stderr == ""


# ---------------------------------------------------------------- python -m pkg.mod

ESPNET = {
    "espnet2/__init__.py": "",
    "espnet2/bin/__init__.py": "",
    "espnet2/bin/asr_train.py": PROBE,
    "espnet2/bin/asr_inference.py": PROBE,
}


@pytest.mark.parametrize(
    ("module", "expect"),
    [("espnet2.bin.asr_train", "espnet2-asr-train"),
     pytest.param("espnet2.bin.asr_inference", None, marks=pytest.mark.slow)],  # inference: above
)
def test_espnet_modules_from_the_recipe_dir(sandbox: Sandbox, module: str, expect: str | None) -> None:
    # ESPnet recipes run `python3 -m espnet2.bin.asr_train ...` from egs2/<corpus>/asr1 with espnet on the path
    stand_in(sandbox, ESPNET, base="espnet")
    recipe = sandbox.work / "espnet/egs2/librispeech/asr1"
    recipe.mkdir(parents=True)
    result = sandbox.run(["-m", module, "--ngpu", "1", "--batch_type", "numel", "--batch_bins", "16000000"],
                         cwd=recipe, env={"PYTHONPATH": str(sandbox.work / "espnet")})
    if expect:
        assert_applied(result, expect)
    else:
        assert_untouched(result)


def test_vllm_module_is_untouched(sandbox: Sandbox) -> None:
    stand_in(sandbox, {"vllm/__init__.py": "", "vllm/entrypoints/__init__.py": "",
                       "vllm/entrypoints/openai/__init__.py": "", "vllm/entrypoints/openai/api_server.py": PROBE}, base=".")
    result = sandbox.run(["-m", "vllm.entrypoints.openai.api_server", "--model", "nvidia/canary-qwen-2.5b"])
    assert_untouched(result)


# ---------------------------------------------------------------- console scripts

FAIRSEQ = {
    "fairseq_cli/__init__.py": "",
    "fairseq_cli/hydra_train.py": as_function("cli_main", PROBE),
}


@pytest.mark.parametrize(
    ("args", "applied"),
    [
        (["task.data=/data/librispeech/manifest", "--config-dir", "/src/fairseq/examples/wav2vec/config/pretraining",
          "--config-name", "wav2vec2_base_librispeech"], True),
        pytest.param(["task.data=/data/wmt16", "--config-dir", "/src/fairseq/examples/roberta/config/pretraining",
                      "--config-name", "base"], False, marks=pytest.mark.slow),  # argv: in process
    ],
    ids=["wav2vec", "roberta"],
)
def test_fairseq_console_script(sandbox: Sandbox, args: list[str], applied: bool) -> None:
    site = stand_in(sandbox, FAIRSEQ)
    wrapper = console_script(sandbox, "fairseq-hydra-train", "fairseq_cli.hydra_train", "cli_main")
    result = sandbox.run([str(wrapper), *args], python="", env={"PYTHONPATH": site, "AUTOALLOC_DEBUG": "1"})
    if applied:
        assert_applied(result, "fairseq-audio-train")
        assert "command matches 'fairseq-hydra-train' and argument" in result.stderr
    else:
        assert_untouched(result)
        assert "command fairseq-hydra-train: none (no rule matches)" in result.stderr


@pytest.mark.slow  # test_vllm_module_is_untouched keeps one
def test_vllm_console_script_is_untouched(sandbox: Sandbox) -> None:
    site = stand_in(sandbox, {"vllm/__init__.py": "", "vllm/scripts.py": as_function("main", PROBE)})
    wrapper = console_script(sandbox, "vllm", "vllm.scripts", "main")
    assert_untouched(sandbox.run([str(wrapper), "serve", "nvidia/canary-1b"], python="", env={"PYTHONPATH": site}))


# ---------------------------------------------------------------- torchrun, mp.spawn, DataLoader workers

RANK_PROBE = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
report = {
    "rank": dist.get_rank(),
    "getter": torch._C._accelerator_getAllocatorSettings(),
    "env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    "applied": os.environ.get("AUTOALLOC_APPLIED"),
}
seen = [None] * dist.get_world_size()
dist.all_gather_object(seen, report)
if dist.get_rank() == 0:
    print("RANKS " + json.dumps(seen), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_every_rank_one_warning(sandbox: Sandbox) -> None:
    sandbox.write("wenet/wenet/bin/train.py", RANK_PROBE)
    # max_split_size_mb is kept and merged, and costs one warning (it is ignored inside expandable segments)
    merged = f"max_split_size_mb:256,{ES}"
    result = sandbox.run(
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "wenet/bin/train.py",
         "--config", "conf/train_conformer.yaml"],
        cwd=sandbox.work / "wenet",
        env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"},
    )
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RANKS ")]
    ranks = json.loads(line.split(" ", 1)[1])
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:
        assert (rank["getter"], rank["env"], rank["applied"]) == (merged, merged, f"wenet-train;{merged}")
    (warning,) = autoalloc_warnings(result.stderr)  # one for the job, not one per rank
    assert "max_split_size_mb" in warning


SPAWN = """
import json, os, sys
import torch
import torch.multiprocessing as mp


def run(rank, world_size, queue):
    queue.put((rank, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), torch._C._accelerator_getAllocatorSettings(),
               os.environ.get("AUTOALLOC_APPLIED"), sys.orig_argv[1]))


def main():
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(run, args=(2, queue), nprocs=2, join=True)
    print("SPAWNED " + json.dumps(sorted(queue.get() for _ in range(2))), flush=True)


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_mp_spawn_children_inherit(sandbox: Sandbox) -> None:
    # icefall's train.py: `./zipformer/train.py --world-size 2` spawns its ranks with torch.multiprocessing.spawn
    sandbox.write("icefall/egs/librispeech/ASR/zipformer/train.py", SPAWN)
    result = sandbox.run(["./zipformer/train.py", "--world-size", "2"], cwd=sandbox.work / "icefall/egs/librispeech/ASR",
                         env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"})
    assert result.returncode == 0, result.stderr
    merged = f"max_split_size_mb:256,{ES}"
    expected = [[rank, merged, merged, f"icefall-train;{merged}", "-c"] for rank in (0, 1)]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("SPAWNED ")]
    assert json.loads(line.split(" ", 1)[1]) == expected  # spawn children start as `python -c ...`: no argv match
    assert len(autoalloc_warnings(result.stderr)) == 1


LOADER = """
import os
import torch
from torch.utils.data import DataLoader, Dataset


class Utterances(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return (info.id, os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "", torch._C._accelerator_getAllocatorSettings(),
                os.environ.get("AUTOALLOC_APPLIED") or "")


def main():
    loader = DataLoader(Utterances(), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    print("WORKERS", sorted({tuple(item) for item in loader}), flush=True)


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_dataloader_spawn_workers_inherit(sandbox: Sandbox) -> None:
    sandbox.write("speechbrain/recipes/LibriSpeech/ASR/CTC/train_with_wav2vec.py", LOADER)
    result = sandbox.run(["train_with_wav2vec.py", "hparams/train_hf_wav2vec.yaml"],
                         cwd=sandbox.work / "speechbrain/recipes/LibriSpeech/ASR/CTC")
    assert result.returncode == 0, result.stderr
    applied = f"speechbrain-asr-train;{ES}"
    assert f"WORKERS {[(0, ES, ES, applied), (1, ES, ES, applied)]}" in result.stdout
    assert result.stderr == ""


# ---------------------------------------------------------------- notebooks: python -c and a REPL

NEMO_STAND_IN = {
    "nemo/__init__.py": "",
    "nemo/collections/__init__.py": "",
    # like the real one: importing the ASR collection imports torch
    "nemo/collections/asr/__init__.py": "import torch\nMODELS = ['EncDecCTCModelBPE']\n",
}


# The built-in asr-toolkit-imports waits for an optimizer too; a rule of one's own with `imports`
# alone fires at the import.
NOTEBOOK_RULE = '[[rules]]\nname = "nemo-notebook"\nimports = ["nemo.collections.asr"]\n'


@pytest.mark.slow  # test_e2e_core's import triggers and the REPL below
def test_notebook_imports_trigger_after_torch_uses_the_setter(sandbox: Sandbox) -> None:
    site = stand_in(sandbox, NEMO_STAND_IN)
    sandbox.user_policy(NOTEBOOK_RULE)
    # the notebook has used torch already: the getter froze the allocator config at "" (no env var then),
    # so only the runtime setter can change what torch reports afterwards
    code = "import torch\nprint('BEFORE', repr(torch._C._accelerator_getAllocatorSettings()))\nimport nemo.collections.asr\n" + PROBE
    result = sandbox.run(["-c", code], env={"PYTHONPATH": site, "AUTOALLOC_DEBUG": "1"})
    assert "BEFORE ''" in result.stdout
    assert_applied(result, "nemo-notebook")
    assert "code: none (no rule matches)" in result.stderr  # nothing at import torch ...
    assert "via the runtime setter" in result.stderr  # ... the trigger applied it late


@pytest.mark.slow  # test_e2e_core::test_import_trigger_before_torch
def test_notebook_imports_trigger_before_torch_uses_the_env(sandbox: Sandbox) -> None:
    site = stand_in(sandbox, NEMO_STAND_IN)
    sandbox.user_policy(NOTEBOOK_RULE)
    result = sandbox.run(["-c", "import nemo.collections.asr as nemo_asr\n" + PROBE], env={"PYTHONPATH": site, "AUTOALLOC_DEBUG": "1"})
    assert_applied(result, "nemo-notebook")
    assert "code: apply rule nemo-notebook" in result.stderr and "module nemo.collections.asr is imported" in result.stderr
    assert "runtime setter" not in result.stderr


def test_repl_fed_from_stdin(sandbox: Sandbox) -> None:
    site = stand_in(sandbox, NEMO_STAND_IN)
    sandbox.user_policy(NOTEBOOK_RULE)
    sandbox.write("probe.py", PROBE)
    lines = "import torch\ntorch._C._accelerator_getAllocatorSettings()\nimport nemo.collections.asr\nexec(open('probe.py').read())\n"
    result = sandbox.run(["-i"], input=lines, env={"PYTHONPATH": site, "AUTOALLOC_DEBUG": "1"})
    assert_applied(result, "nemo-notebook")
    assert "stdin: apply rule nemo-notebook" in result.stderr and "via the runtime setter" in result.stderr


# ---------------------------------------------------------------- inference and MemPool users stay untouched


@pytest.mark.parametrize(
    "script",
    quick_first([
        "NeMo/examples/asr/transcribe_speech.py",
        "NeMo/examples/asr/speech_to_text_eval.py",
        "NeMo/examples/asr/asr_chunked_inference/rnnt/speech_to_text_buffered_infer_rnnt.py",
        "Speech/examples/speechlm2/salm_generate.py",
    ], ["transcribe", "eval", "chunked-infer", "salm-generate"]),
)
def test_inference_scripts_are_untouched(sandbox: Sandbox, script: str) -> None:
    site = stand_in(sandbox, NEMO_STAND_IN)
    # they import nemo.collections.asr too: the deny rule must beat the import fallback
    sandbox.script(script, "import torch\nimport nemo.collections.asr\n")
    result = sandbox.run([script, "pretrained_name=nvidia/parakeet-tdt-0.6b-v2", "audio_dir=/data"],
                         env={"PYTHONPATH": site, "AUTOALLOC_DEBUG": "1"})
    assert_untouched(result)
    assert "skip rule asr-inference" in result.stderr


def test_torch_memory_saver_user_is_untouched(sandbox: Sandbox) -> None:
    site = stand_in(sandbox, {**NEMO_STAND_IN, "torch_memory_saver/__init__.py": "import torch\n"})
    # even a NeMo trainer (built-in allow) is left alone when it uses torch_memory_saver
    sandbox.script(NEMO, "import torch_memory_saver\nimport nemo.collections.asr\n")
    result = sandbox.run([NEMO], env={"PYTHONPATH": site, "AUTOALLOC_DEBUG": "1"})
    assert_untouched(result)
    assert "skip rule torch-memory-saver" in result.stderr


# ---------------------------------------------------------------- lhotse: a real client that imports torch itself


def test_lhotse_import_rule_applies_before_torch_loads(sandbox: Sandbox) -> None:
    sandbox.user_policy('[[rules]]\nname = "lhotse-users"\nimports = ["lhotse"]\n')
    code = "import sys\nimport lhotse\nprint('TORCH_BY_LHOTSE', 'torch' in sys.modules)\n" + PROBE
    result = sandbox.run(["-c", code], env={"AUTOALLOC_DEBUG": "1"})
    probe = assert_applied(result, "lhotse-users")
    assert "TORCH_BY_LHOTSE True" in result.stdout
    trace = [line for line in result.stderr.splitlines() if line.startswith("autoalloc: ")]
    (decided,) = [line for line in trace if "apply rule lhotse-users" in line]
    assert "module lhotse is imported" in decided and "PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'" in decided
    assert "runtime setter" not in result.stderr  # the environment was set before torch's code ran
    assert probe["env"]["PYTORCH_ALLOC_CONF"] == ES


DOCTOR = """
import json, subprocess, sys
import lhotse
import autoalloc
mine = autoalloc.status().as_dict()
child = subprocess.run([sys.argv[1], "doctor", "--json"], capture_output=True, text=True)
print("DOCTOR " + json.dumps({"status": mine, "doctor": json.loads(child.stdout), "rc": child.returncode}))
"""


@pytest.mark.slow  # test_doctor keeps doctor in a job
def test_lhotse_doctor_names_the_rule(sandbox: Sandbox) -> None:
    sandbox.user_policy('[[rules]]\nname = "lhotse-users"\nimports = ["lhotse"]\n')
    result = sandbox.run(["-c", DOCTOR, str(Path(PY).with_name("autoalloc"))])
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("DOCTOR ")]
    report = json.loads(line.split(" ", 1)[1])
    # autoalloc.status() in the process that imported lhotse: the rule, the trigger, set through the environment
    decision = report["status"]["decision"]
    assert (decision["action"], decision["rule"], decision["trigger"], decision["via"]) == ("apply", "lhotse-users", "lhotse", "env")
    assert decision["rule_source"].startswith("user ") and report["status"]["ok"] is True
    # `autoalloc doctor` started from inside that job: what its parent applied, still intact
    assert report["rc"] == 0
    inherited = report["doctor"]["inherited"]
    assert (inherited["rule"], inherited["value"], inherited["intact"]) == ("lhotse-users", ES, True)


@pytest.mark.slow  # no optimizer, left alone: test_training's export run
def test_lhotse_alone_is_not_a_trigger(sandbox: Sandbox) -> None:
    result = sandbox.run(["-c", "import lhotse\n" + PROBE])
    assert_untouched(result)


def test_explain_lists_lhotse_among_import_triggers(sandbox: Sandbox) -> None:
    sandbox.user_policy('[[rules]]\nname = "lhotse-users"\nimports = ["lhotse"]\n')
    cli = str(Path(PY).with_name("autoalloc"))
    result = sandbox.run([cli, "explain", "--json", "--", "python", "-c", "import lhotse"], python="")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["decision"]["action"] == "none"  # explain cannot know what the code will import ...
    assert "lhotse" in report["import_triggers"]  # ... so it says what it will watch for
    assert {"vllm", "sglang", "torch_memory_saver"} <= set(report["import_triggers"])
    # the toolkit imports count once the program trains: explain says so first
    assert "asr-toolkit-imports" in [item["rule"] for item in report["late"]]
    assert ("lhotse-users", "user") in [(r["name"], r["layer"]) for r in report["rules"]]
    text = sandbox.run([cli, "explain", "--", "python", "-c", "import lhotse"], python="").stdout
    assert "watching:" in text and "lhotse" in text


# ---------------------------------------------------------------- composition, end to end


@pytest.mark.slow  # more policy layers than test_e2e_core checks: the full run
def test_user_disable_and_project_replacement(sandbox: Sandbox) -> None:
    sandbox.script(NEMO)
    sandbox.user_policy('disable = ["nemo-asr-train"]\n')
    assert_untouched(sandbox.run([NEMO]))
    # a project file in the checkout brings its own rule of the same name, with its own options
    sandbox.write("NeMo/autoalloc.toml", textwrap.dedent("""\
        [[rules]]
        name = "nemo-asr-train"
        scripts = ["examples/asr/**/speech_to_text_*.py"]
        allocator = { garbage_collection_threshold = 0.8 }
    """))
    expected = f"{ES},garbage_collection_threshold:0.8"
    assert_applied(sandbox.run([NEMO]), "nemo-asr-train", expected)
    cli = str(Path(PY).with_name("autoalloc"))
    report = json.loads(sandbox.run([cli, "explain", "--json", "--", "python", NEMO], python="").stdout)
    assert report["decision"]["rule_source"].startswith("project ")
    assert report["inactive_rules"]["nemo-asr-train@builtin"].startswith("disabled by user")


# ---------------------------------------------------------------- profilers, debuggers, runpy

RUNPY = """
import runpy, sys
runpy.run_path(sys.argv[1], run_name="__main__")
"""


@pytest.mark.parametrize(
    "wrapper",
    [
        ["-m", "cProfile", "-o", "train.prof"],
        # cProfile in the quick run; every other wrapper end to end in the full run
        pytest.param(["-m", "cProfile", "-s", "cumtime"], marks=pytest.mark.slow),
        pytest.param(["-m", "profile", "-o", "train.prof"], marks=pytest.mark.slow),
        pytest.param(["-m", "pdb", "-c", "continue"], marks=pytest.mark.slow),
        pytest.param(["-m", "trace", "--count", "-C", "cover"], marks=pytest.mark.slow),
        pytest.param(["run_path.py"], marks=pytest.mark.slow),
    ],
    ids=["cProfile", "cProfile-sort", "profile", "pdb", "trace", "runpy.run_path"],
)
def test_wrapped_nemo_trainer_gets_what_the_real_run_gets(
    sandbox: Sandbox, wrapper: list[str], full: bool
) -> None:
    # people profile exactly the step-time problem this fixes: the profiled run gets the option too
    # under trace every line of torch's import would be traced (minutes): the script stops tracing
    # first; the decision is made at `import torch` either way, with trace's command line
    sandbox.script(NEMO, "import sys\nsys.settrace(None)\n" if "trace" in wrapper else "")
    sandbox.write("run_path.py", RUNPY)
    result = sandbox.run(
        [*wrapper, NEMO, "trainer.devices=1"], input="quit\n", env={"AUTOALLOC_DEBUG": "1"}
    )
    assert_applied(result, "nemo-asr-train")
    assert "runs another program: deciding for" in result.stderr
    if not full:  # what the real run gets (the same rule): test_e2e_core::test_builtin_rule_by_script_path
        return
    real = sandbox.run([NEMO, "trainer.devices=1"])
    assert probe_result(real.stdout)["applied"] == probe_result(result.stdout)["applied"]


ESPNET_TRAIN = {
    "espnet2/__init__.py": "",
    "espnet2/bin/__init__.py": "",
    "espnet2/bin/asr_train.py": PROBE,
}


@pytest.mark.parametrize(
    "wrapper",
    quick_first([
        ["-m", "cProfile", "-m"],
        ["-m", "pdb", "-c", "continue", "-m"],
        ["-m", "trace", "--trackcalls", "--module"],
    ], ["cProfile", "pdb", "trace"]),
)
@pytest.mark.slow  # a wrapper end to end: the cProfile, coverage and user wrappers; -m forms in process
def test_wrapped_module_trainer(sandbox: Sandbox, wrapper: list[str]) -> None:
    site = stand_in(
        sandbox,
        {**ESPNET_TRAIN, "espnet2/bin/asr_train.py": "import sys\nsys.settrace(None)\n" + PROBE},
    )
    result = sandbox.run(
        [*wrapper, "espnet2.bin.asr_train", "--ngpu", "1"], input="quit\n", env={"PYTHONPATH": site}
    )
    assert_applied(result, "espnet2-asr-train")


def test_runpy_after_torch_is_imported_decides_for_the_outer_script(sandbox: Sandbox) -> None:
    # the decision is made at `import torch`: an outer script importing torch first is the program
    sandbox.script(NEMO)
    sandbox.write("run_path.py", "import torch\n" + RUNPY)
    assert_untouched(sandbox.run(["run_path.py", NEMO]))


@pytest.mark.slow  # a variant of the cProfile-wrapped run
def test_wrapped_skip_rule_still_skips(sandbox: Sandbox) -> None:
    sandbox.script("NeMo/examples/asr/transcribe_speech.py")
    assert_untouched(
        sandbox.run(["-m", "cProfile", "-o", "x.prof", "NeMo/examples/asr/transcribe_speech.py"])
    )


def test_user_wrapper_from_the_policy(sandbox: Sandbox) -> None:
    # a profiler autoalloc does not know, added in one [[wrappers]] table of the user's policy
    sandbox.write(
        "myprof.py",
        "import runpy, sys\nsys.argv = sys.argv[3:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n",
    )
    sandbox.script(NEMO)
    sandbox.user_policy(
        '[[wrappers]]\nname = "myprof"\nscripts = ["myprof.py"]\nvalue_options = ["--out"]\n'
    )
    cli = str(Path(PY).with_name("autoalloc"))
    report = json.loads(
        sandbox.run(
            [cli, "explain", "--json", "--", "python", "myprof.py", "--out", "p", NEMO], python=""
        ).stdout
    )
    assert report["entry_point"]["target"] == str(sandbox.work / NEMO)
    assert report["wrappers"] == [
        {
            "name": "myprof",
            "layer": "user",
            "launcher": False,
            "kind": "script",
            "target": str(sandbox.work / "myprof.py"),
        }
    ]
    assert report["decision"]["rule"] == "nemo-asr-train"
    # sys.argv[0] is already the trainer at import torch here; the table is what explain goes by
    assert_applied(sandbox.run(["myprof.py", "--out", "p", NEMO]), "nemo-asr-train")


@pytest.mark.parametrize(
    ("command", "module"),
    quick_first([
        (["{bin}/coverage", "run", "--branch"], False),
        (["-m", "coverage", "run", "-p"], False),
        (["{bin}/coverage", "run", "--source", "espnet2", "-m"], True),
    ], ["coverage-run", "python-m-coverage-run", "coverage-run-m"]),
)
def test_coverage_run(sandbox: Sandbox, command: list[str], module: bool) -> None:
    pytest.importorskip("coverage")
    site = stand_in(sandbox, ESPNET_TRAIN)
    sandbox.script(NEMO)
    command = [arg.replace("{bin}", str(Path(PY).parent)) for arg in command]
    target = ["espnet2.bin.asr_train", "--ngpu", "1"] if module else [NEMO]
    result = sandbox.run([*command, *target], env={"PYTHONPATH": site})
    assert_applied(result, "espnet2-asr-train" if module else "nemo-asr-train")


# ---------------------------------------------------------------- launchers: one warning per job


def ranks(stdout: str, tag: str) -> list[dict]:
    """The JSON each rank printed after ``tag`` (ranks share stdout, so lines may run together)."""
    decoder = json.JSONDecoder()
    found = []
    for part in stdout.split(f"{tag} ")[1:]:
        found.append(decoder.raw_decode(part)[0])
    return found


MERGED = f"max_split_size_mb:256,{ES}"


@pytest.mark.slow
def test_accelerate_launch_every_rank_one_warning(sandbox: Sandbox) -> None:
    pytest.importorskip("accelerate")
    sandbox.write("wenet/wenet/bin/train.py", RANK_PROBE)
    # --multi_gpu starts torch.distributed workers (gloo here); the launcher imports torch, decides
    # for the script it launches, and the ranks inherit that one decision
    result = sandbox.run(
        [
            str(Path(PY).with_name("accelerate")),
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            "0",
            "wenet/bin/train.py",
            "--config",
            "conf/train.yaml",
        ],
        python="",
        cwd=sandbox.work / "wenet",
        env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"},
    )
    assert result.returncode == 0, result.stderr
    (seen,) = ranks(result.stdout, "RANKS")
    assert [(r["rank"], r["getter"], r["env"], r["applied"]) for r in seen] == [
        (rank, MERGED, MERGED, f"wenet-train;{MERGED}") for rank in (0, 1)
    ]
    (warning,) = autoalloc_warnings(result.stderr)
    assert "max_split_size_mb" in warning


@pytest.mark.slow
def test_accelerate_launch_cpu_child_inherits(sandbox: Sandbox) -> None:
    pytest.importorskip("accelerate")
    # `--cpu` starts one child process (accelerate's simple launcher), whatever --num_processes says
    sandbox.script(NEMO)
    result = sandbox.run(
        [str(Path(PY).with_name("accelerate")), "launch", "--cpu", "--num_processes", "2", NEMO],
        python="",
        env={"AUTOALLOC_DEBUG": "1"},
    )
    assert_applied(result, "nemo-asr-train")
    assert (
        "command accelerate runs another program: deciding for accelerate -> script"
        in result.stderr
    )
    assert "inherited rule nemo-asr-train" in result.stderr


LIGHTNING = """
import json, os, sys
import torch
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    data = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_steps=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Tiny(), data)
    print("LIGHTNING " + json.dumps({
        "rank": trainer.global_rank, "getter": torch._C._accelerator_getAllocatorSettings(),
        "env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "applied": os.environ.get("AUTOALLOC_APPLIED"),
        "argv": sys.orig_argv[1:],
    }), flush=True)


if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_lightning_ddp_relaunch_every_rank_one_warning(sandbox: Sandbox) -> None:
    pytest.importorskip("pytorch_lightning")
    # Lightning's DDP launcher re-runs `python /abs/script.py ARGS` for ranks 1..n-1, with the
    # parent's environment
    sandbox.write(NEMO, LIGHTNING)
    result = sandbox.run(
        [NEMO, "trainer.devices=2"], env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"}
    )
    assert result.returncode == 0, result.stderr
    seen = sorted(ranks(result.stdout, "LIGHTNING"), key=lambda r: r["rank"])
    assert [(r["rank"], r["getter"], r["env"], r["applied"]) for r in seen] == [
        (rank, MERGED, MERGED, f"nemo-asr-train;{MERGED}") for rank in (0, 1)
    ]
    assert seen[1]["argv"] == [str(sandbox.work / NEMO), "trainer.devices=2"]  # the re-launch form
    assert len(autoalloc_warnings(result.stderr)) == 1


@pytest.mark.slow  # a multi-process end-to-end run: the full run
def test_srun_ranks_decide_alike_and_only_rank_0_warns(sandbox: Sandbox) -> None:
    # `srun python train.py`: every task is started on its own, with its own SLURM_* variables
    sandbox.script(NEMO)
    results = [
        sandbox.run(
            [NEMO],
            env={
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank % 2),
                "SLURM_NTASKS": "3",
                "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256",
            },
        )
        for rank in range(3)
    ]
    for result in results:
        assert_applied(result, "nemo-asr-train", MERGED)
    assert [len(autoalloc_warnings(r.stderr)) for r in results] == [1, 0, 0]


@pytest.mark.parametrize(
    "variable", quick_first(["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"], ["RANK", "OMPI", "PMI"])
)
def test_other_global_ranks_stay_silent(sandbox: Sandbox, variable: str) -> None:
    sandbox.script(NEMO)
    result = sandbox.run(
        [NEMO],
        env={
            variable: "1",
            "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256",
            "AUTOALLOC_DEBUG": "1",
        },
    )
    assert_applied(result, "nemo-asr-train", MERGED)
    assert autoalloc_warnings(result.stderr) == []
    assert "rank 1, not warning (rank 0 does)" in result.stderr


# ---------------------------------------------------------------- Ray: default_worker.py

RAY_DRIVER = """
import json, sys
if sys.argv[1] == "torch-first":
    import torch
import ray
import asr_task

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
runtime_env = {"env_vars": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
seen = {
    "plain": ray.get(asr_task.plain.remote()),
    "runtime_env": ray.get(asr_task.plain.options(runtime_env=runtime_env).remote()),
    "imports_rule": ray.get(asr_task.in_module.remote()),
}
print("RAY " + json.dumps(seen), flush=True)
ray.shutdown()
"""

RAY_TASKS = """
import os, sys
import ray


def report():
    import torch
    return {"worker": os.path.basename(sys.orig_argv[1]),
            "getter": torch._C._accelerator_getAllocatorSettings(),
            "applied": os.environ.get("AUTOALLOC_APPLIED")}


@ray.remote(max_calls=1)  # a fresh worker process per task
def plain():
    return report()


@ray.remote(max_calls=1)
def in_module():
    import asr_task_steps  # what the user's `imports` rule names
    return asr_task_steps.report()
"""


@pytest.mark.slow
@pytest.mark.parametrize("order", ["torch-first", "ray-first"])
def test_ray_workers(sandbox: Sandbox, order: str) -> None:
    pytest.importorskip("ray")
    site = stand_in(
        sandbox, {"asr_task.py": RAY_TASKS, "asr_task_steps.py": "import torch\n" + RAY_TASKS}
    )
    sandbox.write(NEMO, RAY_DRIVER)
    sandbox.user_policy('[[rules]]\nname = "ray-asr-steps"\nimports = ["asr_task_steps"]\n')
    result = sandbox.run([NEMO, order], env={"PYTHONPATH": site}, timeout=300)
    assert result.returncode == 0, result.stderr
    (seen,) = ranks(result.stdout, "RAY")
    assert {task["worker"] for task in seen.values()} == {"default_worker.py"}
    if (
        order == "torch-first"
    ):  # the driver decided before it started the local cluster: workers inherit it
        assert {k: (v["getter"], v["applied"]) for k, v in seen.items()} == dict.fromkeys(
            seen, (ES, f"nemo-asr-train;{ES}")
        )
    else:  # ray.init() first (or `ray start`): a worker is default_worker.py, no rule matches it
        assert (seen["plain"]["getter"], seen["plain"]["applied"]) == ("", None)
        assert (seen["runtime_env"]["getter"], seen["runtime_env"]["applied"]) == (ES, None)
        assert (seen["imports_rule"]["getter"], seen["imports_rule"]["applied"]) == (
            ES,
            f"ray-asr-steps;{ES}",
        )
