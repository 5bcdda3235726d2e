"""Glob semantics and first-match order (no torch)."""

from __future__ import annotations

import pytest

from autoalloc.entrypoint import EntryPoint
from autoalloc.match import first_match, pending_triggers
from autoalloc.policy import Source, compose
from tests.helpers import validate

pytestmark = pytest.mark.hook


def rules(*specs: dict, layer: str = "user"):
    return compose([validate({"rules": list(specs)}, Source(layer, f"/{layer}"))]).rules


def script(path: str, *args: str) -> EntryPoint:
    return EntryPoint("script", path, args, path, path)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("**/examples/asr/**/speech_to_text_*.py", "/h/NeMo/examples/asr/asr_ctc/speech_to_text_ctc.py", True),
        ("**/examples/asr/**/speech_to_text_*.py", "/h/NeMo/examples/asr/speech_to_text_finetune.py", True),
        ("**/examples/asr/**/speech_to_text_*.py", "/h/NeMo/examples/tts/speech_to_text_x.py", False),
        ("examples/asr/*.py", "/h/NeMo/examples/asr/x.py", True),  # relative: may start anywhere
        ("examples/asr/*.py", "/h/NeMo/examples/asr/sub/x.py", False),  # '*' stays in one directory
        ("**/egs/*/ASR/*/train*.py", "/w/icefall/egs/librispeech/ASR/zipformer/train.py", True),
        ("**/egs/*/ASR/*/train*.py", "/w/icefall/egs/librispeech/ASR/zipformer/sub/train.py", False),
        ("/abs/only/*.py", "/abs/only/t.py", True),
        ("/abs/only/*.py", "/x/abs/only/t.py", False),
        ("**/asr_chunked_inference/**", "/n/examples/asr/asr_chunked_inference/ctc/speech_to_text_buffered.py", True),
        ("train_asr*.py", "/anything/at/all/train_asr_v2.py", True),  # bare name: file name
        ("train_asr*.py", "/anything/train_asr/other.py", False),
        ("t?ain.py", "/a/train.py", True),
        ("[tx]rain.py", "/a/train.py", True),
        ("[!tx]rain.py", "/a/train.py", False),
        ("**/run_speech_recognition_ctc.py", "/run_speech_recognition_ctc.py", True),
    ],
)
def test_script_globs(pattern: str, path: str, expected: bool) -> None:
    match = first_match(rules({"name": "r", "scripts": [pattern]}), script(path))
    assert (match.rule is not None) is expected


def test_realpath_also_matches() -> None:
    entry = EntryPoint(
        "script", "/home/u/link/train.py", (), "/home/u/link/train.py", "/data/NeMo/examples/asr/speech_to_text_ctc.py"
    )
    assert first_match(rules({"name": "r", "scripts": ["**/examples/asr/**/speech_to_text_*.py"]}), entry).rule


def test_modules_commands_and_argv_condition() -> None:
    rs = rules(
        {"name": "fair", "commands": ["fairseq-*train"], "modules": ["fairseq_cli.*"], "argv": ["*wav2vec*", "*HUBERT*"]},
        {"name": "esp", "modules": ["espnet2.bin.*_train"]},
    )
    assert first_match(rs, EntryPoint("module", "espnet2.bin.asr_train")).rule.name == "esp"
    assert first_match(rs, EntryPoint("module", "espnet2.bin.asr_inference")).rule is None
    cmd = EntryPoint("command", "fairseq-hydra-train", ("--config-dir", "examples/wav2vec/config"), "/v/bin/fairseq-hydra-train")
    assert first_match(rs, cmd).rule.name == "fair"
    assert "argument 'examples/wav2vec/config' matches '*wav2vec*'" in first_match(rs, cmd).reason
    assert first_match(rs, EntryPoint("command", "fairseq-train", ("task=translation",))).rule is None
    assert first_match(rs, EntryPoint("module", "fairseq_cli.train", ("--task", "hubert_pretraining"))).rule.name == "fair"


def test_first_match_in_order_and_imports() -> None:
    rs = rules(
        {"name": "deny", "imports": ["vllm"], "action": "skip"},
        {"name": "allow", "scripts": ["train.py"], "imports": ["nemo.collections.asr"]},
    )
    assert first_match(rs, script("/x/train.py"), {"vllm"}).rule.name == "deny"
    assert first_match(rs, script("/x/train.py")).rule.name == "allow"
    by_import = first_match(rs, EntryPoint("code"), {"nemo.collections.asr"})
    assert by_import.rule.name == "allow" and by_import.trigger == "nemo.collections.asr"
    assert first_match(rs, EntryPoint("code"), {"nemo"}).rule is None
    assert pending_triggers(rs, {"vllm"}) == {"nemo.collections.asr"}


def test_higher_layer_rules_first() -> None:
    policy = compose(
        [
            validate({"rules": [{"name": "low", "scripts": ["train.py"]}]}, Source("builtin", "/b")),
            validate({"rules": [{"name": "high", "scripts": ["train.py"], "action": "skip"}]}, Source("project", "/p")),
        ]
    )
    assert first_match(policy.rules, script("/x/train.py")).rule.name == "high"


class _Untouchable(tuple):
    """Arguments that fail the test if anything looks at them."""

    def __iter__(self):
        raise AssertionError("the argv condition was evaluated")


def test_argv_condition_only_for_rules_whose_selectors_match() -> None:
    """A command line can carry tens of thousands of arguments: a rule that does not name
    this program never looks at them."""
    rs = rules(
        {"name": "a", "scripts": ["other*.py"], "argv": ["*asr*"]},
        {"name": "b", "modules": ["pkg.train"], "argv": ["*asr*"]},
        {"name": "c", "commands": ["tool"], "argv": ["*asr*"]},
    )
    args = _Untouchable(f"--x{i}" for i in range(40_000))
    entry = EntryPoint("script", "/w/train.py", args, "/w/train.py", "/w/train.py")
    assert first_match(rs, entry).rule is None
    many = script("/w/other_1.py", *[f"--x{i}" for i in range(40_000)], "--data=asr.json")
    assert first_match(rs, many).rule.name == "a"  # and where the selectors match, it counts
    assert first_match(rs, script("/w/other_1.py", "--data=tts.json")).rule is None


@pytest.mark.parametrize("seed", range(3))
def test_name_globs_agree_with_fnmatch(seed: int) -> None:
    """The regex-free shortcuts decide exactly as fnmatch's regex does."""
    import fnmatch
    import random
    import re

    from autoalloc.globs import NameGlob, compile_rule

    rng, others = random.Random(seed), random.Random(seed + 100)
    alphabet = "ab.*?[]!^-"

    def agrees(pattern: str, name: str) -> bool:
        try:
            return re.match(fnmatch.translate(pattern), name, re.DOTALL) is not None
        except re.error:  # 3.9 translates "[z-a]" into a bad range: it matches nothing
            return False

    for _ in range(3000):
        pattern = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        name = "".join(rng.choice("ab.-[]!^*?") for _ in range(rng.randint(0, 6)))
        expected = agrees(pattern, name)
        assert NameGlob(pattern).match(name) is expected, (pattern, name)
        # several patterns: each one's literal prefix and suffix checked before its matcher
        other = "".join(others.choice(alphabet) for _ in range(others.randint(0, 6)))
        either = expected or agrees(other, name)
        assert compile_rule((), (other, pattern), (), ()).module(name) is either, (other, pattern)


def test_a_pattern_re_cannot_compile_matches_nothing() -> None:
    """fnmatch on 3.9 translates an empty range (``[z-a]``) into a regex ``re`` refuses
    (3.10+: into a class that matches nothing): on every version the pattern matches nothing,
    and the rule's other patterns and the rules after it still decide."""
    from autoalloc.globs import NameGlob, _compiled, compile_rule, which

    assert _compiled("[z-a]", 0).match("z") is None  # a regex no version compiles
    assert not NameGlob("tr[z-a]in.py").match("train.py")
    assert compile_rule(("tr[z-a]in.py", "train.py"), (), (), ()).script("/w/train.py")
    assert compile_rule((), (), (), ("*[z-a]*", "*asr*")).arguments(["--data=asr.json"])
    assert not compile_rule((), (), (), ("[z-a]",)).arguments(["", "z"])
    assert which(["x[z-a].py", "t*.py"], "scripts", "/w/train.py") == "t*.py"
    assert which(["*[z-a]*"], "argv", "--asr") is None
    found = rules(
        {"name": "bad", "scripts": ["tr[z-a]in.py"], "argv": ["[z-a]"]},
        {"name": "good", "scripts": ["train.py"]},
    )
    assert first_match(found, script("/w/train.py")).rule.name == "good"


def test_path_globs_agree_with_each_pattern() -> None:
    """Several script patterns: a pattern's matcher is built only for a path holding its
    literal segments, and the answer is still "any of them matches"."""
    import random

    from autoalloc.globs import PathGlob, compile_rule

    rng = random.Random(0)
    segments = ["a", "b", "*", "**", "a*", "?", "[ab]"]
    for _ in range(2000):
        patterns = ["/" + "/".join(rng.choice(segments) for _ in range(rng.randint(0, 3)))
                    + rng.choice(["/", ""]) + rng.choice(segments)
                    for _ in range(rng.randint(1, 3))]  # fmt: skip
        path = "/" + "/".join(rng.choice(["a", "b", "ab"]) for _ in range(rng.randint(1, 5)))
        expected = any(PathGlob(p).match(path) for p in patterns)
        assert compile_rule(patterns, (), (), ()).script(path) is expected, (patterns, path)


def test_rule_patterns_are_a_record_of_named_fields() -> None:
    """Each pattern is kept with its checks, one field per kind; the layer cache stores only
    the kinds a rule has."""
    import pickle

    from autoalloc import records
    from autoalloc.globs import NO_PATTERNS, RulePatterns, compile_rule

    names = [f.name for f in records.fields(RulePatterns)]
    assert names == ["paths", "names", "modules", "commands", "argv"]
    compiled = compile_rule(("**/asr/train*.py", "run_*.py"), ("asr.*",), ("asr-train",), ("-v",))
    assert compiled.paths == (("**/asr/train*.py", frozenset({"asr"})),)
    assert compiled.names == (("run_*.py", "run_", ".py"),)
    assert compiled.modules == (("asr.*", "asr.", ""),)
    assert compiled.commands == (("asr-train", "asr-train", ""),)
    assert compiled.argv == ("-v",)
    modules_only = compile_rule((), ("asr.*",), (), ())
    assert set(modules_only.__getstate__()) == {"modules"}
    assert pickle.loads(pickle.dumps(modules_only)) == modules_only
    assert NO_PATTERNS == RulePatterns() and NO_PATTERNS.__getstate__() == {}


def test_not_imports_and_not_imports_unless() -> None:
    found = rules(
        {"name": "asr", "imports": ["audio"], "not_imports": ["tts"], "not_imports_unless": ["wer"]},
        {"name": "any-audio", "imports": ["audio", "tts"]},
    )
    entry = script("/w/train.py")

    def decided(*imported: str) -> tuple[str | None, str]:
        match = first_match(found, entry, set(imported))
        return (match.rule.name if match.rule else None), match.reason

    assert decided("audio") == ("asr", "module audio is imported (none of its not_imports is)")
    assert decided("audio", "tts") == ("any-audio", "module audio is imported")
    assert decided("tts") == ("any-audio", "module tts is imported")
    assert decided("audio", "tts", "wer") == (
        "asr",
        "module audio is imported (tts of its not_imports too, outweighed by wer)",
    )
    assert decided("wer") == (None, "")  # the companions are no triggers of their own
    assert pending_triggers(found, {"audio"}) == {"tts"}


def test_also_imports() -> None:
    found = rules({"name": "asr", "imports": ["audio"], "also_imports": ["text", "wer"]})
    entry = script("/w/train.py")
    assert first_match(found, entry, {"audio"}).rule is None
    assert first_match(found, entry, {"text"}).rule is None
    match = first_match(found, entry, {"audio", "wer"})
    assert match.rule.name == "asr" and match.reason == "module audio is imported with wer"
    assert pending_triggers(found, {"audio"}) == {"text", "wer"}  # the trigger may come first


def test_a_home_pattern_keeps_the_home_it_was_validated_with(monkeypatch) -> None:
    """A ``~`` pattern is expanded when the rule is validated, with the HOME the layer cache
    keys it by: a rule kept after HOME changes matches as validated, a rule validated
    afterwards under the new HOME (per-pattern matchers are shared within a process)."""
    from autoalloc.globs import compile_rule

    monkeypatch.setenv("HOME", "/home/a")
    first = compile_rule(("~/lab/*.py",), (), (), ())
    assert first.script("/home/a/lab/x.py")
    monkeypatch.setenv("HOME", "/home/b")
    assert first.script("/home/a/lab/x.py") and not first.script("/home/b/lab/x.py")
    later = compile_rule(("~/lab/*.py",), (), (), ())
    assert later.script("/home/b/lab/x.py") and not later.script("/home/a/lab/x.py")


def test_a_reason_names_the_home_pattern_that_decided(monkeypatch) -> None:
    """The pattern a reason names is found by the matchers that decided: a ``~`` pattern
    expanded at validation is named after HOME changes, as the rule spells it."""
    monkeypatch.setenv("HOME", "/home/a")
    found = rules({"name": "lab", "scripts": ["~/lab/*.py"]})
    monkeypatch.setenv("HOME", "/home/b")
    match = first_match(found, script("/home/a/lab/x.py"))
    assert (match.rule.name, match.reason) == ("lab", "script matches '~/lab/*.py'")


def test_a_reason_names_the_first_pattern_in_the_rules_order() -> None:
    """Path patterns are matched before file-name patterns, but the reason names the first
    of the rule's list that matches, and the first argument its argv patterns match."""
    found = rules(
        {"name": "asr", "scripts": ["x*.py", "train*.py", "**/w/train.py"], "argv": ["*asr*", "-v"]}
    )
    entry = script("/w/train.py", "--lr", "-V", "--data=asr.json")
    assert first_match(found, entry).reason == (
        "script matches 'train*.py' and argument '-V' matches '-v'"
    )
    entry = EntryPoint("command", "tool", ("--asr",), "/w/train.py", "/w/train.py")
    assert first_match(found, entry).reason == (
        "command path matches 'train*.py' and argument '--asr' matches '*asr*'"
    )


def _decides(kind: str, patterns: list[str], value: str) -> bool:
    """Whether a rule with these patterns of ``kind`` matches ``value`` (the decision)."""
    from autoalloc.globs import compile_rule

    if kind == "argv":
        return compile_rule((), (), (), patterns).argument([value]) == value
    if kind == "scripts":
        return compile_rule(patterns, (), (), ()).script(value)
    return compile_rule((), patterns, (), ()).module(value)


@pytest.mark.parametrize("seed", range(2))
def test_the_pattern_named_is_one_the_rule_matched_with(seed: int) -> None:
    """``which`` (the reason) and ``RulePatterns`` (the decision) answer "does it match" with
    the same matchers: a value matches a rule exactly when ``which`` names a pattern, the
    first of the list that matches it alone."""
    import random

    from autoalloc.globs import which

    rng = random.Random(seed)
    segments = ["a", "b", "*", "**", "a*", "?", "[ab]", "[!a]"]

    def pattern(kind: str) -> str:
        if kind == "scripts" and rng.random() < 0.5:
            return "/".join(rng.choice(segments) for _ in range(rng.randint(1, 4)))
        return "".join(rng.choice("aAb.*?[]!-") for _ in range(rng.randint(1, 5)))

    def value(kind: str) -> str:
        if kind == "scripts":
            return "/" + "/".join(rng.choice(["a", "b", "ab", "a.b"]) for _ in range(4))
        return "".join(rng.choice("aAb.-[]!") for _ in range(rng.randint(0, 5)))

    for _ in range(1500):
        kind = rng.choice(["scripts", "modules", "argv"])
        patterns, got = [pattern(kind) for _ in range(rng.randint(1, 3))], value(kind)
        named = which(patterns, kind, got)
        assert (named is not None) is _decides(kind, patterns, got), (kind, patterns, got)
        if named is not None:
            earlier = patterns[: patterns.index(named)]
            assert _decides(kind, [named], got)
            assert not any(_decides(kind, [p], got) for p in earlier), (kind, patterns, got)
