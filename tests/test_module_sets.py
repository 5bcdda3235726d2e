"""Named module sets (``[module_sets]``, ``"@name"``): written once, expanded where the rule is
written, validated, and the built-in policy written with them."""

from __future__ import annotations

import collections
import json
import pickle
from pathlib import Path

import pytest

from autoalloc import layercache, sources
from autoalloc.entrypoint import EntryPoint
from autoalloc.modulesets import link
from autoalloc.policy import LayerConfig, Source, salvage
from tests.helpers import REPO

BUILTIN = REPO / "autoalloc" / "builtin.toml"
# The four import lists of every built-in rule as they were written out before the sets
# (autoalloc/builtin.toml before [module_sets]), in file order.
FROZEN = REPO / "tests" / "golden" / "builtin_import_lists.json"
LISTS = ("imports", "also_imports", "not_imports", "not_imports_unless")


def layer(text: str, name: str = "user") -> tuple[LayerConfig, tuple[str, ...]]:
    return salvage(sources.parse_toml(text.encode()), Source(name, f"{name}.toml"))


def builtin() -> LayerConfig:
    config, problems = layer(BUILTIN.read_text(), "builtin")
    assert problems == ()
    return config


def test_the_built_in_rules_expand_to_the_lists_written_out_before() -> None:
    rules = builtin().rules
    now = [{"name": r.name, **{k: list(getattr(r, k)) for k in LISTS if getattr(r, k)}}
           for r in rules]  # fmt: skip
    assert now == json.loads(FROZEN.read_text())
    assert not builtin().pending  # every reference is to its own sets: nothing left to link


def quoted_names(text: str) -> collections.Counter[str]:
    """How often each module name is written in a policy's lists of module names: the four
    import lists of its rules and its module sets, as written (not expanded)."""
    table = sources.parse_toml(text.encode())
    lists = [rule.get(key, []) for rule in table["rules"] for key in LISTS]
    lists += table.get("module_sets", {}).values()
    return collections.Counter(n for names in lists for n in names if not n.startswith("@"))


def test_no_module_name_is_quoted_more_than_twice_in_the_built_in_policy() -> None:
    """Each list is written once: a name is in at most two sets (``funasr`` is an audio stack
    and a speech-to-text library), never copied from rule to rule."""
    counts = quoted_names(BUILTIN.read_text())
    assert {name: n for name, n in counts.items() if n > 2} == {}
    assert counts["phonemizer"] == 1 and counts["funasr"] == 2  # the count sees the lists


def test_references_keep_order_drop_duplicates_and_nest() -> None:
    config, problems = layer("""
[module_sets]
a = ["x", "y"]
b = ["@a", "z", "x"]
[[rules]]
name = "r"
imports = ["first", "@b", "y", "last"]
not_imports = ["@a"]
""")
    assert problems == ()
    assert config.module_sets == {"a": ("x", "y"), "b": ("x", "y", "z")}
    (rule,) = config.rules
    assert rule.imports == ("first", "x", "y", "z", "last")
    assert rule.not_imports == ("x", "y") and not config.pending


def test_sets_may_be_defined_after_the_rules_and_in_pyproject() -> None:
    text = """
[[tool.autoalloc.rules]]
name = "r"
imports = ["@mine"]

[tool.autoalloc.module_sets]
mine = ["myproj.asr"]
"""
    table = sources.parse_toml(text.encode())["tool"]["autoalloc"]
    config, problems = salvage(table, Source("project", "pyproject.toml"))
    assert problems == () and config.rules[0].imports == ("myproj.asr",)


def test_a_cycle_is_an_error_that_costs_its_sets_and_the_rules_using_them() -> None:
    config, problems = layer("""
[module_sets]
a = ["@b"]
b = ["@a"]
fine = ["x"]
[[rules]]
name = "r"
imports = ["@a"]
[[rules]]
name = "kept"
imports = ["@fine"]
""")
    assert "cycle: @a -> @b -> @a" in problems[0] and "'a' is ignored" in problems[0]
    assert "'b' is ignored" in problems[1]
    assert 'rule 1 ("r"): imports:' in problems[2] and "Rule 1 is ignored" in problems[2]
    assert [r.name for r in config.rules] == ["kept"] and set(config.module_sets) == {"fine"}


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        ('[module_sets]\n"bad name" = ["x"]', "set name must be letters"),
        ('[module_sets]\ns = "x"', "module_sets.'s' must be a list of strings"),
        ('[module_sets]\ns = ["@"]', "'@' names no module set"),
        ('module_sets = ["x"]', "module_sets must be a table of lists"),
    ],
)
def test_a_bad_definition_costs_that_set(sets: str, fragment: str) -> None:
    config, problems = layer(f"{sets}\n[[rules]]\nname = 'r'\nimports = ['a']\n")
    assert fragment in problems[0] and [r.name for r in config.rules] == ["r"]


def test_a_misplaced_table_in_pyproject_names_the_right_spelling(tmp_path: Path) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.autoalloc]\nenabled = true\n[module_sets]\ntts = ["x"]\n')
    (problem,) = sources.pyproject_problems(str(path), path.read_bytes())
    assert "write [tool.autoalloc.module_sets]" in problem


@pytest.fixture
def layers(isolated_home, tmp_path: Path):
    """Write a site, user and project policy, and read every layer for a program in the
    project."""
    project = tmp_path / "proj"
    project.mkdir()

    def read(site: str = "", user: str = "", proj: str = "") -> dict[str, object]:
        isolated_home.site_policy(site)
        isolated_home.user_policy(user)
        (project / "autoalloc.toml").write_text(proj)
        policy = sources.load(EntryPoint("code"), {}, str(project))
        return {"policy": policy, "messages": {s.layer: s.message for s in policy.layers}}

    return read


def rule(policy, name: str, layer: str):
    return next(r for r in policy.rules if r.name == name and r.source.layer == layer)


def test_a_user_rule_uses_the_built_in_sets(layers) -> None:
    got = layers(user='[[rules]]\nname = "mine"\nimports = ["myasr"]\n'
                      'not_imports = ["@tts", "@music", "mylib.tts"]\n')  # fmt: skip
    sets = builtin().module_sets
    assert rule(got["policy"], "mine", "user").not_imports == (
        *sets["tts"], *sets["music"], "mylib.tts")
    assert got["messages"]["user"] == ""


def test_a_reference_means_the_set_where_the_rule_is_written(layers) -> None:
    """A higher layer's set of the same name changes its own rules, not lower layers'; inside
    its definition, the name means the set below (an extension)."""
    got = layers(
        site='[module_sets]\nlab = ["site.a"]\n',
        user='[module_sets]\nlab = ["@lab", "user.b"]\ntts = ["mytts"]\n'
             '[[rules]]\nname = "u"\nimports = ["@lab"]\nnot_imports = ["@tts"]\n',
        proj='[[rules]]\nname = "p"\nimports = ["@lab", "@tts"]\n',
    )
    policy = got["policy"]
    assert rule(policy, "u", "user").imports == ("site.a", "user.b")
    assert rule(policy, "u", "user").not_imports == ("mytts",)
    assert rule(policy, "p", "project").imports == ("site.a", "user.b", "mytts")
    speech = rule(policy, "speech-training", "builtin")  # the built-in tts is untouched
    assert speech.not_imports[: len(builtin().module_sets["tts"])] == builtin().module_sets["tts"]


def test_an_unknown_set_costs_the_rule_with_a_did_you_mean(layers) -> None:
    got = layers(proj='[[rules]]\nname = "bad"\nimports = ["a"]\nnot_imports = ["@ttss"]\n'
                      '[[rules]]\nname = "good"\nimports = ["b"]\n')  # fmt: skip
    message = got["messages"]["project"]
    assert message.startswith(
        "rule \"bad\": not_imports: no module set is named '@ttss' in this file or a lower "
        "layer \N{EM DASH} did you mean '@tts'? Rule \"bad\" is ignored.")
    assert message.endswith("The rest of the file applies.")
    names = [r.name for r in got["policy"].rules if r.source.layer == "project"]
    assert names == ["good"]


def test_a_set_of_a_higher_layer_is_not_visible_below(layers) -> None:
    got = layers(user='[[rules]]\nname = "u"\nimports = ["@proj"]\n',
                 proj='[module_sets]\nproj = ["p"]\n')  # fmt: skip
    assert "no module set is named '@proj'" in got["messages"]["user"]
    assert not any(r.name == "u" for r in got["policy"].rules)


def test_the_layer_cache_keeps_references_to_lower_layers_to_expand(
    isolated_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached layer holds what its own bytes say; what a reference to a lower layer's set
    stands for is expanded anew, so a changed site set reaches the user's rule."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(layercache, "_ENABLED", [True])
    monkeypatch.setattr(sources, "_LAYERS", {})
    isolated_home.user_policy('[[rules]]\nname = "u"\nimports = ["@lab"]\n')
    seen = []
    for names in ('["one"]', '["two", "three"]'):
        isolated_home.site_policy(f"[module_sets]\nlab = {names}\n")
        policy = sources.load(EntryPoint("code"), {}, str(tmp_path))
        seen.append(rule(policy, "u", "user").imports)
    assert seen == [("one",), ("two", "three")]
    assert list((tmp_path / "cache" / "autoalloc").glob("*.pickle"))


def test_a_layer_with_sets_pickles_and_links_as_validated() -> None:
    config, _ = layer('[module_sets]\nx = ["@tts", "y"]\n[[rules]]\nimports = ["@x"]\n')
    assert config.pending and config.rules[0].imports == ("@tts", "y")
    again = pickle.loads(pickle.dumps(config))
    assert again == config and again.module_sets == config.module_sets
    (_, (linked, problems)) = link([builtin(), again])
    assert problems == () and not linked.pending
    assert linked.rules[0].imports == (*builtin().module_sets["tts"], "y")


def test_check_expands_references_against_the_layers_below(isolated_home, capsys) -> None:
    from autoalloc import cli

    good = isolated_home.write("autoalloc.toml", '[[rules]]\nimports = ["a"]\n'
                               'not_imports = ["@tts"]\n')  # fmt: skip
    bad = isolated_home.write("other/autoalloc.toml", '[[rules]]\nname = "b"\nimports = ["a"]\n'
                              'also_imports = ["@speech-to-txt"]\n')  # fmt: skip
    assert cli.main(["check", str(good)]) == 0
    assert f"ok     {good}  (1 rule)" in capsys.readouterr().out
    assert cli.main(["check", str(bad)]) == 1
    assert (f"error  {bad}: rule \"b\": also_imports: no module set is named '@speech-to-txt' "
            "in this file or a lower layer \N{EM DASH} did you mean '@speech-to-text'? "
            'Rule "b" is ignored.') in capsys.readouterr().out  # fmt: skip
