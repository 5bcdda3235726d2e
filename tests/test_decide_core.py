"""The decision for the core cases: apply, skip, none, disabled, inherited, merge (no torch)."""

from __future__ import annotations

import pytest

from autoalloc import allocconf
from autoalloc.decide import decide
from autoalloc.entrypoint import EntryPoint
from autoalloc.policy import LayerStatus, Source, compose
from autoalloc.records import replace
from autoalloc.torchinfo import TorchInfo, parse_version_file
from tests.helpers import policy_of, validate

pytestmark = pytest.mark.hook
CUDA = TorchInfo("2.13.0+cu130", cuda="13.0")
TRAIN = EntryPoint("script", "/w/train_asr.py", (), "/w/train_asr.py", "/w/train_asr.py")


def policy(**data: object):
    base = {"rules": [{"name": "asr", "scripts": ["train_asr.py"]}, {"name": "inf", "scripts": ["infer.py"], "action": "skip"}]}
    return policy_of(**{**base, **data})


def test_apply_writes_both_names_and_records() -> None:
    d = decide(policy(), TRAIN, {}, CUDA)
    assert d.action == "apply" and d.rule == "asr" and d.via == "env"
    assert d.writes == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "AUTOALLOC_APPLIED": "asr;expandable_segments:True",
        "AUTOALLOC_ORIGINAL": '{"PYTORCH_ALLOC_CONF": null, "PYTORCH_CUDA_ALLOC_CONF": null}',
    }
    assert d.read_var == "PYTORCH_CUDA_ALLOC_CONF" and d.value == "expandable_segments:True"
    assert d.warnings == () and d.notes == ()


def test_merge_keeps_user_keys_in_the_variable_torch_reads() -> None:
    d = decide(policy(), TRAIN, {"PYTORCH_ALLOC_CONF": "max_non_split_rounding_mb:64"}, CUDA)
    assert d.writes["PYTORCH_ALLOC_CONF"] == "max_non_split_rounding_mb:64,expandable_segments:True"
    assert d.writes["PYTORCH_CUDA_ALLOC_CONF"] == d.writes["PYTORCH_ALLOC_CONF"]


def test_skip_none_disabled() -> None:
    assert decide(policy(), EntryPoint("script", "/w/infer.py", (), "/w/infer.py"), {}, CUDA).action == "skip"
    none = decide(policy(), EntryPoint("script", "/w/other.py", (), "/w/other.py"), {}, CUDA)
    assert none.action == "none" and none.writes == {}
    disabled = decide(policy(enabled=False), TRAIN, {}, CUDA)
    assert disabled.action == "disabled" and "/w/autoalloc.toml" in disabled.reason and disabled.writes == {}


def test_inherited_from_parent_is_silent() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "AUTOALLOC_APPLIED": "asr;expandable_segments:False"}
    d = decide(policy(), TRAIN, env, CUDA)
    assert d.action == "inherited" and d.warnings == () and d.writes == {}
    # the user changed the variable after the parent decided: decide afresh
    env["PYTORCH_CUDA_ALLOC_CONF"] = "garbage_collection_threshold:0.5"
    assert decide(policy(), TRAIN, env, CUDA).action == "apply"


def test_conflict_keep_and_override() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    kept = decide(policy(), TRAIN, env, CUDA)
    assert kept.value == "expandable_segments:False" and len(kept.warnings) == 1
    assert "keeping expandable_segments:False" in kept.warnings[0]
    over = decide(policy(on_conflict="override"), TRAIN, env, CUDA)
    assert over.value == "expandable_segments:True" and over.warnings == ()


def test_late_trigger_uses_setter_with_full_string() -> None:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"}
    pol = compose([validate({"rules": [{"name": "nb", "imports": ["nemo.collections.asr"]}]}, Source("user", "/u"))])
    d = decide(pol, EntryPoint("code"), env, CUDA, {"nemo.collections.asr"}, late=True)
    assert d.setter_value == "max_split_size_mb:256,expandable_segments:True" and d.via == "setter"


def test_every_written_string_parses() -> None:
    pol = policy(allocator={"garbage_collection_threshold": 0.6, "roundup_power2_divisions": {"64": 8, ">": 1}})
    d = decide(pol, TRAIN, {"PYTORCH_CUDA_ALLOC_CONF": " max_split_size_mb : 512 "}, CUDA)
    for name in allocconf.ALL_VARS:
        if name in d.writes:
            allocconf.parse(d.writes[name])
    assert (
        d.value
        == "max_split_size_mb:512,expandable_segments:True,garbage_collection_threshold:0.6,roundup_power2_divisions:[64:8,>:1]"
    )


def test_version_file_parsing() -> None:
    text = "__version__ = '2.14.1+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n"
    info = parse_version_file(text)
    assert info == TorchInfo("2.14.1+cu130", "13.0", None) and info.flavour == "cuda" and info.release == (2, 14)
    assert parse_version_file("__version__ = '2.13.0+cpu'\ncuda = None\n").flavour == "cpu"
    assert parse_version_file("hip = '6.2'\n__version__ = \"2.11.0+rocm6.2\"\n").flavour == "rocm"
    assert parse_version_file("nothing here") is None


# What parse_version_file reads from a line, written as the regex it replaced (string parsing
# there: compiling the regex cost every process that imports torch a million instructions).
_ASSIGN = r"""^(__version__|cuda|hip|rocm)\s*(?::[^=]*)?=\s*(?:'([^']*)'|"([^"]*)"|None)\s*$"""
LINES = [
    "__version__ = '2.13.0+cpu'", 'cuda: Optional[str] = "13.0"', "hip: Optional[str] = None",
    "rocm = ''", "cuda : str = '1'", "cuda x = '1'", "cudax = '1'", "xcuda = '1'", "cuda == '1'",
    "cuda = None  # no", "cuda = 'a' if b else 'c'", "cuda = 'a\"", "cuda = '", 'cuda = "it\'s"',
    "cuda: Optional[str] = '12.8' ", "hip=None", "hip\t=\t'6.2'", "debug = False",
    "cuda = 12.8", "__version__: str = '2.1' = 'x'", "cuda: x = y = 'z'", "", "=", "None = None",
]


@pytest.mark.parametrize("line", LINES)
def test_version_file_lines_read_as_the_regex_read_them(line: str) -> None:
    import re

    from autoalloc.torchinfo import _assignment

    m = re.match(_ASSIGN, line.strip())
    want = None if m is None else (m.group(1), m.group(2) if m.group(2) is not None else m.group(3))
    assert _assignment(line.strip()) == want


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.14.1+cu130", (2, 14)), ("2.3", (2, 3)), ("10.0a0", (10, 0)), ("2.x", (0, 0)),
     ("2", (0, 0)), ("", (0, 0)), ("v2.1", (0, 0)), ("2.13.0.dev20260101", (2, 13))],
)
def test_release_is_the_leading_major_minor(version: str, release: tuple[int, int]) -> None:
    assert TorchInfo(version).release == release


def test_child_denied_by_a_skip_rule_gets_the_original_variables_back() -> None:
    parent = decide(policy(), TRAIN, {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.5"}, CUDA)
    assert parent.writes["AUTOALLOC_ORIGINAL"] == '{"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.5", "PYTORCH_CUDA_ALLOC_CONF": null}'
    child_env = {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.5", **parent.writes}
    infer = EntryPoint("script", "/w/infer.py", (), "/w/infer.py", "/w/infer.py")
    child = decide(policy(), infer, child_env, CUDA)
    assert child.action == "skip" and "restoring" in child.reason
    assert child.writes == {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.5"}
    assert set(child.unsets) == {"PYTORCH_CUDA_ALLOC_CONF", "AUTOALLOC_APPLIED", "AUTOALLOC_ORIGINAL"}
    assert child.value == "garbage_collection_threshold:0.5" and child.read_var == "PYTORCH_ALLOC_CONF"
    # a child the policy does not deny keeps what it inherited
    assert decide(policy(), EntryPoint("code"), child_env, CUDA).action == "inherited"


def test_departures_are_the_warnings_from_what_a_node_reads_for_itself() -> None:
    # a node whose own variable keeps a key: it does not get what the rule asks for
    off = decide(policy(), TRAIN, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, CUDA)
    assert off.departures == off.warnings and len(off.warnings) == 1
    # the same options on every node, only a remark on their combination: global rank 0's
    split = decide(policy(), TRAIN, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"}, CUDA)
    assert len(split.warnings) == 1 and split.departures == ()
    old = decide(policy(), TRAIN, {}, TorchInfo("2.0.1+cu118", cuda="11.8"))  # its own torch
    assert old.departures == old.warnings and "needs torch >= 2.1" in old.warnings[0]
    # a user policy file that could not be used is the node's; the project's is the job's
    project = policy()
    layers = (LayerStatus("user", "/home/u/.config/autoalloc/config.toml", "error", "bad TOML"),
              LayerStatus("project", "/w/autoalloc.toml", "error", "bad TOML"))
    broken = decide(replace(project, layers=layers), TRAIN, {}, CUDA)
    assert len(broken.warnings) == 2
    assert broken.departures == (broken.warnings[0],) and "user policy" in broken.warnings[0]
    none = decide(replace(project, layers=layers), EntryPoint("code"), {}, CUDA)
    assert none.action == "none" and none.departures == broken.departures
