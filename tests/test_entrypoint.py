"""Entry-point classification from full interpreter command lines (pure, no torch)."""

from __future__ import annotations

import os

import pytest

from autoalloc.entrypoint import EntryPoint, command_line, parse

pytestmark = pytest.mark.hook
PY = "/venv/bin/python"


@pytest.mark.parametrize(
    ("argv", "kind", "target", "args"),
    [
        ([PY, "train.py", "a"], "script", "/work/train.py", ("a",)),
        ([PY, "-u", "train.py"], "script", "/work/train.py", ()),
        ([PY, "./zipformer/train.py", "--world-size", "4"], "script", "/work/zipformer/train.py", ("--world-size", "4")),
        ([PY, "/abs/x/train.py"], "script", "/abs/x/train.py", ()),
        ([PY, "-X", "importtime", "train.py"], "script", "/work/train.py", ()),
        ([PY, "-Ximporttime", "train.py"], "script", "/work/train.py", ()),
        ([PY, "-W", "error", "-O", "train.py", "-m", "x"], "script", "/work/train.py", ("-m", "x")),
        ([PY, "-Werror", "train.py"], "script", "/work/train.py", ()),
        ([PY, "-uW", "ignore", "train.py"], "script", "/work/train.py", ()),
        ([PY, "--check-hash-based-pycs", "always", "train.py"], "script", "/work/train.py", ()),
        ([PY, "--", "train.py"], "script", "/work/train.py", ()),
        ([PY, "-m", "espnet2.bin.asr_train", "--ngpu", "1"], "module", "espnet2.bin.asr_train", ("--ngpu", "1")),
        ([PY, "-um", "wenet.bin.train"], "module", "wenet.bin.train", ()),
        ([PY, "-u", "-m", "wenet.bin.train", "-c", "x"], "module", "wenet.bin.train", ("-c", "x")),
        (
            [PY, "-mfairseq_cli.train", "--task", "audio_pretraining"],
            "module",
            "fairseq_cli.train",
            ("--task", "audio_pretraining"),
        ),
        ([PY, "-X", "dev", "-m", "pkg.mod"], "module", "pkg.mod", ()),
        (
            [PY, "-B", "-c", "from multiprocessing.spawn import spawn_main", "--multiprocessing-fork"],
            "code",
            "",
            ("--multiprocessing-fork",),
        ),
        ([PY, "-cpass"], "code", "", ()),
        ([PY, "-"], "stdin", "", ()),
        ([PY, "-", "s1"], "stdin", "", ("s1",)),
        ([PY, "/venv/bin/fairseq-hydra-train", "--config-dir", "c"], "command", "fairseq-hydra-train", ("--config-dir", "c")),
        ([PY, "/venv/bin/torchrun", "--nproc_per_node=2", "t.py"], "command", "torchrun", ("--nproc_per_node=2", "t.py")),
        ([PY, "C:/venv/Scripts/my-train.exe"], "command", "my-train", ()),
        ([PY, "/venv/bin/my-train-script.py"], "command", "my-train", ()),
    ],
)
def test_parse(argv: list[str], kind: str, target: str, args: tuple[str, ...]) -> None:
    entry = parse(argv, "/work")
    assert (entry.kind, entry.target, entry.args) == (kind, target, args)


def test_repl_and_stdin_depend_on_tty() -> None:
    assert parse([PY], "/work", stdin_isatty=True).kind == "repl"
    assert parse([PY], "/work", stdin_isatty=False).kind == "stdin"
    assert parse([PY, "-i"], "/work", stdin_isatty=True).kind == "repl"


def test_degenerate_command_lines() -> None:
    assert parse([], "/work") == EntryPoint("unknown")
    assert parse([PY, "-m"], "/work").kind == "unknown"
    assert parse([PY, "-c"], "/work").kind == "unknown"


def test_relative_script_without_cwd_stays_relative() -> None:
    entry = parse([PY, "train.py"], None)
    assert entry.kind == "script" and entry.target == "train.py"


def test_symlinked_checkout_keeps_both_paths(tmp_path) -> None:
    real = tmp_path / "src" / "NeMo-main" / "examples" / "asr"
    real.mkdir(parents=True)
    (real / "speech_to_text_ctc.py").write_text("")
    (tmp_path / "NeMo").symlink_to(tmp_path / "src" / "NeMo-main")
    entry = parse([PY, "NeMo/examples/asr/speech_to_text_ctc.py"], str(tmp_path))
    assert entry.path == str(tmp_path / "NeMo/examples/asr/speech_to_text_ctc.py")
    assert entry.realpath == os.path.realpath(real / "speech_to_text_ctc.py")


def test_directory_with_main_is_a_script(tmp_path) -> None:
    (tmp_path / "app").mkdir()
    entry = parse([PY, "app"], str(tmp_path))
    assert entry.kind == "script" and entry.target == str(tmp_path / "app")


def test_command_line_of_this_process() -> None:
    line = command_line()
    assert line and os.path.basename(line[0]).startswith("python")
