"""The layer cache: a later process uses the validated layers of an earlier one, and only when
that is as safe as reading the files (same bytes, own private files, nothing but records)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autoalloc import cachedir, layercache, sources
from tests.helpers import REPO, probe_result

# What a process decides from the layers, and whether it needed a TOML parser, platformdirs or
# the validator.
DECIDE = """
import json, os, sys
from autoalloc import decide, entrypoint, layercache, sources
if sys.argv[2:] != ["--no-cache"]:
    layercache.enable()  # as the hook does at import torch
cwd = os.getcwd()
entry = entrypoint.parse([sys.executable, sys.argv[1]], cwd)
policy = sources.load(entry, os.environ, cwd)
d = decide.decide(policy, entry, os.environ, None, ())
print(json.dumps({
    "decision": [d.action, d.rule, d.value],
    "layers": [[s.layer, s.path, s.status, s.message] for s in policy.layers],
    "rules": [[r.name, r.action, r.scripts, dict(r.allocator)] for r in policy.rules],
    "parsed": "tomllib" in sys.modules or "tomli" in sys.modules,
    "platformdirs": "platformdirs" in sys.modules,
    "schema": "autoalloc.schema" in sys.modules,
}))
"""

USER = """
[[rules]]
name = "lab-a"
scripts = ["train_lab*.py"]
allocator = { garbage_collection_threshold = 0.5 }
"""


def decide(sandbox, script: str = "train_lab.py", env: dict | None = None, *flags: str) -> dict:
    result = sandbox.run(["-c", DECIDE, script, *flags],
                         env={"XDG_CACHE_HOME": str(cache(sandbox)), **(env or {})})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def cache(sandbox) -> Path:
    return sandbox.root / "cache"


def entries(sandbox) -> list[Path]:
    return sorted((cache(sandbox) / "autoalloc").glob("*.pickle"))


def same(a: dict, b: dict) -> bool:
    how = ("parsed", "platformdirs", "schema")
    return {k: v for k, v in a.items() if k not in how} == {
        k: v for k, v in b.items() if k not in how
    }


def test_a_later_process_uses_the_layers_validated_before(sandbox) -> None:
    sandbox.user_policy(USER)
    first = decide(sandbox)
    assert first["parsed"] and first["schema"] and first["decision"][:2] == ["apply", "lab-a"]
    second = decide(sandbox)
    assert not second["parsed"] and not second["platformdirs"] and not second["schema"]
    assert same(first, second)
    for path in [*entries(sandbox), cache(sandbox) / "autoalloc"]:
        assert path.stat().st_mode & 0o077 == 0, path


LAUNCHED = """
import json, os, sys
from autoalloc import decide, entrypoint, layercache, plan
layercache.enable()
cwd = os.getcwd()
entry = entrypoint.parse([sys.executable, *sys.argv[1:]], cwd)
policy, program = plan._load_program(entry, os.environ, cwd, None)
d = decide.decide(policy, program.entry, os.environ, None, ())
print(json.dumps({
    "program": program.entry.target, "decision": [d.action, d.rule],
    "parsed": "tomllib" in sys.modules or "tomli" in sys.modules,
    "schema": "autoalloc.schema" in sys.modules,
}))
"""


def test_a_launcher_finds_the_built_in_wrapper_table_remembered_too(sandbox) -> None:
    """A launcher's process (torchrun, accelerate, ...) reads the built-in wrapper table to find
    the program it runs: a later one takes it from the cache, as it does the rules."""
    sandbox.user_policy(USER)
    launch = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "train_lab.py"]
    env = {"XDG_CACHE_HOME": str(cache(sandbox))}
    runs = []
    for _ in range(2):
        result = sandbox.run(["-c", LAUNCHED, *launch], env=env)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        runs.append(json.loads(result.stdout))
    first, second = runs
    assert first["program"].endswith("train_lab.py") and first["decision"] == ["apply", "lab-a"]
    assert first["parsed"] and first["schema"]
    assert not second["parsed"] and not second["schema"]
    assert (second["program"], second["decision"]) == (first["program"], first["decision"])


def test_only_the_hook_uses_it(sandbox) -> None:
    """explain, doctor, check and the API read the files as they are, and write no cache."""
    sandbox.user_policy(USER)
    for _ in range(2):
        assert decide(sandbox, "train_lab.py", None, "--no-cache")["parsed"]
    assert not (cache(sandbox) / "autoalloc").exists()
    sandbox.write("train_lab.py", "")
    explained = sandbox.run(["-m", "autoalloc", "explain", "--", "python", "train_lab.py"],
                            env={"XDG_CACHE_HOME": str(cache(sandbox))})  # fmt: skip
    assert explained.returncode == 0 and "lab-a" in explained.stdout
    assert not (cache(sandbox) / "autoalloc").exists()


def test_changed_bytes_are_read_again_whatever_the_time_stamps(sandbox) -> None:
    path = sandbox.user_policy(USER)
    decide(sandbox)
    stamp = path.stat()
    path.write_text(USER.replace("lab-a", "lab-b").replace("0.5", "0.7"))  # same size
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    changed = decide(sandbox)
    assert changed["parsed"] and changed["decision"][:2] == ["apply", "lab-b"]
    assert "garbage_collection_threshold:0.7" in changed["decision"][2]


def test_a_pyproject_naming_autoalloc_only_as_a_dependency_is_never_parsed(sandbox) -> None:
    # PEP 621 lists, one line or several, versions and extras: the name is no key of TOML's.
    for deps in ('["torch", "autoalloc"]', '[\n  "autoalloc>=0.1",\n  "autoalloc[torch]==0.2"\n]',
                 '[\n    "autoalloc"\n]'):  # fmt: skip
        sandbox.write("pyproject.toml", f'[project]\nname = "asr"\ndependencies = {deps}\n')
        found = decide(sandbox)
        assert not found["parsed"] and found["decision"][0] == "none", deps
        assert not any(p.name.startswith("no-table-") for p in entries(sandbox))
    # The built-in layer comes from builtin.json: with no cache at all, still no validator.
    assert not found["schema"]
    assert not decide(sandbox, env={"XDG_CACHE_HOME": "/nonexistent"})["schema"]


def test_a_pyproject_without_our_table_is_not_parsed_again_until_it_changes(sandbox) -> None:
    # Poetry lists autoalloc as a key of its dependency table: parsed once, then remembered.
    pyproject = sandbox.write("pyproject.toml", '[tool.poetry.dependencies]\nautoalloc = "^0.1"\n')
    first = decide(sandbox)
    assert first["parsed"] and first["decision"][0] == "none"
    second = decide(sandbox)
    assert not second["parsed"] and same(first, second)
    pyproject.write_text(pyproject.read_text() + '\n[tool.autoalloc]\n[[tool.autoalloc.rules]]\n'
                         'name = "lab-p"\nscripts = ["train_lab.py"]\n')  # fmt: skip
    third = decide(sandbox)
    assert third["parsed"] and third["decision"][:2] == ["apply", "lab-p"]


class Boom:
    def __reduce__(self):
        return (os.system, ("touch boom",))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "group-writable", "foreign", "code"])
def test_a_corrupt_or_foreign_cache_is_ignored_silently(sandbox, damage: str) -> None:
    sandbox.user_policy(USER)
    first = decide(sandbox)
    for path in entries(sandbox):
        if damage == "garbage":
            path.write_bytes(b"not a pickle")
        elif damage == "truncated":
            path.write_bytes(path.read_bytes()[:-20])
        elif damage == "group-writable":
            path.chmod(0o660)
        elif damage == "foreign":
            os.chown(path, 12345, 12345) if os.geteuid() == 0 else pytest.skip("needs root")
        else:
            path.write_bytes(pickle.dumps(Boom()))
    again = decide(sandbox)
    assert again["parsed"] and same(first, again)
    assert not (sandbox.work / "boom").exists()


def test_an_unusable_cache_directory_means_no_cache_and_no_message(sandbox) -> None:
    sandbox.user_policy(USER)
    blocker = sandbox.root / "a-file"
    blocker.write_text("")
    for _ in range(2):
        result = decide(sandbox, env={"XDG_CACHE_HOME": str(blocker / "cache")})
        assert result["parsed"] and result["decision"][:2] == ["apply", "lab-a"]
    result = decide(sandbox, env={"XDG_CACHE_HOME": "relative/cache", "HOME": "relative"})
    assert result["parsed"] and not (sandbox.work / "relative").exists()


def test_ranks_writing_at_once_leave_a_usable_cache(sandbox) -> None:
    sandbox.user_policy(USER)
    env = {**sandbox.env, "XDG_CACHE_HOME": str(cache(sandbox))}
    argv = [sys.executable, "-c", DECIDE, "train_lab.py"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(argv, cwd=sandbox.work, env=env, **pipes) for _ in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 and err == "" for p, (_, err) in zip(procs, outs))
    results = [json.loads(out) for out, _ in outs]
    assert all(same(results[0], r) for r in results)
    after = decide(sandbox)
    assert not after["parsed"] and same(results[0], after)
    assert not list((cache(sandbox) / "autoalloc").glob("*.tmp"))


def test_the_unpickler_builds_the_named_records_only() -> None:
    from autoalloc import sources
    from autoalloc.policy import Source

    for records in ((), sources._LAYER_RECORDS):
        with pytest.raises(pickle.UnpicklingError):
            layercache._loads(pickle.dumps(Boom()), records)
        with pytest.raises(pickle.UnpicklingError):
            layercache._loads(pickle.dumps(object()), records)
    source = Source("user", "/u")
    with pytest.raises(pickle.UnpicklingError, match=r"autoalloc\.policy\.Source is not"):
        layercache._loads(pickle.dumps(source))
    assert layercache._loads(pickle.dumps(source), sources._LAYER_RECORDS) == source


def test_a_remembered_rule_matches_as_the_parsed_one() -> None:
    """What the cache restores is what validation built: the rules, their matchers (each
    pattern with its literal segments, or its prefix and suffix) and the wrappers."""
    from autoalloc import sources
    from autoalloc.globs import RulePatterns, compile_rule
    from autoalloc.policy import Rule

    layer = sources.load_file("builtin", sources.BUILTIN_PATH, allow_trust=False)
    wrappers = sources.load_file("builtin", sources.WRAPPERS_PATH, allow_trust=False)
    for config in (layer.config, wrappers.config):
        restored = layercache._loads(pickle.dumps(config, protocol=4), sources._LAYER_RECORDS)
        assert restored == config and restored.wrappers == config.wrappers
        for a, b in zip(config.rules + config.wrappers, restored.rules + restored.wrappers):
            assert type(b.compiled) is RulePatterns and b.compiled == a.compiled
    scripts, modules = ("**/asr/*/train*.py", "run_*.py"), ("asr.train",)
    compiled = compile_rule(scripts, modules, (), ())
    rule = Rule("r", layer.config.source, scripts=scripts, modules=modules, compiled=compiled)
    back = layercache._loads(pickle.dumps(rule, protocol=4), sources._LAYER_RECORDS).compiled
    assert type(back) is RulePatterns and back == compiled and type(back.paths) is tuple
    assert back.paths == (("**/asr/*/train*.py", frozenset({"asr"})),)
    assert back.names == (("run_*.py", "run_", ".py"),)
    assert back.script("/w/asr/x/train_ctc.py") and back.script("/w/run_asr.py")
    assert not back.script("/w/tts/x/train_ctc.py") and back.module("asr.train")


def _short(text: str) -> bytes:
    return b"\x8c" + bytes([len(text)]) + text.encode()  # SHORT_BINUNICODE


# How an autoalloc before 2026-12-02 pickled a rule's matchers: a record rebuilt with its state
# (NEWOBJ of the class, then BUILD with {field: value}); RulePatterns is a record again and
# takes that state (None where its fields hold tuples): an older entry is kept out by what it
# is stored as and keyed by (the code identity), not by its objects failing to restore.
OLD_PATTERNS = (
    b"\x80\x04" + _short("autoalloc.globs") + _short("RulePatterns") + b"\x93)\x81"
    + b"}" + _short("paths") + b"Ns" + _short("argv") + b"Ns" + b"b."
)  # fmt: skip


def test_an_entry_an_older_autoalloc_wrote_is_ignored(monkeypatch, tmp_path) -> None:
    """The entry file is named by what it is for, so an upgrade reads the older version's
    entry before replacing it: its matchers are not used, and the layer is read anew."""
    from autoalloc import sources

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(layercache, "_ENABLED", [True])
    monkeypatch.setattr(cachedir, "read", lambda name: OLD_PATTERNS)
    key = ("user", "/x/config.toml")
    assert layercache.get("layer", key, b"", sources._LAYER_RECORDS) is None


def test_a_later_decision_of_the_process_restores_an_unchanged_entry_once(
    monkeypatch, tmp_path
) -> None:
    """A process decides again at an import trigger or its first optimizer: each layer file
    is read again, and neither unpickled nor parsed again while its bytes are the same (the
    one memo, in ``sources``); changed bytes are read anew."""
    from autoalloc import sources

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(layercache, "_ENABLED", [True])
    monkeypatch.setattr(sources, "_LAYERS", {})
    loads, parses = [], []
    real_loads, real_parse = layercache._loads, sources.parse_toml
    monkeypatch.setattr(layercache, "_loads", lambda *a: loads.append(1) or real_loads(*a))
    monkeypatch.setattr(sources, "parse_toml", lambda *a: parses.append(1) or real_parse(*a))
    path = tmp_path / "config.toml"
    path.write_text('[[rules]]\nname = "a"\nscripts = ["a.py"]\n')
    first = sources.load_file("user", str(path))
    assert first.status == "found" and len(parses) == 1
    sources._LAYERS.clear()  # as a new process: from the disk cache
    assert sources.load_file("user", str(path)) == first and len(parses) == 1
    seen = len(loads)
    assert sources.load_file("user", str(path)) == first
    assert len(loads) == seen and len(parses) == 1  # from the memo
    path.write_text('[[rules]]\nname = "b"\nscripts = ["b.py"]\n')
    assert sources.load_file("user", str(path)).config.rules[0].name == "b"
    assert len(parses) == 2


# -- where it writes: only in directories of this user ------------------------------------------

NOBODY = 65534


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: files of another user")


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("setup", ["home", "home-link", "link"])
def test_root_writes_nothing_where_another_user_has_a_say(sandbox, setup: str) -> None:
    """Root with a user's HOME (``sudo -E``, a container run as root with the home mounted):
    no root-owned ``~/.cache`` in that home, nothing written through a link the user made
    (``link``: a link of the user's in root's own ``~/.cache``); the decision is unchanged."""
    _as_root()
    sandbox.user_policy(USER)
    home, target = sandbox.home, sandbox.root / "root-only"
    target.mkdir(mode=0o700)
    if setup != "link":
        os.chown(home, NOBODY, NOBODY)
    if setup != "home":
        (home / ".cache").mkdir()
        (home / ".cache" / "autoalloc").symlink_to(target)
        os.chown(home / ".cache", NOBODY, NOBODY) if setup == "home-link" else None
        os.chown(home / ".cache" / "autoalloc", NOBODY, NOBODY, follow_symlinks=False)
    before = _tree(home)
    for _ in range(2):
        result = decide(sandbox, env={"XDG_CACHE_HOME": None})
        assert result["parsed"] and result["decision"][:2] == ["apply", "lab-a"]
    assert _tree(home) == before and _tree(target) == []


UMASK_0 = "import os; os.umask(0)\n" + DECIDE


def test_what_it_creates_is_private_whatever_the_umask(sandbox) -> None:
    """Under umask 000 a missing ``~/.cache`` is made 0700 (XDG), as autoalloc's own."""
    sandbox.user_policy(USER)
    for _ in range(2):
        result = sandbox.run(["-c", UMASK_0, "train_lab.py"])
        assert result.returncode == 0 and result.stderr == "", result.stderr
    assert not json.loads(result.stdout)["parsed"]  # the second used the first one's entry
    for path in (sandbox.home / ".cache", sandbox.home / ".cache" / "autoalloc"):
        assert path.stat().st_mode & 0o777 == 0o700, path


# -- it stays small, says what it holds, and can be cleared ----------------------------------


@pytest.fixture
def enabled(monkeypatch, tmp_path) -> Path:
    """This process uses the cache, in ``tmp_path/autoalloc``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from autoalloc import sources

    monkeypatch.setattr(layercache, "_ENABLED", [True])
    monkeypatch.setattr(sources, "_LAYERS", {})
    return tmp_path / "autoalloc"


def test_entries_of_projects_gone_do_not_pile_up(enabled: Path) -> None:
    """One entry per project path: 200 temporary projects leave at most the cap, the most
    recent ones kept; a temporary file a killed writer left is removed once stale."""
    for i in range(200):
        layercache.put("layer", ("project", f"/tmp/p{i}/autoalloc.toml"), b"x", ("found", i))
    left = list(enabled.glob("*.pickle"))
    assert 0 < len(left) <= 128
    assert layercache.get("layer", ("project", "/tmp/p199/autoalloc.toml"), b"x") == ("found", 199)
    stale = enabled / "layer-00000000.pickle.123.tmp"
    fresh = enabled / "layer-00000001.pickle.124.tmp"
    for path in (stale, fresh):
        path.write_bytes(cachedir.MAGIC + b"half")  # as a writer killed midway leaves it
    os.utime(stale, (1, 1))
    layercache.put("layer", ("project", "/tmp/new/autoalloc.toml"), b"x", ("found", -1))
    assert not stale.exists() and fresh.exists()


def test_autoalloc_cache_shows_and_clears_it(enabled: Path, capsys) -> None:
    from autoalloc import cli

    layercache.put("layer", ("user", "/u/config.toml"), b"x", ("found", 1))
    (enabled / "ab").mkdir()  # ab's results beside it are not the cache's to clear
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(enabled) in out and "1 entries" in out and " bytes" in out
    assert cli.main(["cache", "--clear"]) == 0
    assert not list(enabled.glob("*.pickle")) and (enabled / "ab").is_dir()
    assert cachedir.describe()["entries"] == 0


def test_a_refused_directory_is_explained_and_ab_makes_its_own_private(
    monkeypatch, sandbox, capsys
) -> None:
    """Under umask 002 ``ab``'s default output made ``~/.cache/autoalloc`` group-writable,
    which the cache then refused for good: ab makes it 0700 now, and a directory refused
    anyway is explained by ``autoalloc cache`` and ``doctor``'s notes."""
    from autoalloc import cli, doctor

    monkeypatch.setenv("HOME", str(sandbox.home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    old = os.umask(0o002)
    try:
        out = Path(cachedir.run_dir("ab"))  # ab's output without --out
    finally:
        os.umask(old)
    cache_dir = sandbox.home / ".cache" / "autoalloc"
    assert out.parent == cache_dir / "ab"
    for path in (cache_dir.parent, cache_dir, out.parent, out):
        assert path.stat().st_mode & 0o777 == 0o700, path
    assert cachedir.describe()["used"]
    cache_dir.chmod(0o775)
    assert cli.main(["cache"]) == 1
    assert "writable by others (mode 0775)" in capsys.readouterr().out
    assert any("layer cache is not used" in note for note in doctor._cache_notes())


# -- what it restores is checked where it is used --------------------------------------------


def test_a_tampered_value_never_reaches_torch(sandbox) -> None:
    """A well-formed entry whose rule holds a value validation refuses: torch imports, and the
    environment holds only valid options."""
    from autoalloc.records import replace

    sandbox.user_policy(USER)
    script = sandbox.script("train_lab.py")
    env = {"XDG_CACHE_HOME": str(cache(sandbox))}
    first = sandbox.run([str(script)], env=env)
    assert first.returncode == 0, first.stderr
    tampered = 0
    for path in entries(sandbox):
        blob = path.read_bytes().removeprefix(cachedir.MAGIC)
        full, data, value = layercache._loads(blob, sources._LAYER_RECORDS)
        if full[0] == "layer" and full[1] == "user":
            rule = replace(value[2].rules[0], allocator={"expandable_segments": BAD})
            value = (*value[:2], replace(value[2], rules=(rule,)))
            path.write_bytes(cachedir.MAGIC + pickle.dumps((full, data, value), protocol=4))
            tampered += 1
    assert tampered == 1
    result = sandbox.run([str(script)], env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    probe = probe_result(result.stdout)
    assert probe["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert probe["getter"] == "expandable_segments:True"


BAD = "True,max_split_size_mb"


def test_is_serialized_accepts_what_validation_makes_only() -> None:
    from autoalloc import allocconf

    for key, value in [("expandable_segments", True), ("max_split_size_mb", 512),
                       ("garbage_collection_threshold", 1e-20), ("backend", "cudaMallocAsync"),
                       ("roundup_power2_divisions", {"64": 8, ">": 1})]:  # fmt: skip
        assert allocconf.is_serialized(key, allocconf.serialize_value(key, value))
    for key, text in [("expandable_segments", BAD), ("max_split_size_mb", "1_000"),
                      ("max_split_size_mb", "99999999999999999999"), ("bogus", "1"),
                      ("roundup_power2_divisions", "[64:8,>:1,]"), ("backend", "x,y")]:  # fmt: skip
        assert not allocconf.is_serialized(key, text)


# -- two environments sharing one HOME --------------------------------------------------------


def test_two_environments_sharing_a_home_keep_an_entry_each(sandbox) -> None:
    """Two installations of autoalloc (two venvs) alternate under one HOME: each finds its own
    entry for the shared user config on its second run."""
    sandbox.user_policy(USER)
    other = sandbox.root / "other"
    shutil.copytree(REPO / "autoalloc", other / "autoalloc",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    where = {"a": None, "b": str(other)}
    parsed = {"a": [], "b": []}
    for name in ("a", "b", "a", "b"):
        result = decide(sandbox, env={"PYTHONPATH": where[name]})
        parsed[name].append(result["parsed"])
    assert parsed == {"a": [True, False], "b": [True, False]}


def test_a_pyproject_policy_is_parsed_once_with_its_misplaced_keys_noted(
    monkeypatch, tmp_path
) -> None:
    """Reading a project pyproject.toml finds its table and the autoalloc keys misplaced at
    its top level in one parse (a pure-Python parse of a large policy is most of a cold
    decision)."""
    monkeypatch.setattr(sources, "_LAYERS", {})
    parses = []
    real_parse = sources.parse_toml
    monkeypatch.setattr(sources, "parse_toml", lambda *a: parses.append(1) or real_parse(*a))
    path = tmp_path / "pyproject.toml"
    path.write_text('disable = ["x"]\n[tool.autoalloc]\n[[tool.autoalloc.rules]]\n'
                    'name = "a"\nscripts = ["a.py"]\n')
    layer = sources.load_file("project", str(path), allow_trust=False)
    assert layer.status == "found" and [r.name for r in layer.config.rules] == ["a"]
    assert "tool.autoalloc" in layer.message
    assert "disable" in layer.message and parses == [1]


# -- it removes and replaces only what it wrote ---------------------------------------------

SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"


def _files(path: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``path``: its bytes and modification time."""
    return {str(p.relative_to(path)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in path.rglob("*") if p.is_file()}  # fmt: skip


def test_clear_eviction_and_tidying_touch_only_the_files_autoalloc_wrote(
    enabled: Path, capsys
) -> None:
    """A user's files kept in autoalloc's cache directory, named like its entries and
    temporary files or not, are neither evicted, tidied away, replaced nor cleared: autoalloc
    recognises its own by their name and by their first bytes."""
    from autoalloc import cli

    layercache.put("layer", ("user", "/u/config.toml"), b"x", ("found", 1))
    taken = layercache._name(("layer", "user", "/v/config.toml", layercache._code_identity()))
    users = ["results.pickle", "draft.tmp", "layer-0123abcd.pickle",
             "layer-0123abcd.pickle.7.tmp", taken]  # fmt: skip
    for name in users:
        (enabled / name).write_bytes(b"the user's own")
        os.utime(enabled / name, (1, 1))  # older than any entry, and stale for a temporary
    kept = _files(enabled)
    layercache.put("layer", ("user", "/v/config.toml"), b"x", ("found", 2))  # the same name
    assert layercache.get("layer", ("user", "/v/config.toml"), b"x") is None
    for i in range(200):  # evicts the least recently used, tidies stale temporary files
        layercache.put("layer", ("project", f"/tmp/p{i}/autoalloc.toml"), b"x", ("found", i))
    assert {name: _files(enabled)[name] for name in users} == {name: kept[name] for name in users}
    assert cachedir.describe()["entries"] <= 128
    assert cli.main(["cache", "--clear"]) == 0
    assert sorted(_files(enabled)) == sorted([*users, "CACHEDIR.TAG"])
    assert {name: _files(enabled)[name] for name in users} == {name: kept[name] for name in users}
    assert (enabled / "CACHEDIR.TAG").read_bytes().startswith(SIGNATURE)


def test_a_directory_autoalloc_did_not_make_is_not_its_cache(sandbox, monkeypatch, capsys) -> None:
    """``XDG_CACHE_HOME=$HOME`` and a clone of some project at ``~/autoalloc``: ``import
    torch`` decides as without a cache and writes and removes nothing there (a stale
    ``notes.tmp`` stays), nor ``ab``; ``autoalloc cache`` and ``doctor`` say why,
    ``--clear`` removes nothing."""
    from autoalloc import cli, doctor

    sandbox.user_policy(USER)
    clone = sandbox.home / "autoalloc"
    for name in ("README.md", ".git/HEAD", "notes.tmp", "experiment-results.pickle"):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text("the project's own\n")
    os.utime(clone / "notes.tmp", (1, 1))
    before = _files(clone)
    env = {"XDG_CACHE_HOME": str(sandbox.home)}
    result = sandbox.run([str(sandbox.script("train_lab.py"))], env=env)
    assert result.returncode == 0, result.stderr
    applied = probe_result(result.stdout)["env"]["PYTORCH_CUDA_ALLOC_CONF"]
    assert "garbage_collection_threshold:0.5" in applied
    assert _files(clone) == before
    monkeypatch.setenv("HOME", str(sandbox.home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(sandbox.home))
    assert cli.main(["cache"]) == 1
    out = capsys.readouterr().out
    assert "not made by autoalloc (no CACHEDIR.TAG)" in out and "experiment-results.pickle" in out
    assert cli.main(["cache", "--clear"]) == 1
    assert "not cleared" in capsys.readouterr().err
    assert any("no CACHEDIR.TAG" in note for note in doctor._cache_notes())
    run = Path(cachedir.run_dir("ab"))  # nor does ab's output go there
    assert clone not in run.parents
    run.rmdir()
    assert _files(clone) == before and not (clone / "ab").exists()


def test_a_directory_holding_only_its_entries_is_tagged_and_used(enabled: Path) -> None:
    """An empty directory, or one that holds only autoalloc's entries (an earlier process
    that did not tag it), is used and tagged."""
    enabled.mkdir(mode=0o700)
    layercache.put("layer", ("user", "/u/config.toml"), b"x", ("found", 1))
    assert (enabled / "CACHEDIR.TAG").read_bytes().startswith(SIGNATURE)
    (enabled / "CACHEDIR.TAG").unlink()
    assert layercache.get("layer", ("user", "/u/config.toml"), b"x") == ("found", 1)
    layercache.put("layer", ("user", "/w/config.toml"), b"x", ("found", 3))
    assert (enabled / "CACHEDIR.TAG").exists() and len(list(enabled.glob("*.pickle"))) == 2


XDG_CASES = [  # HOME is the test's; None: the variable unset
    {"XDG_CONFIG_HOME": None, "XDG_CONFIG_DIRS": None},
    {"XDG_CONFIG_HOME": "{tmp}/xdg-home", "XDG_CONFIG_DIRS": "{tmp}/site-a:{tmp}/site-b"},
    {"XDG_CONFIG_HOME": "", "XDG_CONFIG_DIRS": ""},
    {"XDG_CONFIG_HOME": "relative/conf", "XDG_CONFIG_DIRS": "{tmp}/only"},
]


@pytest.mark.parametrize("xdg", XDG_CASES)
def test_platformdirs_is_asked_only_where_a_config_folder_of_ours_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xdg: dict
) -> None:
    """The hook skips platformdirs (importing it costs the first process a fifth of its
    budget) when no ``autoalloc`` folder is in any XDG configuration directory: each folder
    platformdirs names for the site and user files must be one of those looked at."""
    import platformdirs

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for name, value in xdg.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value.format(tmp=tmp_path))
    monkeypatch.setattr(layercache, "_ENABLED", [True])
    named = [platformdirs.site_config_dir("autoalloc"), platformdirs.user_config_dir("autoalloc")]
    if xdg["XDG_CONFIG_DIRS"] is None:
        assert named[0] == "/etc/xdg/autoalloc"
        if Path(named[0]).exists():
            pytest.skip("this machine has a site config folder of autoalloc's")
        named = named[1:]  # a system folder, not made here
    assert layercache._none_there()
    for folder in named:
        Path(folder).mkdir(parents=True)
        assert not layercache._none_there(), folder  # then platformdirs is asked
        Path(folder).rmdir()
    assert layercache._none_there()
    monkeypatch.setattr(layercache, "_ENABLED", [])
    assert not layercache._none_there()  # the commands always ask platformdirs


@pytest.mark.parametrize("home", ["", "relative/home"])
def test_platformdirs_is_asked_where_home_is_empty_or_relative(
    monkeypatch: pytest.MonkeyPatch, home: str
) -> None:
    # platformdirs then takes the password database's home, which the hook does not look at
    if sys.platform != "linux" or os.path.isdir("/etc/xdg/autoalloc"):
        pytest.skip("the shortcut is taken on Linux, without a site config folder of ours")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_DIRS", raising=False)
    monkeypatch.delenv("ANDROID_DATA", raising=False)
    monkeypatch.setattr(layercache, "_ENABLED", [True])
    monkeypatch.setenv("HOME", "/nonexistent/home")
    assert layercache._none_there()
    monkeypatch.setenv("HOME", home)
    assert not layercache._none_there()


def test_the_first_process_without_config_folders_does_not_import_platformdirs(sandbox) -> None:
    first = decide(sandbox)
    assert not first["platformdirs"] and not first["parsed"] and first["decision"][0] == "none"
    assert [s[2] for s in first["layers"] if s[0] in ("site", "user")] == ["missing", "missing"]
    sandbox.user_policy(USER)  # a user file: platformdirs names it, the next process reads it
    second = decide(sandbox)
    assert second["platformdirs"] and second["decision"][:2] == ["apply", "lab-a"]
