"""What autoalloc says, word for word: each message names what to fix and how.

Policy errors name the rule as a person counts it (``rule 2 ("my-asr-train")``) and suggest
the closest valid key or value; a mistake costs only the part of the file it is in; policy
warnings survive a blanket ``UserWarning`` filter; ``autoalloc init`` writes a file that
changes nothing until edited; ``explain`` puts the decision first; ``doctor``'s headline says
what to run to check a job.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest

from autoalloc import __version__, cli, decide, messages, schema, sources
from autoalloc.entrypoint import EntryPoint
from autoalloc.explain import explain, render
from autoalloc.policy import LayerConfig, Source, salvage, summarize
from tests.helpers import Sandbox, autoalloc_warnings, validate

SRC = Source("project", "/p/autoalloc.toml")
NEMO = "NeMo/examples/asr/asr_ctc/speech_to_text_ctc_bpe.py"


def problems(data: dict) -> str:
    return summarize(salvage(data, SRC)[1])


# -- policy errors: the rule, counted from 1, and the closest valid word ----------------------


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (
            {"rules": [{"name": "a", "scripts": ["x.py"]},
                       {"name": "my-asr-train", "scripts": ["t.py"],
                        "allocator": {"expandable_segment": True}}]},
            'rule 2 ("my-asr-train"): unknown allocator option \'expandable_segment\' '
            "\N{EM DASH} did you mean 'expandable_segments'? The option 'expandable_segment' is "
            "ignored; expandable_segments then comes from the defaults ([allocator], built-in: "
            "expandable_segments:True). The rest of the file applies.",
        ),
        (  # an invalid value of an option that has a default: the default stays in effect
            {"allocator": {"expandable_segments": "maybe"}},
            "allocator.expandable_segments: must be true or false. The option "
            "'expandable_segments' is ignored; expandable_segments then comes from the "
            "defaults ([allocator], built-in: expandable_segments:True). The rest of the file "
            "applies.",
        ),
        (  # the typo beside the right key: that one is in effect, nothing more to say
            {"allocator": {"expandable_segment": True, "expandable_segments": False}},
            "unknown allocator option 'expandable_segment' \N{EM DASH} did you mean "
            "'expandable_segments'? The option 'expandable_segment' is ignored. The rest of "
            "the file applies.",
        ),
        (
            {"rules": [{"name": "my-asr-train", "scripst": ["t.py"]}]},
            'rule 1 ("my-asr-train"): unknown key \'scripst\' \N{EM DASH} did you mean '
            "'scripts'? Rule 1 is ignored. The rest of the file applies.",
        ),
        (
            {"rules": [{"name": "serve", "scripts": ["s.py"], "action": "skp"}]},
            "rule 1 (\"serve\"): action must be 'apply' or 'skip', not 'skp' \N{EM DASH} did you "
            "mean 'skip'? Rule 1 is ignored. The rest of the file applies.",
        ),
        (
            {"on_conflict": "overide"},
            "on_conflict must be 'keep' or 'override', not 'overide' \N{EM DASH} did you mean "
            "'override'? The setting 'on_conflict' is ignored. The rest of the file applies.",
        ),
        (
            {"disabel": ["hf-asr-examples"]},
            "unknown key 'disabel' \N{EM DASH} did you mean 'disable'? The setting 'disabel' is "
            "ignored. The rest of the file applies.",
        ),
        (
            {"allocator": {"garbage_collection_treshold": 0.8}},
            "unknown allocator option 'garbage_collection_treshold' \N{EM DASH} did you mean "
            "'garbage_collection_threshold'? The option 'garbage_collection_treshold' is "
            "ignored. The rest of the file applies.",
        ),
        (
            {"allocator": {"backend": "cudaMallocAsyn"}},
            "allocator.backend: must be one of 'native', 'cudaMallocAsync' \N{EM DASH} did you "
            "mean 'cudaMallocAsync'? The option 'backend' is ignored. The rest of the file "
            "applies.",
        ),
        (
            {"rules": [{"name": "a", "scripts": ["x.py"]}, {"name": "a", "scripts": ["y.py"]}]},
            "rule 2: another rule is already named 'a'. Rule 2 is ignored. The rest of the file "
            "applies.",
        ),
        (
            {"wrappers": [{"name": "myprof", "scripts": ["p.py"]},
                          {"name": "other", "modules": ["m"], "value_option": ["-o"]}]},
            'wrapper 2 ("other"): unknown key \'value_option\' \N{EM DASH} did you mean '
            "'value_options'? Wrapper 2 is ignored. The rest of the file applies.",
        ),
        (
            {"allocator": {"zzz": 1}},  # nothing close: no suggestion
            "unknown allocator option 'zzz'. The option 'zzz' is ignored. The rest of the file "
            "applies.",
        ),
    ],
)
def test_policy_error_text(data: dict, text: str) -> None:
    assert problems(data) == text


def test_many_problems_are_counted_not_listed() -> None:
    data = {"rules": [{"name": f"r{i}", "scripts": ["x"], "action": "no"} for i in range(5)]}
    text = problems(data)
    assert text.endswith(" (2 more: run `autoalloc check`.) The rest of the file applies.")
    assert text.count("is ignored.") == 3


def test_a_bad_wrapper_costs_that_wrapper() -> None:
    data = {"wrappers": [{"name": "a", "scripts": ["a.py"]}, {"name": "b", "scripts": 1},
                         {"name": "a", "modules": ["m"]}]}
    config, found = salvage(data, SRC)
    assert [w.name for w in config.wrappers] == ["a"]
    assert found == (
        'wrapper 2 ("b"): scripts must be a list of strings. Wrapper 2 is ignored.',
        "wrapper 3: another wrapper is already named 'a'. Wrapper 3 is ignored.",
    )


def test_a_valid_file_is_validated_once_and_says_nothing() -> None:
    data = {"rules": [{"name": "a", "scripts": ["x.py"]}]}
    config, found = salvage(data, SRC)
    assert found == () and config == validate(data, SRC) and summarize(found) == ""


# -- a typo in one rule costs that rule only ---------------------------------------------------


@pytest.fixture
def world(isolated_home: Sandbox) -> Path:
    (isolated_home.root / "proj").mkdir()
    return isolated_home.root


POLICY = """\
[[rules]]
name = "my-inference"
scripts = ["**/infer*.py"]
action = "skip"

[[rules]]
name = "broken"
scripts = ["**/other*.py"]
action = "aply"

[[rules]]
name = "my-asr-train"
scripts = ["**/train_asr*.py"]
allocator = { expandable_segment = true, garbage_collection_threshold = 0.8 }
"""


def decide_for(world: Path, script: str) -> decide.Decision:
    path = str(world / "proj" / script)
    entry = EntryPoint("script", path, (), path, path)
    policy = sources.load(entry, {}, str(world / "proj"))
    return decide.decide(policy, entry, {}, None)


def test_typo_in_one_rule_keeps_deny_and_allow_rules(world: Path) -> None:
    path = world / "proj" / "autoalloc.toml"
    path.write_text(POLICY)
    train = decide_for(world, "train_asr.py")
    assert (train.action, train.rule) == ("apply", "my-asr-train")
    assert train.requested == {
        "expandable_segments": "True",
        "garbage_collection_threshold": "0.8",
    }
    infer = decide_for(world, "infer.py")
    assert (infer.action, infer.rule) == ("skip", "my-inference")
    assert decide_for(world, "other.py").action == "none"
    (warning,) = [w for w in train.warnings if str(path) in w]
    assert warning == (
        f"autoalloc: in the project policy {path}: rule 2 (\"broken\"): action must be 'apply' "
        "or 'skip', not 'aply' \N{EM DASH} did you mean 'apply'? Rule 2 is ignored. "
        'rule 3 ("my-asr-train"): unknown allocator option \'expandable_segment\' '
        "\N{EM DASH} did you mean 'expandable_segments'? The option 'expandable_segment' is "
        "ignored; expandable_segments then comes from the defaults ([allocator], built-in: "
        "expandable_segments:True). The rest of the file applies."
    )


def test_a_file_that_is_not_toml_is_one_sentence(world: Path) -> None:
    path = world / "proj" / "autoalloc.toml"
    path.write_text("enabled = [unclosed\n")
    (warning,) = decide.layer_warnings(sources.load(EntryPoint("unknown"), {}, str(path.parent)))
    assert warning.startswith(f"autoalloc: ignoring the project policy {path}: not valid TOML: ")


# -- policy warnings survive a blanket UserWarning filter --------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "shown"),
    [
        (["-W", "ignore::UserWarning"], {}, True),
        # the same filter from the environment, and autoalloc named (also in test_hostile): --full
        pytest.param([], {"PYTHONWARNINGS": "ignore::UserWarning"}, True, marks=pytest.mark.slow),
        pytest.param(["-W", "ignore:autoalloc"], {}, False, marks=pytest.mark.slow),
    ],
)
def test_policy_warning_survives_userwarning_filter(
    sandbox: Sandbox, args: list[str], env: dict, shown: bool
) -> None:
    bad = sandbox.write("autoalloc.toml", '[allocator]\nexpandable_segment = true\n')
    script = sandbox.write("train.py", "import torch\n")
    result = sandbox.run([*args, str(script)], env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    said = autoalloc_warnings(result.stderr)
    if not shown:
        assert said == []
        return
    (line,) = said
    assert line.endswith(
        f"AutoallocWarning: autoalloc: in the project policy {bad}: unknown allocator option "
        "'expandable_segment' \N{EM DASH} did you mean 'expandable_segments'? The option "
        "'expandable_segment' is ignored; expandable_segments then comes from the defaults "
        "([allocator], built-in: expandable_segments:True). The rest of the file applies."
    )


# -- autoalloc check: counts and sentences -----------------------------------------------------


def test_check_says_rule_and_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one.toml"
    one.write_text('[[rules]]\nname = "a"\nscripts = ["x.py"]\n')
    two = tmp_path / "two.toml"
    two.write_text(
        '[[rules]]\nname = "a"\nscripts = ["x.py"]\n[[rules]]\nname = "b"\nmodules = ["m"]\n'
    )
    broken = tmp_path / "broken.toml"
    broken.write_text("enabled = \n")
    assert cli.main(["check", str(one), str(two)]) == 0
    assert capsys.readouterr().out == f"ok     {one}  (1 rule)\nok     {two}  (2 rules)\n"
    assert cli.main(["check", str(broken)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"error  {broken}: not valid TOML: ")
    assert out.endswith("; the file is ignored\n")


# -- autoalloc init: a starter that changes nothing until edited -------------------------------


def test_init_writes_an_inert_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init"]) == 0
    text = (tmp_path / "autoalloc.toml").read_text()
    source = Source("project", str(tmp_path / "autoalloc.toml"))
    assert validate(sources.parse_toml(text.encode()), source) == LayerConfig(source)
    # every example in it is valid once uncommented
    example = re.compile(r"# (\[|\w+ = )")
    uncommented = "\n".join(line[2:] for line in text.splitlines() if example.match(line))
    config = validate(sources.parse_toml(uncommented.encode()), source)
    assert [r.name for r in config.rules] == ["my-asr-train", "my-inference"]
    assert config.enabled is False and config.disable == ("hf-asr-examples",)


# -- explain: the decision first, the deciding rule marked, built-in rules collapsed -----------


def test_explain_text_puts_the_decision_first(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "u"),
           "XDG_CONFIG_DIRS": str(tmp_path / "s")}
    (tmp_path / NEMO).parent.mkdir(parents=True)
    (tmp_path / NEMO).write_text("")  # a script that does not exist: an error line first
    report = explain(["python", NEMO], env=env, cwd=str(tmp_path))
    lines = render(report).splitlines()
    builtin = sources.BUILTIN_PATH
    assert lines[0] == f"decision:     apply  rule nemo-asr-train from builtin ({builtin})"
    assert lines[1] == "because:      script matches '**/examples/asr/**/speech_to_text_*.py'"
    rules = lines[lines.index("rules, in match order (> decides):") + 1 :]
    assert rules[0].startswith("> apply nemo-asr-train           [builtin]  ")
    off = [f"  off   {name:<24} {why}" for name, why in report["inactive_rules"].items()]
    assert rules[1:] == [
        *off,
        f"  ({len(report['rules']) - 1} more built-in rules that cannot decide this command: "
        "autoalloc explain --verbose lists them)",
    ]
    verbose = render(report, verbose=True).splitlines()
    assert not any("--verbose lists them" in line for line in verbose)
    for rule in report["rules"]:
        assert any(f" {rule['name']} " in line for line in verbose)


# -- doctor: a headline a user understands ----------------------------------------------------


def test_doctor_headline(sandbox: Sandbox) -> None:
    result = sandbox.run(["-m", "autoalloc", "doctor"])
    assert result.returncode == 0, result.stderr
    # A bare `autoalloc doctor` leads with what a user came for: is the hook live, and what
    # does a job get here; not that no rule matches doctor's own process.
    head = result.stdout.splitlines()[0]
    assert head.startswith(
        f"autoalloc {__version__}: OK: installed and live here; a job a rule matches (e.g. rule "
    )
    assert head.endswith(
        ") gets PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'; to check a job, run "
        '"autoalloc explain -- CMD" or "autoalloc ab -- CMD"'
    )



# -- a file of thousands of mistakes: did-you-mean only for the first problems ---------------


@pytest.mark.parametrize("mistyped", ["disable", "allocator.expandable_segment"])
def test_many_mistyped_keys_look_for_few_close_matches(
    mistyped: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4,000 mistyped keys: difflib is asked for the first problems of the layer only (each
    search takes milliseconds; one per key, twice in [allocator], took seconds at startup)."""
    import difflib

    calls: list[str] = []
    real = difflib.get_close_matches

    def counted(word: str, *args: object, **kwargs: object) -> list[str]:
        calls.append(word)
        return real(word, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(difflib, "get_close_matches", counted)
    path = tmp_path / "autoalloc.toml"
    keys = "".join(f"{mistyped}{i} = true\n" for i in range(4000))
    path.write_text(keys + 'allocator.expandable_segment = true\n')
    status = sources.load_file("user", str(path))
    assert status.status == "found"
    assert "(3998 more: run `autoalloc check`.)" in status.message
    assert len(calls) <= 2 * schema.HINTED
    # the problems shown still say what was meant
    assert "did you mean" in status.message


# -- a job on several nodes: global rank 0 speaks, and each further node for what is its own ---


@pytest.mark.parametrize(
    ("env", "node", "said"),
    [
        ({"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"}, True, "autoalloc: x"),
        ({"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1"}, True, "autoalloc: on node 1 ("),
        ({"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1"}, False, None),  # the job's: rank 0
        ({"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"}, True, None),  # rank 2 says it
        ({"RANK": "1", "LOCAL_RANK": "1", "GROUP_RANK": "0"}, True, None),  # rank 0's node
        ({"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}, True,
         "autoalloc: on node 1 ("),
        ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}, True, None),
        ({"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "x"}, True, None),
    ],
)
def test_a_nodes_own_warning_is_said_by_its_first_process(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], node: bool, said: str | None
) -> None:
    launched = [n for n in os.environ if n.startswith(("SLURM_", "OMPI_", "PMI_"))]
    for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", *launched):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages.warn("autoalloc: x", node=node)
    shown = [str(w.message) for w in caught if w.category is messages.AutoallocWarning]
    if said is None:
        assert shown == []
    else:
        assert len(shown) == 1 and shown[0].startswith(said) and shown[0].endswith(" x")
