"""Untrusted project files: a project policy comes with any cloned repository.

It can only choose validated allocator options: hostile keys (``env``, ``LD_PRELOAD``, an
unknown ``backend``, commands, trust for itself) cost one warning and are left out (the
rule or option they are in; the rest of the file applies); nothing in it is executed or
imported. A project file that is not owned, together with its
directory, by this user or root is ignored with one warning, like git's
``safe.directory``; ``AUTOALLOC_TRUSTED_DIRS`` and ``trusted_dirs`` in the user, site or
``AUTOALLOC_CONFIG`` file re-enable it. The tests run as root and hand files to uid 12345.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoalloc import decide, layercache, sources
from autoalloc.entrypoint import EntryPoint
from tests.helpers import ES, NEMO, Sandbox, autoalloc_warnings, probe_result

OTHER = 12345

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")


@pytest.fixture
def world(isolated_home: Sandbox) -> Path:
    (isolated_home.root / "proj" / "sub").mkdir(parents=True)
    return isolated_home.root


def load(world: Path, env: dict | None = None, cwd: str | None = None):
    entry = EntryPoint("script", str(world / "proj" / "sub" / "train.py"), (), str(world / "proj" / "sub" / "train.py"))
    policy = sources.load(entry, env or {}, cwd)
    project = next(s for s in policy.layers if s.layer == "project")
    return policy, project


def project_file(world: Path, text: str = "enabled = false\n", name: str = "autoalloc.toml") -> Path:
    path = world / "proj" / name
    path.write_text(text)
    return path


def user_file(world: Path, text: str) -> Path:
    path = world / "xdg-config" / "autoalloc" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def assert_one_warning(policy, path: Path, *fragments: str) -> None:
    warnings = decide.layer_warnings(policy)
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0]
    for fragment in fragments:
        assert fragment in warnings[0]


# -- hostile content ---------------------------------------------------------------------------


@pytest.mark.hook
@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('env = { LD_PRELOAD = "/tmp/evil.so" }\n', "'env'"),
        ('[allocator]\nbackend = "x"\n', "allocator.backend"),
        ('allocator = { LD_PRELOAD = "/tmp/evil.so" }\n', "'LD_PRELOAD'"),
        ('[allocator]\nmax_split_size_mb = "20,backend:cudaMallocAsync"\n', "allocator.max_split_size_mb"),
        ('[[rules]]\nname = "x"\nscripts = ["train.py"]\ncommand = "/bin/sh -c id"\n', "'command'"),
        ('[[rules]]\nname = "x"\nscripts = ["train.py"]\nexec = "import os"\n', "'exec'"),
        ('[[rules]]\nname = "x"\nscripts = ["train.py"]\nenv = { PATH = "/tmp" }\n', "'env'"),
        ('[[rules]]\nname = "x"\nscripts = ["train.py"]\naction = "exec"\n', "action"),
        ('[[rules]]\nname = "x"\nscripts = ["train.py"]\nallocator = { backend = "/tmp/evil.so" }\n', "backend"),
        ('trusted_dirs = ["/"]\n', "'trusted_dirs'"),
        ('[tool]\nautoalloc = 1\n', "'tool'"),
    ],
)
def test_hostile_keys_cost_one_warning_and_their_part(world: Path, text: str, key: str) -> None:
    # What is hostile is left out with one warning; the file's valid rule still counts.
    safe = '[[rules]]\nname = "safe"\nscripts = ["serve.py"]\naction = "skip"\n'
    path = project_file(world, text + safe)
    policy, project = load(world)
    assert project.status == "found" and project.path == str(path)
    assert_one_warning(policy, path, key, "ignored")
    (config,) = [c for c in policy.configs if c.source.layer == "project"]
    assert config.allocator == {} and config.trusted_dirs == ()
    assert "safe" in [r.name for r in config.rules]
    assert all(r.allocator == {} and r.action in ("apply", "skip") for r in config.rules)


@pytest.mark.hook
@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ('[tool.autoalloc]\ntrusted_dirs = ["/"]\n', ("'trusted_dirs'", "only user, site and AUTOALLOC_CONFIG")),
        ("[tool]\nautoalloc = 1\n", ("the policy must be a table",)),
        ('[tool.autoalloc]\nenv = { LD_PRELOAD = "/tmp/evil.so" }\n', ("'env'",)),
    ],
)
def test_hostile_pyproject_tables(world: Path, text: str, fragments: tuple) -> None:
    path = project_file(world, text, "pyproject.toml")
    policy, project = load(world)
    # a table that is not one is no policy at all; a hostile key in one is left out
    assert project.status == ("error" if "must be a table" in fragments[0] else "found")
    assert_one_warning(policy, path, *fragments)
    assert not any(c.trusted_dirs for c in policy.configs)


# -- ownership ---------------------------------------------------------------------------------


@needs_root
@pytest.mark.hook
@pytest.mark.parametrize("owned_by_other", ["file", "directory", "both"])
def test_project_owned_by_another_user_is_ignored(world: Path, owned_by_other: str) -> None:
    path = project_file(world, "enabled = false\nnot [valid toml\n")  # never parsed: no parse error is reported
    if owned_by_other in ("file", "both"):
        os.chown(path, OTHER, OTHER)
    if owned_by_other in ("directory", "both"):
        os.chown(path.parent, OTHER, OTHER)
    policy, project = load(world)
    assert project.status == "untrusted" and project.path == str(path)
    assert_one_warning(policy, path, "owned by another user", "AUTOALLOC_TRUSTED_DIRS")
    assert "TOML" not in project.message


@needs_root
@pytest.mark.hook
def test_project_owned_by_us_or_root_is_used(world: Path) -> None:
    project_file(world)
    policy, project = load(world)
    assert project.status == "found" and policy.enabled.value is False
    assert decide.layer_warnings(policy) == []


@needs_root
@pytest.mark.hook
def test_foreign_pyproject_without_our_table_does_not_count(world: Path) -> None:
    inner = world / "proj" / "sub" / "pyproject.toml"
    inner.write_text('[project]\nname = "x"\n')
    os.chown(inner, OTHER, OTHER)
    outer = project_file(world)
    policy, project = load(world)
    assert project.status == "found" and project.path == str(outer)
    inner.write_text('[project]\nname = "x"\n[tool.autoalloc]\nenabled = true\n')
    policy, project = load(world)
    assert project.status == "untrusted" and project.path == str(inner)
    assert_one_warning(policy, inner, "owned by another user")


@needs_root
@pytest.mark.hook
def test_symlinks_do_not_launder_ownership(world: Path) -> None:
    # A foreign directory holding a link to a root-owned policy: the directory decides.
    ours = world / "ours.toml"
    ours.write_text("enabled = false\n")
    link = world / "proj" / "autoalloc.toml"
    link.symlink_to(ours)
    os.chown(link.parent, OTHER, OTHER)
    policy, project = load(world)
    assert project.status == "untrusted"
    # Our directory holding a link to a foreign file: the file read decides.
    os.chown(link.parent, 0, 0)
    os.chown(ours, OTHER, OTHER)
    policy, project = load(world)
    assert project.status == "untrusted"
    assert_one_warning(policy, link, "owned by another user")


@needs_root
@pytest.mark.hook
@pytest.mark.parametrize(
    ("trusted", "expected"),
    [
        ("{proj}", "found"),
        ("{world}", "found"),  # a parent directory
        ("*", "found"),
        ("~/../proj", "found"),  # HOME is {world}/home
        ("/nonexistent{pathsep}{proj}", "found"),
        ("{proj}-other", "untrusted"),  # a prefix that is not a parent
        ("{proj}/sub", "untrusted"),  # a child of the project directory
        (".", "untrusted"),  # relative: it would trust whatever the working directory is
        ("proj", "untrusted"),
        ("", "untrusted"),
    ],
)
def test_trusted_dirs_from_the_environment(world: Path, trusted: str, expected: str) -> None:
    path = project_file(world)
    os.chown(path, OTHER, OTHER)
    os.chown(path.parent, OTHER, OTHER)
    value = trusted.format(proj=world / "proj", world=world, pathsep=os.pathsep)
    policy, project = load(world, {"AUTOALLOC_TRUSTED_DIRS": value}, cwd=str(world / "proj"))
    assert project.status == expected
    assert len(decide.layer_warnings(policy)) == (expected == "untrusted")
    assert (policy.enabled.value is False) is (expected == "found")


@needs_root
@pytest.mark.hook
@pytest.mark.parametrize("layer", ["user", "site", "env"])
def test_trusted_dirs_from_user_site_and_env_files(world: Path, layer: str) -> None:
    path = project_file(world)
    os.chown(path, OTHER, OTHER)
    text = f'trusted_dirs = ["{world / "proj"}"]\n'
    env = {}
    if layer == "user":
        user_file(world, text)
    elif layer == "site":
        site = world / "xdg-site" / "autoalloc" / "config.toml"
        site.parent.mkdir(parents=True)
        site.write_text(text)
    else:
        (world / "env.toml").write_text(text)
        env["AUTOALLOC_CONFIG"] = str(world / "env.toml")
    policy, project = load(world, env)
    assert project.status == "found" and policy.enabled.value is False
    assert decide.layer_warnings(policy) == []


@needs_root
@pytest.mark.hook
def test_a_project_file_cannot_trust_itself_or_another(world: Path) -> None:
    # A root-owned outer project file naming the inner directory is no layer here (the nearest
    # project file decides) and could not trust anything anyway; only user, site and env files can.
    outer = world / "autoalloc.toml"
    outer.write_text(f'trusted_dirs = ["{world / "proj"}"]\n')
    inner = project_file(world)
    os.chown(inner, OTHER, OTHER)
    _, project = load(world)
    assert project.status == "untrusted" and project.path == str(inner)
    (world / "env.toml").write_text(f'trusted_dirs = ["{world / "proj"}"]\n')
    _, project = load(world, {"AUTOALLOC_CONFIG": str(world / "env.toml")})
    assert project.status == "found"


# -- end to end ----------------------------------------------------------------------------------


@pytest.mark.slow  # test_foreign_project_end_to_end is the quick one
def test_hostile_project_file_end_to_end(sandbox: Sandbox) -> None:
    """Nothing in a project file is executed, imported or exported; one warning names the file."""
    marker = sandbox.root / "pwned"
    sandbox.write("NeMo/evilmod.py", f"open({str(marker)!r}, 'w').write('imported')\n")
    policy = sandbox.write(
        "NeMo/autoalloc.toml",
        f"""
        env = {{ LD_PRELOAD = "/nonexistent/evil.so" }}
        [allocator]
        backend = "x"
        [[rules]]
        name = "evil"
        scripts = ["$(touch {marker})", "`touch {marker}`"]
        imports = ["evilmod"]
        command = "touch {marker}"
        """,
    )
    sandbox.script(NEMO, body="import os\nprint('LD_PRELOAD' in os.environ, 'evilmod' in __import__('sys').modules)\n")
    result = sandbox.run([NEMO])
    assert result.returncode == 0, result.stderr
    assert "False False" in result.stdout
    assert probe_result(result.stdout)["getter"] == ES  # the built-in rule, unaffected
    (warning,) = autoalloc_warnings(result.stderr)
    assert str(policy) in warning and "'env'" in warning
    assert not marker.exists()
    # Valid, the same rule still only watches its trigger: autoalloc never imports it.
    policy.write_text('[[rules]]\nname = "evil"\nimports = ["evilmod"]\n')
    result = sandbox.run([NEMO])
    assert result.returncode == 0 and result.stderr == ""
    assert not marker.exists()


@needs_root
def test_foreign_project_end_to_end(sandbox: Sandbox, full: bool) -> None:
    sandbox.script(NEMO)
    policy = sandbox.write("NeMo/autoalloc.toml", "enabled = false\n")
    os.chown(policy, OTHER, OTHER)
    os.chown(policy.parent, OTHER, OTHER)
    result = sandbox.run([NEMO])
    assert probe_result(result.stdout)["getter"] == ES  # the file that says "off" is ignored
    (warning,) = autoalloc_warnings(result.stderr)
    assert str(policy) in warning and "owned by another user" in warning
    trusted = sandbox.run([NEMO], env={"AUTOALLOC_TRUSTED_DIRS": str(policy.parent)})
    assert probe_result(trusted.stdout)["getter"] == "" and trusted.stderr == ""
    if not full:  # trusted_dirs in the user file: in process above
        return
    sandbox.user_policy(f'trusted_dirs = ["{policy.parent}"]\n')
    trusted = sandbox.run([NEMO])
    assert probe_result(trusted.stdout)["getter"] == "" and trusted.stderr == ""


@pytest.mark.hook
def test_no_home_is_no_user_layer(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A uid without a passwd entry and no HOME (containers): platformdirs raises (newer) or
    answers "~/.config/..." (older), a relative path that, read as it is, would let the
    repository in the working directory supply the user layer and its trusted_dirs. Either
    way: no user layer, no warning in every process."""
    import pwd

    monkeypatch.delenv("HOME")
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    monkeypatch.chdir(world / "proj")
    planted = world / "proj" / "~" / ".config" / "autoalloc" / "config.toml"
    planted.parent.mkdir(parents=True)
    planted.write_text('trusted_dirs = ["*"]\nenabled = false\n')
    for relative in (False, True):
        if relative:  # what older platformdirs return
            monkeypatch.setattr(
                layercache, "config_path", lambda layer: "~/.config/autoalloc/config.toml"
            )
        policy, _ = load(world, cwd=str(world / "proj"))
        user = next(s for s in policy.layers if s.layer == "user")
        assert user.status == "missing" and policy.enabled.value is True
        assert decide.layer_warnings(policy) == []
