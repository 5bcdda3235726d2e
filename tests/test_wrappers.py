"""Wrappers taken off the command line: the real argv forms of profilers, debuggers, coverage
and launchers (pure: no torch, no subprocess), the table's validation and its layering."""

from __future__ import annotations

import os
import re

import pytest

from autoalloc import sources
from autoalloc.entrypoint import EntryPoint, parse
from autoalloc.policy import LayerConfig, PolicyError, Source, compose
from autoalloc.wrappers import Wrapper, unwrap, worker_argv
from tests.helpers import validate

pytestmark = pytest.mark.hook
PY = "/venv/bin/python"
EXT = "/home/u/.vscode/extensions/ms-python.debugpy-2025.1.0/bundled/libs/debugpy"


def program(argv: list[str], cwd: str = "/w") -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """``(names of the wrappers taken off, (kind, target), args)`` for a full command line."""
    got = unwrap(parse(argv, cwd), sources.builtin_wrappers(), cwd)
    return (
        tuple(s.wrapper.name for s in got.steps),
        (got.entry.kind, got.entry.target),
        got.entry.args,
    )


CASES = [
    # the standard library
    (
        [PY, "-m", "cProfile", "-o", "out.prof", "train.py", "--lr", "1"],
        ("cProfile",),
        ("script", "/w/train.py"),
        ("--lr", "1"),
    ),
    (
        [PY, "-m", "cProfile", "-s", "cumtime", "-m", "espnet2.bin.asr_train", "--ngpu", "1"],
        ("cProfile",),
        ("module", "espnet2.bin.asr_train"),
        ("--ngpu", "1"),
    ),
    (
        [PY, "-m", "cProfile", "-ostats.prof", "train.py"],
        ("cProfile",),
        ("script", "/w/train.py"),
        (),
    ),
    (
        [PY, "-m", "cProfile", "--outfile=x", "train.py"],
        ("cProfile",),
        ("script", "/w/train.py"),
        (),
    ),
    (
        [PY, "-m", "profile", "-o", "x", "train.py", "a"],
        ("cProfile",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, "-m", "pdb", "-c", "continue", "train.py", "a"],
        ("pdb",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, "-m", "pdb", "-m", "wenet.bin.train", "--config", "c"],
        ("pdb",),
        ("module", "wenet.bin.train"),
        ("--config", "c"),
    ),
    ([PY, "-m", "pdb", "--command=c", "train.py"], ("pdb",), ("script", "/w/train.py"), ()),
    (
        [PY, "-m", "trace", "--count", "-C", ".", "train.py", "-c", "x"],
        ("trace",),
        ("script", "/w/train.py"),
        ("-c", "x"),
    ),
    (
        [PY, "-m", "trace", "-t", "--module", "wenet.bin.train"],
        ("trace",),
        ("module", "wenet.bin.train"),
        (),
    ),
    (
        [PY, "-m", "trace", "-m", "--count", "train.py"],
        ("trace",),
        ("script", "/w/train.py"),
        (),
    ),  # -m: --missing
    ([PY, "-m", "ipdb", "train.py"], ("pdb",), ("script", "/w/train.py"), ()),
    ([PY, "/venv/bin/pudb3", "-s", "train.py"], ("pdb",), ("script", "/w/train.py"), ()),
    (
        [PY, "-m", "torch.utils.bottleneck", "train.py", "--lr", "1"],
        ("torch-bottleneck",),
        ("script", "/w/train.py"),
        ("--lr", "1"),
    ),
    # coverage.py
    (
        [PY, "/venv/bin/coverage", "run", "train.py", "a"],
        ("coverage",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, "/venv/bin/coverage", "run", "--branch", "--source", "src", "-p", "-m", "pkg.train"],
        ("coverage",),
        ("module", "pkg.train"),
        (),
    ),
    (
        [PY, "-m", "coverage", "run", "--data-file=.cov", "-m", "pkg.train", "x"],
        ("coverage",),
        ("module", "pkg.train"),
        ("x",),
    ),
    ([PY, "/venv/bin/coverage", "report", "-m"], (), ("command", "coverage"), ("report", "-m")),
    # profilers
    (
        [PY, "/venv/bin/memray", "run", "-o", "out.bin", "--native", "train.py", "a"],
        ("memray",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, "-m", "memray", "run", "--live", "-m", "pkg.train"],
        ("memray",),
        ("module", "pkg.train"),
        (),
    ),
    (
        [PY, "/venv/bin/memray", "flamegraph", "out.bin"],
        (),
        ("command", "memray"),
        ("flamegraph", "out.bin"),
    ),
    (
        [
            PY,
            "/venv/bin/scalene",
            "run",
            "--cpu-only",
            "-o",
            "p.json",
            "train.py",
            "---",
            "--lr",
            "1",
        ],
        ("scalene",),
        ("script", "/w/train.py"),
        ("---", "--lr", "1"),
    ),
    (
        [PY, "-m", "scalene", "run", "-c", "scalene.yaml", "train.py"],
        ("scalene",),
        ("script", "/w/train.py"),
        (),
    ),
    (
        [PY, "/venv/bin/kernprof", "-l", "-v", "-o", "x.lprof", "train.py", "a"],
        ("kernprof",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, "/venv/bin/kernprof", "-lv", "-m", "pkg.train", "a"],
        ("kernprof",),
        ("module", "pkg.train"),
        ("a",),
    ),
    (
        [PY, "/venv/bin/viztracer", "-o", "r.json", "--log_torch", "train.py", "a"],
        ("viztracer",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, "/venv/bin/viztracer", "--exclude_files", "a", "b", "--", "train.py", "x"],
        ("viztracer",),
        ("script", "/w/train.py"),
        ("x",),
    ),
    (
        [PY, "-m", "viztracer", "-m", "pkg.train", "x"],
        ("viztracer",),
        ("module", "pkg.train"),
        ("x",),
    ),
    (
        [PY, "/venv/bin/py-spy", "record", "-o", "p.svg", "--", "python", "-u", "train.py"],
        ("py-spy",),
        ("script", "/w/train.py"),
        (),
    ),
    (
        [PY, "/venv/bin/py-spy", "record", "--pid", "123"],
        (),
        ("command", "py-spy"),
        ("record", "--pid", "123"),
    ),
    # debuggers: debugpy's CLI, VS Code's launcher and the debuggee it starts, PyCharm's pydevd
    (
        [PY, "-m", "debugpy", "--listen", "5678", "--wait-for-client", "train.py", "a"],
        ("debugpy",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, "-m", "debugpy", "--listen", "0.0.0.0:5678", "-m", "pkg.train", "a"],
        ("debugpy",),
        ("module", "pkg.train"),
        ("a",),
    ),
    (
        [PY, "-m", "debugpy", "--listen", "5678", "--pid", "123"],
        (),
        ("module", "debugpy"),
        ("--listen", "5678", "--pid", "123"),
    ),
    (
        [PY, f"{EXT}/launcher", "50123", "--", "/w/train.py", "a"],
        ("debugpy-launcher",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [PY, f"{EXT}/launcher", "127.0.0.1:50123", "--", "-m", "pkg.train"],
        ("debugpy-launcher",),
        ("module", "pkg.train"),
        (),
    ),
    (
        [
            PY,
            "-X",
            "frozen_modules=off",
            EXT,
            "--connect",
            "127.0.0.1:50124",
            "--configure-qt",
            "none",
            "--adapter-access-token",
            "tok",
            "/w/train.py",
            "a",
        ],
        ("debugpy",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [
            PY,
            "/opt/pycharm/plugins/python-ce/helpers/pydev/pydevd.py",
            "--multiprocess",
            "--qt-support=auto",
            "--client",
            "127.0.0.1",
            "--port",
            "40123",
            "--file",
            "train.py",
            "a",
        ],
        ("pydevd",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    # launchers
    (
        [PY, "/venv/bin/torchrun", "--nproc_per_node=2", "train.py"],
        ("torchrun",),
        ("script", "/w/train.py"),
        (),
    ),
    (
        [PY, "/venv/bin/torchrun", "--no-python", "my-train", "x"],
        ("torchrun",),
        ("command", "my-train"),
        ("x",),
    ),
    (
        [PY, "/venv/bin/torchrun", "--no-python", "python3", "-u", "train.py"],
        ("torchrun",),
        ("script", "/w/train.py"),
        (),
    ),
    (
        [PY, "/venv/bin/torchrun", "--run-path", "train.py"],
        ("torchrun",),
        ("script", "/w/train.py"),
        (),
    ),
    (
        [PY, "/venv/bin/accelerate", "launch", "--cpu", "--num_processes", "2", "train.py", "a"],
        ("accelerate",),
        ("script", "/w/train.py"),
        ("a",),
    ),
    (
        [
            PY,
            "/venv/bin/accelerate",
            "launch",
            "--multi_gpu",
            "--mixed_precision=bf16",
            "-m",
            "pkg.train",
        ],
        ("accelerate",),
        ("module", "pkg.train"),
        (),
    ),
    (
        [PY, "-m", "accelerate.commands.launch", "--num_processes", "2", "train.py"],
        ("accelerate-launch",),
        ("script", "/w/train.py"),
        (),
    ),
    ([PY, "/venv/bin/accelerate", "config"], (), ("command", "accelerate"), ("config",)),
    (
        [
            PY,
            "/venv/bin/deepspeed",
            "--num_gpus",
            "2",
            "--save_pid",
            "train.py",
            "--deepspeed",
            "ds.json",
        ],
        ("deepspeed",),
        ("script", "/w/train.py"),
        ("--deepspeed", "ds.json"),
    ),
    (
        [PY, "/venv/bin/deepspeed", "--hostfile=h", "--module", "pkg.train"],
        ("deepspeed",),
        ("module", "pkg.train"),
        (),
    ),
    # what the deepspeed runner starts on each node, and what that starts per rank (a plain script)
    (
        [
            PY,
            "-u",
            "-m",
            "deepspeed.launcher.launch",
            "--world_info=eyJsb2NhbGhvc3QiOiBbMF19",
            "--master_addr=127.0.0.1",
            "--master_port=29500",
            "--save_pid",
            "4242",
            "--enable_each_rank_log=None",
            "train.py",
            "--deepspeed",
        ],
        ("deepspeed-launch",),
        ("script", "/w/train.py"),
        ("--deepspeed",),
    ),
    (
        [PY, "-u", "train.py", "--local_rank=1", "--deepspeed"],
        (),
        ("script", "/w/train.py"),
        ("--local_rank=1", "--deepspeed"),
    ),
    (
        [PY, "/venv/bin/fabric", "run", "--accelerator", "cuda", "--devices", "2", "train.py"],
        ("lightning-fabric",),
        ("script", "/w/train.py"),
        (),
    ),
    # nested: coverage of a torchrun job
    (
        [
            PY,
            "-m",
            "coverage",
            "run",
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "train.py",
        ],
        ("coverage", "torchrun"),
        ("script", "/w/train.py"),
        (),
    ),
    # not wrappers
    ([PY, "train.py", "-m", "cProfile"], (), ("script", "/w/train.py"), ("-m", "cProfile")),
    ([PY, "-m", "cProfile"], (), ("module", "cProfile"), ()),
    ([PY, "-m", "pdb", "-p", "123"], (), ("module", "pdb"), ("-p", "123")),
]


@pytest.mark.parametrize(("argv", "steps", "target", "args"), CASES, ids=lambda v: None)
def test_real_argv_forms(
    argv: list[str], steps: tuple[str, ...], target: tuple[str, str], args: tuple[str, ...]
) -> None:
    assert program(argv) == (steps, target, args)


def test_code_programs() -> None:
    got = unwrap(
        parse([PY, "-m", "memray", "run", "-c", "import torch", "a"], "/w"),
        sources.builtin_wrappers(),
        "/w",
    )
    assert got.entry == EntryPoint("code", "", ("a",))
    got = unwrap(
        parse([PY, "-m", "debugpy", "--listen", "1", "-c", "import torch"], "/w"),
        sources.builtin_wrappers(),
        "/w",
    )
    assert got.entry.kind == "code"


@pytest.mark.parametrize(
    ("launcher", "worker"),
    [
        (
            [
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=2",
                "train.py",
                "--max-duration",
                "600",
            ],
            ["-u", "/w/train.py", "--max-duration", "600"],
        ),
        (
            [
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "1",
                "--nproc-per-node",
                "2",
                "--standalone",
                "train.py",
                "x.py",
            ],
            ["-u", "/w/train.py", "x.py"],
        ),
        (
            ["-m", "torch.distributed.launch", "--use_env", "--nproc_per_node", "2", "train.py"],
            ["-u", "/w/train.py"],
        ),
        (
            [
                "/venv/bin/torchrun",
                "--nproc_per_node=4",
                "-m",
                "espnet2.bin.asr_train",
                "--ngpu",
                "4",
            ],
            ["-u", "-m", "espnet2.bin.asr_train", "--ngpu", "4"],
        ),
        (
            ["/venv/bin/torchrun", "--nproc_per_node", "2", "--no-python", "fairseq-hydra-train"],
            None,
        ),
        (["/venv/bin/torchrun", "--nproc_per_node=2"], None),
        (["-m", "torch.distributed.elastic.agent"], None),
        (["train.py", "--nproc_per_node=2", "x.py"], None),
        (["-m", "cProfile", "train.py"], None),  # runs the program itself, no workers
    ],
)
def test_launcher_worker_argv(launcher: list[str], worker: list[str] | None) -> None:
    got = worker_argv(unwrap(parse([PY, *launcher], "/w"), sources.builtin_wrappers(), "/w"), PY)
    assert got == (None if worker is None else [PY, *worker])


def test_runpy_argv0_names_the_program(tmp_path) -> None:
    (tmp_path / "run.py").write_text("")
    (tmp_path / "train.py").write_text("")
    entry = parse([PY, "run.py"], str(tmp_path))
    got = unwrap(entry, sources.builtin_wrappers(), str(tmp_path), ["train.py", "--lr", "1"])
    assert (got.entry.kind, got.entry.target, got.entry.args) == (
        "script",
        str(tmp_path / "train.py"),
        ("--lr", "1"),
    )
    assert [s.wrapper.name for s in got.steps] == ["sys.argv"]
    # unchanged sys.argv, a missing file, a non-script, a -m module: the command line decides
    assert unwrap(entry, (), str(tmp_path), ["run.py"]).entry == entry
    assert unwrap(entry, (), str(tmp_path), ["missing.py"]).entry == entry
    assert unwrap(entry, (), str(tmp_path), ["-c"]).entry == entry
    module = parse([PY, "-m", "pkg.run"], str(tmp_path))
    assert unwrap(module, (), str(tmp_path), [str(tmp_path / "train.py")]).entry == module
    # a launcher's own sys.argv is not its workers' program
    torchrun = parse([PY, "/venv/bin/torchrun", "run.py"], str(tmp_path))
    assert unwrap(torchrun, sources.builtin_wrappers(), str(tmp_path), ["train.py"]).entry.target == str(
        tmp_path / "run.py"
    )


def test_symlinked_argv0_is_the_same_program(tmp_path) -> None:
    (tmp_path / "train.py").write_text("")
    os.symlink(tmp_path / "train.py", tmp_path / "link.py")
    entry = parse([PY, "link.py"], str(tmp_path))
    assert unwrap(entry, (), str(tmp_path), [str(tmp_path / "train.py")]).steps == ()


def test_the_builtin_table_loads_and_is_what_the_policy_uses() -> None:
    names = [w.name for w in sources.builtin_wrappers()]
    for name in (
        "cProfile",
        "pdb",
        "trace",
        "coverage",
        "debugpy",
        "memray",
        "scalene",
        "kernprof",
        "viztracer",
        "torch-bottleneck",
        "py-spy",
        "torchrun",
        "accelerate",
        "deepspeed",
    ):
        assert name in names
    assert len(set(names)) == len(names)
    # every wrapper of the file is valid: the table is read tolerantly, leaving a bad one out
    read = sources.load_file("builtin", sources.WRAPPERS_PATH, allow_trust=False)
    assert (read.status, read.message) == ("found", "")
    with open(sources.WRAPPERS_PATH, encoding="utf-8") as f:
        assert len(names) == f.read().count("\n[[wrappers]]\n")


def test_the_builtin_table_names_its_wrappers_as_may_wrap_looks_for_them() -> None:
    """``may_wrap`` rules a program out by searching wrappers.toml's text for its module or
    command name quoted (``"name"``), or its file name at the end of a quoted string
    (``"name"``, ``".../name"``): every module and command pattern there must be that
    literal, and every script pattern's last segment. A glob would match programs that text
    search never finds, and the wrapper would never be taken off."""
    with open(sources.WRAPPERS_PATH, encoding="utf-8") as f:
        text = f.read()

    def literal(name: str) -> bool:
        return bool(name) and not any(c in name for c in "*?[")

    for wrapper in sources.builtin_wrappers():
        for name in (*wrapper.modules, *wrapper.commands):
            assert literal(name) and f'"{name}"' in text, (wrapper.name, name)
            kind = "module" if name in wrapper.modules else "command"
            entry = EntryPoint(kind, name, (), f"/venv/bin/{name}", f"/venv/bin/{name}")
            assert wrapper.runs(entry) and sources.may_wrap(entry), (wrapper.name, name)
        for pattern in wrapper.scripts:
            last = pattern.rsplit("/", 1)[-1]
            quoted = f'/{last}"' if "/" in pattern else f'"{last}"'
            assert literal(last) and quoted in text, (wrapper.name, pattern)
            path = "/x/" + pattern.replace("**/", "")
            for kind, target in (("script", path), ("command", last)):
                entry = EntryPoint(kind, target, (), path, path)
                assert wrapper.runs(entry) and sources.may_wrap(entry), (wrapper.name, pattern)


def test_user_wrapper_validates_replaces_and_disables() -> None:
    user = validate(
        {
            "wrappers": [
                {"name": "my-profiler", "commands": ["myprof"], "value_options": ["-o"]},
                {"name": "cProfile", "modules": ["cProfile"], "value_options": ["-o", "-s", "-x"]},
            ],
            "disable": ["memray"],
        },
        Source("user", "/u/config.toml"),
        allow_trust=True,
    )
    builtin = LayerConfig(Source("builtin", "/b"), wrappers=sources.builtin_wrappers())
    table = compose([builtin, user]).wrappers
    names = [w.name for w in table]
    assert names[:2] == ["my-profiler", "cProfile"] and table[1].layer == "user"
    assert names.count("cProfile") == 1 and "memray" not in names
    got = unwrap(parse([PY, "/venv/bin/myprof", "-o", "x", "train.py"], "/w"), table, "/w")
    assert got.entry.target == "/w/train.py" and got.steps[0].wrapper.layer == "user"
    got = unwrap(parse([PY, "-m", "cProfile", "-x", "1", "train.py"], "/w"), table, "/w")
    assert got.entry.target == "/w/train.py"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([{"name": "x"}], "needs at least one of modules, commands, scripts"),
        ([{"name": "x", "modules": ["m"], "flags": ["-q"]}], "unknown key 'flags'"),
        ([{"name": "x", "modules": "m"}], 'wrapper 1 ("x"): modules must be a list of strings'),
        ([{"name": "x", "modules": ["m"], "launcher": "yes"}], "launcher must be true or false"),
        (
            [{"name": "x", "modules": ["m"], "program": "shell"}],
            "program must be 'python' or 'command'",
        ),
        ([{"name": "bad name", "modules": ["m"]}], "name must be"),
        (
            [{"name": "x", "modules": ["m"]}, {"name": "x", "commands": ["c"]}],
            "wrapper 2: another wrapper is already named 'x'",
        ),
        ({"name": "x"}, "wrappers must be an array of tables"),
    ],
)
def test_bad_wrapper_tables_name_the_key(table: object, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        validate({"wrappers": table}, Source("project", "/p/autoalloc.toml"))


def test_wrapper_matches_by_module_command_or_path() -> None:
    w = Wrapper("w", modules=("m",), commands=("c",), scripts=("pkg/launcher",))
    assert w.runs(EntryPoint("module", "m"))
    assert w.runs(EntryPoint("command", "c", path="/v/bin/c"))
    assert w.runs(EntryPoint("script", "/x/pkg/launcher", path="/x/pkg/launcher"))
    assert not w.runs(EntryPoint("script", "/x/otherpkg/launcher", path="/x/otherpkg/launcher"))
    assert not w.runs(EntryPoint("code"))


@pytest.mark.parametrize(
    "pattern", ["**/tools/mywrap.py", "mywrap.py", "tools/mywrap.py", "tools/*.py", "my*.py"]
)
def test_wrapper_scripts_are_the_globs_rules_accept(pattern: str) -> None:
    """A ``[[wrappers]]`` entry written like a rule (``scripts = ["**/mywrap.py"]``) matches
    what the same pattern in a rule matches, and is taken off."""
    config = validate(
        {
            "wrappers": [{"name": "mywrap", "scripts": [pattern]}],
            "rules": [{"name": "same", "scripts": [pattern]}],
        },
        Source("project", "/w/autoalloc.toml"),
    )
    entry = parse([PY, "/w/tools/mywrap.py", "train.py", "--lr", "1"], "/w")
    other = parse([PY, "/w/bin/notmine.py", "train.py"], "/w")
    (rule,), (wrapper,) = config.rules, config.wrappers
    assert rule.compiled.script(entry.path) and wrapper.runs(entry)
    assert not rule.compiled.script(other.path) and not wrapper.runs(other)
    got = unwrap(entry, config.wrappers, "/w")
    assert (got.entry.target, got.entry.args) == ("/w/train.py", ("--lr", "1"))


def test_explain_shows_the_unwrapped_program(tmp_path) -> None:
    from autoalloc.explain import explain, render

    script = tmp_path / "NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    env = {
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "c"),
        "XDG_CONFIG_DIRS": str(tmp_path / "s"),
    }
    report = explain(
        ["python", "-m", "cProfile", "-o", "x.prof", str(script), "a=1"], env=env, cwd=str(tmp_path)
    )
    assert (report["entry_point"]["kind"], report["entry_point"]["target"]) == (
        "script",
        str(script),
    )
    assert report["wrappers"] == [
        {
            "name": "cProfile",
            "layer": "builtin",
            "launcher": False,
            "kind": "module",
            "target": "cProfile",
        }
    ]
    assert "launcher" not in report and report["decision"]["rule"] == "nemo-asr-train"
    assert "(as run by cProfile)" in render(report)
    report = explain(
        [
            "python",
            "-m",
            "coverage",
            "run",
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            str(script),
        ],
        env=env,
        cwd=str(tmp_path),
    )
    assert [w["name"] for w in report["wrappers"]] == ["coverage", "torchrun"]
    assert report["launcher"]["target"] == "torch.distributed.run"
    assert "as seen by the workers of torch.distributed.run" in render(report)


@pytest.mark.parametrize("argv, agent", [
    (["-m", "torch.distributed.run", "--nnodes", "2", "train.py"], True),
    (["-m", "torch.distributed.run", "--nnodes=2", "train.py"], True),
    (["-m", "torch.distributed.run", "--nnodes", "1:2", "train.py"], True),
    (["-m", "torch.distributed.run", "--nnodes=1:1", "train.py"], False),
    # the training script's own --nnodes is not the launcher's
    (["-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py", "--nnodes", "2"], False),
    (["-m", "torch.distributed.run", "--nnodes", "1", "train.py", "--nnodes=4"], False),
    # the launcher further in than argv[:4], inside a profiler
    (["-m", "cProfile", "-o", "out.prof", "-m", "torch.distributed.run", "--nnodes", "2",
      "train.py"], True),
    (["train.py", "--launcher", "torchrun", "--nnodes", "2"], False),  # no launcher at all
])
def test_the_agent_reads_nnodes_from_the_launchers_own_arguments(
    tmp_path, argv: list[str], agent: bool
) -> None:
    from autoalloc import hook

    (tmp_path / "train.py").write_text("")
    program = unwrap(parse([PY, *argv], str(tmp_path)), sources.builtin_wrappers(), str(tmp_path))
    assert hook.many_node_agent(program, {}) is agent, program.describe()
    assert hook.many_node_agent(program, {"RANK": "0"}) is False
