"""Policy validation, layer composition and discovery (no torch)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoalloc import sources
from autoalloc.entrypoint import EntryPoint, parse
from autoalloc.policy import PolicyError, Source, compose
from tests.helpers import find_project, validate

pytestmark = pytest.mark.hook
SRC = Source("user", "/u/config.toml")


def test_validate_full_schema() -> None:
    config = validate(
        {
            "enabled": True,
            "on_conflict": "override",
            "disable": ["nemo-asr-train"],
            "allocator": {"expandable_segments": True, "garbage_collection_threshold": 0.8},
            "rules": [
                {
                    "name": "r1",
                    "description": "mine",
                    "scripts": ["**/train_asr*.py"],
                    "modules": ["myproj.train*"],
                    "commands": ["my-train"],
                    "imports": ["myproj.asr.data"],
                    "argv": ["*conformer*"],
                    "action": "skip",
                    "allocator": {"roundup_power2_divisions": {"64": 8, "256": 4, ">": 1}},
                }
            ],
        },
        SRC,
    )
    assert config.on_conflict == "override"
    assert config.allocator == {"expandable_segments": "True", "garbage_collection_threshold": "0.8"}
    (rule,) = config.rules
    assert rule.action == "skip" and rule.allocator == {"roundup_power2_divisions": "[64:8,256:4,>:1]"}
    assert rule.source == SRC


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"enabled": "yes"}, "enabled must be true or false"),
        ({"on_conflict": "merge"}, "on_conflict"),
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"allocator": {"expandable_segments": "True"}}, "allocator.expandable_segments: must be true or false"),
        ({"allocator": {"max_split_size_mb": 10}}, "must be >= 20"),
        ({"allocator": {"garbage_collection_threshold": 1.0}}, "between 0 and 1"),
        ({"allocator": {"no_such_key": 1}}, "unknown allocator option 'no_such_key'"),
        ({"allocator": {"roundup_power2_divisions": 3}}, "power of 2"),
        ({"allocator": []}, "allocator must be a table"),
        ({"rules": {"name": "x"}}, "rules must be an array"),
        ({"rules": [{"name": "x"}]}, "needs at least one of"),
        ({"rules": [{"name": "x", "scripts": "train.py"}]}, "scripts must be a list"),
        ({"rules": [{"name": "x", "scripts": [1]}]}, "list of non-empty strings"),
        ({"rules": [{"name": "x", "scripts": ["a"], "action": "deny"}]}, "action must be"),
        ({"rules": [{"name": "bad name!", "scripts": ["a"]}]}, "name must be"),
        ({"rules": [{"name": "x", "scripts": ["a"], "env": {"LD_PRELOAD": "x"}}]}, "unknown key 'env'"),
        ({"rules": [{"name": "x", "scripts": ["a"]}, {"name": "x", "modules": ["b"]}]}, "rule 2: another rule is already named 'x'"),
        ({"trusted_dirs": ["/"]}, "only user, site and AUTOALLOC_CONFIG"),
    ],
)
def test_validate_rejects(data: dict, fragment: str) -> None:
    with pytest.raises(PolicyError, match=None) as info:
        validate(data, Source("project", "/p/autoalloc.toml"))
    assert fragment in str(info.value)


def test_trusted_dirs_allowed_outside_projects() -> None:
    assert validate({"trusted_dirs": ["~/src"]}, SRC, allow_trust=True).trusted_dirs == ("~/src",)


def _layer(layer: str, **data: object):
    return validate(data, Source(layer, f"/{layer}.toml"))


def test_compose_precedence_and_provenance() -> None:
    policy = compose(
        [
            _layer("builtin", rules=[{"name": "a", "scripts": ["a.py"]}, {"name": "b", "scripts": ["b.py"]}]),
            _layer(
                "user",
                on_conflict="override",
                allocator={"garbage_collection_threshold": 0.5},
                rules=[{"name": "u", "scripts": ["u.py"]}],
            ),
            _layer(
                "project",
                enabled=False,
                disable=["a"],
                allocator={"garbage_collection_threshold": 0.7},
                rules=[{"name": "b", "modules": ["m"], "action": "skip"}],
            ),
        ]
    )
    assert policy.enabled.value is False and policy.enabled.source.layer == "project"
    assert policy.on_conflict.value == "override" and policy.on_conflict.source.layer == "user"
    assert policy.allocator["garbage_collection_threshold"].value == "0.7"
    assert policy.allocator["expandable_segments"].source is None  # autoalloc's default
    assert [(r.name, r.source.layer) for r in policy.rules] == [("b", "project"), ("u", "user")]
    assert "disabled by project" in policy.dropped["a@builtin"]
    assert "replaced by" in policy.dropped["b@builtin"]


def test_rule_allocator_overlays_global() -> None:
    policy = compose(
        [
            _layer(
                "user",
                allocator={"garbage_collection_threshold": 0.5},
                rules=[{"name": "r", "scripts": ["x"], "allocator": {"garbage_collection_threshold": 0.9}}],
            )
        ]
    )
    options = policy.options_for(policy.rules[0])
    assert options["garbage_collection_threshold"].value == "0.9"
    assert options["garbage_collection_threshold"].rule == "r"
    assert options["expandable_segments"].value == "True"


# -- discovery and reading -------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_project_search_upward_from_script_dir(tmp_path: Path) -> None:
    write(tmp_path / "proj" / "pyproject.toml", "[tool.autoalloc]\nenabled = false\n")
    write(tmp_path / "proj" / "sub" / "deeper" / "train.py", "")
    entry = parse(["py", "sub/deeper/train.py"], str(tmp_path / "proj"))
    found = find_project(sources.project_start(entry, "/nonexistent"))
    assert found and found.path == str(tmp_path / "proj" / "pyproject.toml")
    assert found.config is not None and found.config.enabled is False


def test_project_search_from_cwd_without_script(tmp_path: Path) -> None:
    write(tmp_path / "autoalloc.toml", "enabled = false\n")
    (tmp_path / "a" / "b").mkdir(parents=True)
    start = sources.project_start(EntryPoint("module", "pkg.mod"), str(tmp_path / "a" / "b"))
    assert find_project(start).path == str(tmp_path / "autoalloc.toml")


def test_pyproject_without_table_is_skipped_and_autoalloc_toml_wins(tmp_path: Path) -> None:
    write(tmp_path / "autoalloc.toml", "enabled = true\n")
    write(tmp_path / "pyproject.toml", "[tool.autoalloc]\nenabled = false\n")
    write(tmp_path / "inner" / "pyproject.toml", '[project]\nname = "x"\ndependencies = ["autoalloc"]\n')
    found = find_project(str(tmp_path / "inner"))
    assert found.path == str(tmp_path / "autoalloc.toml")


def test_pyproject_not_parsed_unless_it_mentions_autoalloc(tmp_path: Path) -> None:
    path = write(tmp_path / "pyproject.toml", "this is [not toml\n")
    assert sources.policy_table(str(path), path.read_bytes()) is None
    path.write_text("autoalloc = [not toml\n")
    with pytest.raises(sources.LayerError, match="not valid TOML"):
        sources.policy_table(str(path), path.read_bytes())


def test_bom_tolerated_and_bad_utf8_reported(tmp_path: Path) -> None:
    path = tmp_path / "autoalloc.toml"
    path.write_bytes(b"\xef\xbb\xbfenabled = false\n")
    assert sources.policy_table(str(path), path.read_bytes()) == {"enabled": False}
    path.write_bytes(b"enabled = \xff\n")
    with pytest.raises(sources.LayerError, match="not UTF-8"):
        sources.policy_table(str(path), path.read_bytes())


def test_load_reads_every_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user"))
    write(tmp_path / "site" / "autoalloc" / "config.toml", 'on_conflict = "override"\n')
    write(tmp_path / "user" / "autoalloc" / "config.toml", "enabled = nope\n")
    write(tmp_path / "proj" / "autoalloc.toml", "[allocator]\ngarbage_collection_threshold = 0.6\n")
    env_file = write(tmp_path / "env.toml", "[allocator]\ngarbage_collection_threshold = 0.9\n")
    policy = sources.load(EntryPoint("code"), {"AUTOALLOC_CONFIG": str(env_file)}, str(tmp_path / "proj"))
    status = {s.layer: s.status for s in policy.layers}
    assert status == {"builtin": "found", "site": "found", "user": "error", "project": "found", "env": "found"}
    user = next(s for s in policy.layers if s.layer == "user")
    assert "not valid TOML" in user.message and user.path.endswith("user/autoalloc/config.toml")
    assert policy.on_conflict.value == "override"
    assert policy.allocator["garbage_collection_threshold"].value == "0.9"
    assert policy.allocator["garbage_collection_threshold"].source.layer == "env"


def test_missing_layers_and_unset_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "site"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user"))
    policy = sources.load(EntryPoint("code"), {}, str(tmp_path))
    assert [(s.layer, s.status) for s in policy.layers] == [
        ("builtin", "found"),
        ("site", "missing"),
        ("user", "missing"),
        ("project", "missing"),
        ("env", "unset"),
    ]
    assert any(r.name == "nemo-asr-train" for r in policy.rules)


def test_oversized_and_non_regular_files(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(sources.MAX_BYTES + 1)
    with pytest.raises(sources.LayerError, match="larger than"):
        sources.read_file(str(big))
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(sources.LayerError, match="directory"):
        sources.read_file(str(tmp_path / "dir.toml"))
    os.mkfifo(tmp_path / "fifo.toml")
    with pytest.raises(sources.LayerError, match="not a regular file"):
        sources.read_file(str(tmp_path / "fifo.toml"))
    with pytest.raises(FileNotFoundError):
        sources.read_file(str(tmp_path / "none.toml"))


def test_ten_thousand_rules_validate_and_compose() -> None:
    """Validation and composition are linear: 10,000 rules in two layers take well under a
    second (a quadratic name check took minutes); the results are the same as for a few."""
    user = [{"name": f"u{i}", "scripts": [f"**/u{i}/train*.py", f"u{i}_*.py"]} for i in range(5000)]
    user.append({"name": "shared", "modules": ["shared.train"]})
    project = [{"name": f"p{i}", "modules": [f"p{i}.t*"], "argv": ["*asr*"]} for i in range(4999)]
    project.append({"name": "shared", "commands": ["shared-train"]})
    low = validate({"rules": user, "disable": []}, Source("user", "/u"))
    high = validate({"rules": project, "disable": ["u17"]}, Source("project", "/p"))
    assert len(low.rules) == 5001 and len(high.rules) == 5000
    policy = compose([low, high])
    assert len(policy.rules) == 5000 + 4999  # 'shared' replaced, 'u17' disabled
    assert policy.rules[0].name == "p0" and policy.rules[-1].name == "u4999"
    assert set(policy.dropped) == {"shared@user", "u17@user"}
    with pytest.raises(PolicyError, match="another rule is already named 'u3'"):
        validate({"rules": [*user, {"name": "u3", "scripts": ["x.py"]}]}, Source("user", "/u"))




def test_discovery_is_a_function_of_paths() -> None:
    from autoalloc import layerpaths

    assert list(layerpaths.project_candidates("/a/b")) == [
        "/a/b/autoalloc.toml", "/a/b/pyproject.toml", "/a/autoalloc.toml", "/a/pyproject.toml",
        "/autoalloc.toml", "/pyproject.toml",
    ]
    assert list(layerpaths.project_candidates(None)) == []

    def denied(path: str) -> os.stat_result:
        raise PermissionError(13, "Permission denied", path)

    assert layerpaths.examine("/x/config.toml", denied) == "blocked"
    path, why = layerpaths.config_file(lambda: "/x/config.toml", denied)
    assert path == "/x/config.toml" and why.startswith("cannot be examined")
    assert layerpaths.config_file(lambda: "rel/config.toml")[1].startswith("not an absolute")
    assert layerpaths.beside("/p/autoalloc.toml") == "/p/pyproject.toml"
    assert layerpaths.beside("/p/pyproject.toml") is None


def test_a_layers_notes_are_data_rendered_once_in_its_message(tmp_path: Path) -> None:
    (tmp_path / "autoalloc.toml").write_text(
        'enable = ["nope-x"]\n[[rules]]\nname = "r"\nscripts = 1\n'
    )
    (tmp_path / "pyproject.toml").write_text("[tool.autoalloc]\nenabled = false\n")
    layers = sources.read_layers(EntryPoint("unknown"), {}, str(tmp_path))
    project = next(layer for layer in layers if layer.layer == "project")
    assert len(project.notes) == 2 and "'nope-x'" in project.notes[0]
    assert project.aside == sources.shadow_note() and project.reason == ""
    rest = "The rest of the file applies."
    assert project.message == " ".join((*project.notes, rest, project.aside))
