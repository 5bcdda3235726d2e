"""Fuzzing: whatever the policy files hold, the decision path never raises, warns at most once
per bad file, and every allocator string it produces is accepted by torch's own parser.

Hypothesis generates policy files (valid TOML with wrong types, unknown keys, hostile keys
such as ``env = {LD_PRELOAD=...}``, values at and past torch's limits, huge integers, deep
nesting, invalid TOML, random bytes, invalid UTF-8, BOMs) for every layer (site, user,
project ``autoalloc.toml``, project ``pyproject.toml``, ``AUTOALLOC_CONFIG``), together with
other layers, environments, entry points and torch versions.

- In process, 5 x 2,000 cases with ``--full`` (5 x 60 otherwise; ``AUTOALLOC_FUZZ_CASES`` sets
  the number per layer): ``sources.load`` + ``decide.decide`` as the hook calls them,
  files written in one reused directory. Every string written to a ``PYTORCH_*ALLOC_CONF``
  variable or passed to the runtime setter must pass ``allocconf.parse`` and torch 2.13's
  own parser (``torch._C._accelerator_setAllocatorSettings`` validates values on CPU builds).
- Through real interpreters, 100 cases with ``--full`` (4 otherwise;
  ``AUTOALLOC_FUZZ_SUBPROCESS_CASES``): a script that
  imports torch under the hook; no traceback, its exit code unchanged, exactly the warnings
  the in-process decision predicts (at most one per bad file), and what torch read is what
  was decided and valid for torch.

Runs are derandomized and keep no example database, so CI sees the same cases every time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from autoalloc import allocconf, decide, entrypoint, messages, sources, torchinfo  # noqa: E402
from autoalloc.allocconf import ALL_VARS  # noqa: E402
from autoalloc.torchinfo import TorchInfo  # noqa: E402
from tests.helpers import PY, autoalloc_warnings, clean_env  # noqa: E402

torch = pytest.importorskip("torch")
_SET = torch._C._accelerator_setAllocatorSettings
_SET = getattr(_SET, "__wrapped__", _SET)  # torch's own, not autoalloc's guard


def sample_size(variable: str, full: bool, quick: int, large: int) -> int:
    """The variable if set, else the large count with --full and the quick one without."""
    return int(os.environ.get(variable) or (large if full else quick))


# Per layer (5 layers): 10,000 cases in the full run, 300 in the quick one.
def in_process_cases(full: bool) -> int:
    return sample_size("AUTOALLOC_FUZZ_CASES", full, 60, 2000)


# Each real interpreter imports torch (about a second of CPU): a handful in the quick run.
def subprocess_cases(full: bool) -> int:
    return sample_size("AUTOALLOC_FUZZ_SUBPROCESS_CASES", full, 4, 100)

LAYERS = ("site", "user", "project", "pyproject", "env")
BOM = b"\xef\xbb\xbf"


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


# -- rendering TOML ---------------------------------------------------------------------------


def toml_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_str(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def toml_doc(doc: dict, header: str = "") -> str:
    lines = [header] if header else []
    lines += [f"{toml_str(k)} = {toml_value(v)}" for k, v in doc.items()]
    return "\n".join(lines) + "\n"


# -- strategies -------------------------------------------------------------------------------

scalars = st.one_of(
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.text(max_size=12),
)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=5,
)
EDGE_INTS = [0, 1, 2, 3, 10, 11, 19, 20, 21, 64, 128, 129, 256, 512, 2**42, 2**43 - 1, 2**43, 2**63, 2**64 - 1, 2**64, 10**30]
EDGE_FLOATS = [0.0, 1e-300, 5e-324, 2.2e-308, 1e-18, 1e-5, 0.5, 0.8, 0.999999999, 1.0, 1.0000001, -0.5]
roundup_tables = st.dictionaries(
    st.sampled_from(["1", "2", "64", "128", "256", "1024", ">", "0", "3", "x", "065", "9" * 25, "²"]),
    st.sampled_from([0, 1, 2, 3, 4, 8, 16, -1, 2**50, 2**70, True, "8"]),
    max_size=4,
)
allocator_values = st.one_of(
    st.booleans(),
    st.sampled_from(EDGE_INTS),
    st.integers(min_value=-5, max_value=2**45),
    st.sampled_from(EDGE_FLOATS),
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(),
    roundup_tables,
    st.sampled_from(["native", "cudaMallocAsync", "True", "true", "64:8", "x,y", "[1:2"]),
    anything,
)
allocator_keys = st.sampled_from(
    [*allocconf.KEYS, "bogus", "LD_PRELOAD", "backend ", "expandable_segments_handle_type", "exec", ""]
)
allocator_tables = st.dictionaries(allocator_keys, allocator_values, max_size=4)
PATTERNS = [
    "train_asr.py", "train_*.py", "**/sub/*.py", "sub/train_asr.py", "**/**/**/**/**/**/**/**/**/*.py",
    "*a*a*a*a*a*a*a*a*a*a*b.py", "/abs/**", "**", "*", "[", "[z-a]", "[[:alpha:]]*.py", "[a&&b]", "~/x/*.py",
    "proj/**", "\x1b[31m", "\n", "$(touch /tmp/pwned)",
]
pattern_lists = st.lists(st.one_of(st.sampled_from(PATTERNS), st.text(max_size=10)), max_size=4)
rules = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.sampled_from(["fz", "fz2", "nemo-asr-train", "my.rule", "bad name!", ""]), anything),
        "description": st.one_of(st.text(max_size=20), anything),
        "scripts": st.one_of(pattern_lists, anything),
        "modules": st.one_of(st.lists(st.sampled_from(["myproj.*", "myproj.train", "*", "["]), max_size=3), anything),
        "commands": st.one_of(st.lists(st.sampled_from(["my-train", "my-*", "*"]), max_size=3), anything),
        "imports": st.one_of(st.lists(st.sampled_from(["myproj.data", "nemo.collections.asr", "x"]), max_size=3), anything),
        "argv": st.one_of(st.lists(st.sampled_from(["*", "--x", "*conformer*"]), max_size=2), anything),
        "action": st.one_of(st.sampled_from(["apply", "skip", "deny", "exec"]), anything),
        "allocator": st.one_of(allocator_tables, allocator_tables, anything),
        "env": st.just({"LD_PRELOAD": "/tmp/evil.so"}),
        "command": st.just("/bin/sh -c 'touch /tmp/pwned'"),
    },
)
# A rule that matches every fuzzed entry point, so that allocator options reach torch often.
matching_rules = st.fixed_dictionaries(
    {
        "name": st.just("fz-match"),
        "scripts": st.just(["train_asr.py"]),
        "modules": st.just(["myproj.*"]),
        "commands": st.just(["my-train"]),
        "imports": st.just(["myproj.data"]),
    },
    optional={"allocator": allocator_tables, "action": st.sampled_from(["apply", "apply", "skip"])},
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.one_of(st.booleans(), st.booleans(), anything),
        "on_conflict": st.one_of(st.sampled_from(["keep", "override", "merge"]), anything),
        "allocator": st.one_of(allocator_tables, allocator_tables, anything),
        "rules": st.one_of(st.lists(st.one_of(matching_rules, rules), max_size=3), anything),
        "disable": st.one_of(st.lists(st.sampled_from(["nemo-asr-train", "fz-match", "x"]), max_size=3), anything),
        "trusted_dirs": st.one_of(st.lists(st.sampled_from(["/", "*", ".", "~/x", "relative"]), max_size=2), anything),
        "env": st.just({"LD_PRELOAD": "/tmp/evil.so"}),
        "allocator_backend": st.just({"backend": "x"}),
        "extra": st.dictionaries(st.text(max_size=6), scalars, max_size=1),
    },
).map(lambda d: {**d.pop("extra", {}), **d})

# Fixed hostile documents, cheap to reuse.
SPECIAL_CONTENTS = [
    b"",
    BOM,
    b"\x00" * 64,
    b"a = " + b"[" * 3000 + b"]" * 3000 + b"\n",
    b"a = " + b"{b = " * 3000 + b"1" + b"}" * 3000 + b"\n",
    b"enabled = " + b"1" * 5000 + b"\n",
    b"[allocator]\nmax_split_size_mb = " + b"9" * 4400 + b"\n",
    b"[allocator]\nmax_split_size_mb = 99999999999999999999999999\n",
    b"[allocator]\ngarbage_collection_threshold = 5e-324\n",
    b"[allocator]\ngarbage_collection_threshold = 1e-300\n",
    b"[allocator]\nroundup_power2_divisions = 0\n",
    b'[allocator]\nroundup_power2_divisions = { "99999999999999999999999999" = 8 }\n',
    b"enabled = true\n" + b"x" * 3000 + b"\n",
    b"\xff\xfe" + "enabled = false\n".encode("utf-16-le"),
    b"enabled = \xed\xa0\x80\n",  # a UTF-8-encoded surrogate
    b'\xef\xbb\xbf[[rules]]\nname = "fz-match"\nscripts = ["train_asr.py"]\n',
    b'[[rules]]\nname = "fz-match"\nscripts = ["train_asr.py"]\nenv = { LD_PRELOAD = "/tmp/evil.so" }\n',
    b'[[rules]]\nname = "fz-match"\nscripts = ["' + b"/".join([b"**"] * 400) + b'/x.py"]\n',
    b'[[rules]]\nname = "\x1b]0;owned\x07"\nscripts = ["x"]\n',
    b'[allocator]\n"\x1b[2J\\u001b[31m" = 1\n',
]


INSERTS = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"[", b'"', b"\n[", b"\r"]


def mutate(data: bytes, how: int, at: int, byte: int) -> bytes:
    """Truncate ``data``, insert a troublesome byte sequence, or overwrite one byte."""
    i = at % (len(data) + 1)
    if how == 0:
        return data[:i]
    if how == 1:
        return data[:i] + INSERTS[byte % len(INSERTS)] + data[i:]
    return data[:i] + bytes([byte]) + data[i + 1 :]


def contents(pyproject: bool) -> st.SearchStrategy[bytes]:
    """The bytes of one policy file."""
    if pyproject:
        rendered = st.one_of(
            documents.map(lambda d: toml_doc(d, "[tool.autoalloc]").encode()),
            documents.map(lambda d: toml_doc({"project": {"name": "x"}, "tool": {"autoalloc": d}}).encode()),
            anything.map(lambda v: toml_doc({"tool": {"autoalloc": v}}).encode()),
            anything.map(lambda v: toml_doc({"tool": v, "autoalloc": 1}).encode()),
        )
    else:
        rendered = documents.map(lambda d: toml_doc(d).encode())
    return st.one_of(
        rendered,
        rendered,
        rendered.map(lambda b: BOM + b),
        st.builds(mutate, rendered, st.integers(0, 2), st.integers(0, 10**6), st.integers(0, 255)),
        st.binary(max_size=200),
        st.sampled_from(SPECIAL_CONTENTS),
    )


OTHER_LAYERS = [
    b"[allocator]\ngarbage_collection_threshold = 0.6\n",
    b'[[rules]]\nname = "fz-match"\nscripts = ["train_asr.py"]\nmodules = ["myproj.*"]\n',
    b'on_conflict = "override"\n',
    b"enabled = false\n",
    b"not toml at all [",
]
other_layers = st.one_of(st.none(), st.none(), st.sampled_from(OTHER_LAYERS))
other_pyprojects = st.one_of(st.none(), st.none(), st.sampled_from([
    b"[tool.autoalloc.allocator]\ngarbage_collection_threshold = 0.6\n",
    b'[[tool.autoalloc.rules]]\nname = "fz-match"\nscripts = ["train_asr.py"]\nmodules = ["myproj.*"]\n',
    b'[project]\nname = "x"\n',
    b"[tool.autoalloc\nnot toml",
]))
ENV_PRESETS = [
    {},
    {},
    {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.7"},
    {"PYTORCH_ALLOC_CONF": "expandable_segments:False"},
    {"PYTORCH_CUDA_ALLOC_CONF": ""},
    {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512", "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
    {"PYTORCH_CUDA_ALLOC_CONF": "foo"},
    {"PYTORCH_ALLOC_CONF": "large_segment_size_mb:100"},
    {"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[64:8,>:1], expandable_segments:True"},
]
REAL_TORCH = torchinfo.locate()
TORCHES = [REAL_TORCH, REAL_TORCH, TorchInfo("2.14.1", cuda="13.0"), TorchInfo("2.9.1", cuda="12.8"),
           TorchInfo("2.12.0", hip="7.0.0"), TorchInfo("2.1.0", cuda="12.1"), None]
ENTRY_KINDS = ["script", "script", "module", "command", "code"]


@dataclass
class Case:
    """One generated world: the bytes of each layer file (None: absent) and the process."""

    files: dict[str, bytes | None]
    env: dict[str, str] = field(default_factory=dict)
    entry_kind: str = "script"
    torch: TorchInfo | None = None
    late: bool = False
    imported: frozenset[str] = frozenset()
    foreign_project: bool = False
    trusted_dirs: bool = False


CONTENTS = {False: contents(False), True: contents(True)}
env_presets = st.sampled_from(ENV_PRESETS)
entry_kinds_all = st.sampled_from(ENTRY_KINDS)
torches_all = st.sampled_from(TORCHES)
imported_sets = st.sampled_from([frozenset(), frozenset({"myproj.data"}), frozenset({"nemo.collections.asr"})])


@st.composite
def cases(draw, layer: str, entry_kinds=entry_kinds_all, torches=torches_all) -> Case:
    files = {}
    for name in LAYERS:
        if name == layer:
            files[name] = draw(CONTENTS[name == "pyproject"])
        else:
            files[name] = draw(other_pyprojects if name == "pyproject" else other_layers)
    return Case(
        files=files,
        env=dict(draw(env_presets)),
        entry_kind=draw(entry_kinds),
        torch=draw(torches),
        late=draw(st.booleans()),
        imported=draw(imported_sets),
        foreign_project=draw(st.integers(0, 9)) == 0,
        trusted_dirs=draw(st.booleans()),
    )


# -- the world on disk ------------------------------------------------------------------------


class World:
    """Layer files under one directory, rewritten for each case."""

    def __init__(self, root: Path, script: str = "sub/train_asr.py") -> None:
        self.root = root
        self.paths = {
            "site": root / "xdg-site" / "autoalloc" / "config.toml",
            "user": root / "xdg-config" / "autoalloc" / "config.toml",
            "project": root / "work" / "proj" / "autoalloc.toml",
            "pyproject": root / "work" / "proj" / "pyproject.toml",
            "env": root / "env-policy.toml",
        }
        self.script = root / "work" / "proj" / script
        for path in [*self.paths.values(), self.script]:
            path.parent.mkdir(parents=True, exist_ok=True)
        (root / "home").mkdir(exist_ok=True)
        self.written: dict[str, tuple[bytes, int] | None] = {}  # what is on disk (writing is the slow part)

    @property
    def cwd(self) -> Path:
        return self.root / "work" / "proj"

    def lay_out(self, case: Case) -> dict[str, str]:
        """Write the case's files; the environment the process gets (on top of the base one)."""
        for name, path in self.paths.items():
            data = case.files.get(name)
            uid = 12345 if case.foreign_project and name in ("project", "pyproject") else 0
            want = None if data is None else (data, uid)
            if self.written.get(name) == want:
                continue
            if data is None:
                path.unlink()
            else:
                path.write_bytes(data)
                os.chown(path, uid, uid)
            self.written[name] = want
        env = dict(case.env)
        if case.files.get("env") is not None:
            env["AUTOALLOC_CONFIG"] = str(self.paths["env"])
        if case.trusted_dirs:
            env["AUTOALLOC_TRUSTED_DIRS"] = os.pathsep.join(["relative", str(self.root / "nowhere")])
        return env

    def entry(self, kind: str) -> entrypoint.EntryPoint:
        if kind == "script":
            return entrypoint.parse([PY, str(self.script), "--config", "x.yaml"], str(self.cwd))
        if kind == "module":
            return entrypoint.parse([PY, "-m", "myproj.train"], str(self.cwd))
        if kind == "command":
            return entrypoint.parse([PY, str(self.cwd / "bin" / "my-train")], str(self.cwd))
        return entrypoint.parse([PY, "-c", "import torch"], str(self.cwd))


def torch_accepts(value: str) -> None:
    """torch 2.13's parser takes ``value`` as a fresh process would (defaults first)."""
    _SET("large_segment_size_mb:20,expandable_segments:False")  # the keys that persist between calls
    _SET(value)


def check_value(value: str, where: str) -> None:
    try:
        allocconf.parse(value)
    except allocconf.ConfError as exc:
        raise AssertionError(f"{where}={value!r} is malformed for allocconf.parse: {exc}") from None
    try:
        torch_accepts(value)
    except Exception as exc:
        raise AssertionError(f"{where}={value!r} is rejected by torch: {type(exc).__name__}: {exc}") from None


# autoalloc named in a quoted value that ``,``, ``]``, a comment or the line's end follows (off
# a header line): a dependency, which makes a pyproject.toml no more ours than not naming it.
DEPENDENCY = re.compile(rb'["\']auto[-_]?alloc[^"\'\n]*["\'][ \t\r]*(?=[,\]#]|$)')


def ours(data: bytes) -> bool:
    """Whether a pyproject.toml names autoalloc where it may be a key of TOML's."""
    for line in data.split(b"\n"):
        named = len(re.findall(rb"auto[-_]?alloc", line))
        if named and (line.lstrip()[:1] == b"[" or named > len(DEPENDENCY.findall(line))):
            return True
    return False


def parses(data: bytes, pyproject: bool) -> bool | None:
    """Whether the file is valid TOML (None: a pyproject.toml that is not ours anyway)."""
    if pyproject and not ours(data):
        return None
    try:
        import tomllib
    except ImportError:  # pragma: no cover
        import tomli as tomllib
    try:
        tomllib.loads(data.decode("utf-8-sig"))
    except Exception:
        return False
    return True


def decide_case(world: World, case: Case, base_env: dict[str, str]):
    """The decision for ``case``, checked; returns (decision, layer statuses)."""
    env = {**base_env, **world.lay_out(case)}
    entry = world.entry(case.entry_kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = sources.load(entry, env, str(world.cwd))
        decision = decide.decide(policy, entry, env, case.torch, case.imported, late=case.late)
    assert not caught, [str(w.message) for w in caught]  # nothing but the layer statuses speaks

    # At most one warning per file, and exactly one for a file that could not be used.
    layer_warnings = decide.layer_warnings(policy)
    assert all(w in decision.warnings for w in layer_warnings)
    by_path = {str(p): n for n, p in world.paths.items()}
    mentions: Counter[str] = Counter()
    for message in layer_warnings:
        named = [p for p in by_path if p in message]
        assert len(named) == 1, message
        mentions[named[0]] += 1
        assert "\n" not in messages.printable(message)
    statuses = {s.path: s for s in policy.layers if s.path in by_path}
    for path, layer_name in by_path.items():
        status = statuses.get(path)
        # a file used in part ("found" with a message) warns too, once
        bad = status is not None and (
            status.status in ("error", "untrusted") or (status.status == "found" and status.message)
        )
        assert mentions[path] == (1 if bad else 0), (path, status, layer_warnings)
        data = case.files.get(layer_name)
        shadowed = layer_name == "pyproject" and case.files.get("project") is not None  # autoalloc.toml wins
        if data is not None and not shadowed and parses(data, layer_name == "pyproject") is False:
            assert bad, (layer_name, data[:80], status)
    project = next(s for s in policy.layers if s.layer == "project")
    granted = any(c.trusted_dirs for c in policy.configs)  # a user/site/env file may trust it (e.g. "/")
    if case.foreign_project and project.path in by_path and not granted:
        assert project.status in ("untrusted", "error"), project

    # Every allocator string that reaches torch is valid for torch.
    for name in ALL_VARS:
        if name in decision.writes:
            check_value(decision.writes[name], name)
    if decision.setter_value is not None:
        check_value(decision.setter_value, "runtime setter")
    return decision, policy


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):  # memory-backed: 10,000 cases write ~20,000 files
        root = Path(tempfile.mkdtemp(prefix="autoalloc-fuzz-", dir=shm))
    else:
        root = tmp_path_factory.mktemp("fuzz")
    mp = pytest.MonkeyPatch()
    world = World(root)
    base = clean_env(root)
    for key in ("XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "HOME"):
        mp.setenv(key, base[key])
    yield world, base
    mp.undo()
    if str(root).startswith("/dev/shm/"):
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("layer", LAYERS)
def test_fuzz_layers_in_process(world, layer: str, full: bool) -> None:
    world_, base = world
    seen = Counter()
    n = in_process_cases(full)

    @fuzz_settings(n)
    @given(cases(layer))
    def run(case: Case) -> None:
        decision, _ = decide_case(world_, case, base)
        seen["cases"] += 1
        seen[decision.action] += 1

    run()
    assert seen["cases"] >= n
    # The generator reaches the interesting outcomes, not only rejected files.
    assert seen["apply"] > n // 20, seen


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"[allocator]\nexpandable_segments = true\n" + b"#" * sources.MAX_BYTES, id="over-1MiB"),
        pytest.param(b"[[rules]]\nname = \"fz-match\"\nscripts = [" + b'"x",' * 10_001 + b"]\n", id="10001-patterns"),
        pytest.param(b"".join(b'[[rules]]\nname = "r%d"\nimports = ["m"]\n' % i for i in range(10_001)), id="10001-rules"),
        pytest.param(b'[[rules]]\nname = "fz-match"\nscripts = ["' + b"a" * 5000 + b'"]\n', id="5000-char-pattern"),
        pytest.param(
            b'[[rules]]\nname = "fz-match"\nscripts = ["' + b"/".join([b"**/a*"] * 800) + b'"]\n', id="800-segment-glob"
        ),
        pytest.param(b'disable = ["' + b'", "'.join(b"r%d" % i for i in range(10_000)) + b'"]\n', id="10000-disables"),
    ],
)
def test_huge_files_in_every_layer(world, data: bytes) -> None:
    """Big and huge inputs cost at most one warning (their cost in time: benchmarks/)."""
    world_, base = world
    for layer in LAYERS:
        blob = data.replace(b"[[rules]]", b"[[tool.autoalloc.rules]]") if layer == "pyproject" else data
        if layer == "pyproject" and blob.startswith(b"disable"):
            blob = b"[tool.autoalloc]\n" + blob
        decide_case(world_, Case(files={layer: blob}), base)


# -- through real interpreters ----------------------------------------------------------------

FUZZ_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from autoalloc import allocconf
    getter = None
    try:  # torch may refuse a user's own malformed value (an INTERNAL ASSERT on 2.13)
        getter = torch._C._accelerator_getAllocatorSettings()
        setter = torch._C._accelerator_setAllocatorSettings
        allocconf.parse(getter)
        getattr(setter, "__wrapped__", setter)(getter)
        valid = "yes"
    except Exception as exc:
        valid = f"{type(exc).__name__}: {exc}"
    print("FUZZ " + json.dumps({"getter": getter, "valid": valid,
                                "env": {k: os.environ.get(k) for k in allocconf.ALL_VARS}}), flush=True)
    raise SystemExit(3)
    """
)


def test_fuzz_through_real_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    collected: list[Case] = []
    n = subprocess_cases(full)

    @fuzz_settings(n)
    @given(st.sampled_from(LAYERS).flatmap(lambda layer: cases(layer, entry_kinds=st.just("script"), torches=st.just(REAL_TORCH))))
    def collect(case: Case) -> None:
        case.late = False
        case.imported = frozenset()
        collected.append(case)

    collect()
    assert len(collected) >= n

    # Lay out each case and predict its decision in process (platformdirs reads os.environ).
    jobs = []
    for i, case in enumerate(collected):
        # Half the scripts match the built-in NeMo rule (unless a layer says otherwise), half only
        # the generated rules: most cases then write allocator options for torch to read.
        world = World(tmp_path / f"c{i}", "examples/asr/asr_ctc/speech_to_text_ctc_bpe.py" if i % 2 else "sub/train_asr.py")
        world.script.write_text(FUZZ_SCRIPT)
        base = clean_env(world.root)
        for key in ("XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "HOME"):
            monkeypatch.setenv(key, base[key])
        decision, _ = decide_case(world, case, base)
        env = {**base, **world.lay_out(case)}
        jobs.append((world, env, decision))

    def run(job):
        world, env, _ = job
        return subprocess.run(
            [PY, str(world.script), "--config", "x.yaml"], cwd=world.cwd, env=env, capture_output=True, text=True,
            timeout=300,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, jobs))

    applied = 0
    for (world, env, decision), result in zip(jobs, results):
        where = f"case {world.root.name}: {decision.summary()}\nstderr:\n{result.stderr}"
        assert result.returncode == 3, where
        assert "Traceback" not in result.stderr, where
        lines = [line for line in result.stdout.splitlines() if line.startswith("FUZZ ")]
        assert len(lines) == 1, where
        seen = json.loads(lines[0][5:])
        wrote = bool(decision.writes.keys() & set(ALL_VARS))
        # What autoalloc wrote torch must accept; a user's own value it left alone is torch's
        # business (PYTORCH_CUDA_ALLOC_CONF=foo with autoalloc disabled).
        assert seen["valid"] == "yes" or not wrote, (seen, where)
        expected_env = {k: {**env, **decision.writes}.get(k) for k in ALL_VARS}
        assert seen["env"] == expected_env, where
        assert len(autoalloc_warnings(result.stderr)) == len(decision.warnings), (decision.warnings, where)
        applied += decision.action == "apply" and wrote
    assert applied * 4 >= len(jobs), applied
