"""No string autoalloc writes or passes to a setter is ever malformed: ``allocconf`` against torch's own parser.

Three levels:

- pure (``hook``): ``parse(serialize(x)) == x``, ``merge`` keeps every pair parseable, and
  ``parse`` never accepts a value that ``aborts_import`` says aborts torch;
- torch 2.13 CPU, in this process: ``torch._C._accelerator_setAllocatorSettings`` (it
  validates values; a structural error is a RuntimeError INTERNAL ASSERT) accepts every
  value ``serialize_value`` produces and every merged string;
- torch 2.14.1 CUDA (``AUTOALLOC_TORCH_CUDA_PYTHON``), in a batch subprocess: for many
  generated strings, the load-time scan (``libc10_cuda.so`` loaded under ``fork`` with
  the value in ``PYTORCH_CUDA_ALLOC_CONF``: SIGABRT or not), the full parse from the
  environment with ``_snapshot()["allocator_settings"]`` and the runtime setter. This
  build also rejects unknown keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoalloc import allocconf
from autoalloc.allocconf import KEYS, ConfError
from tests.helpers import CUDA_PY

SETTINGS = settings(max_examples=300, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))

# ---------------------------------------------------------------- strategies

EDGE_INTS = [-1, 0, 1, 2, 3, 10, 11, 19, 20, 21, 64, 128, 129, 256, (1 << 31) - 1, 1 << 31, (1 << 63) - 1, 1 << 64]
EDGE_FLOATS = [0.0, 1.0, 0.5, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-20, 1e-5, 0.9999999999999999, -0.5, 1.5]
BOUNDARIES = st.sampled_from([">", "1", "2", "3", "32", "64", "128", "256", "0", "064", "4096", "x", "", " 64"])
ROUNDUP = st.dictionaries(BOUNDARIES, st.one_of(st.sampled_from([0, 1, 2, 3, 4, 8, 16, 1 << 31]), st.integers()), max_size=4)
VALUES = st.one_of(
    st.booleans(),
    st.sampled_from(EDGE_INTS),
    st.integers(),
    st.sampled_from(EDGE_FLOATS),
    st.floats(),
    st.sampled_from(["native", "cudaMallocAsync", "hipMallocAsync", "True", "true", ""]),
    st.text(max_size=6),
    ROUNDUP,
)


@st.composite
def key_values(draw, since: tuple[int, int] = (9, 9)) -> tuple[str, object]:
    key = draw(st.sampled_from(sorted(k for k, spec in KEYS.items() if spec.since <= since)))
    return key, draw(VALUES)


@st.composite
def valid_options(draw, since: tuple[int, int] = (9, 9), backend: bool = True) -> dict[str, str]:
    """Serialized options the policy could hold (as ``policy._allocator`` builds them)."""
    out: dict[str, str] = {}
    for _ in range(draw(st.integers(0, 5))):
        key, value = draw(key_values(since))
        try:
            out[key] = allocconf.serialize_value(key, value)
        except ConfError:
            continue
    if not backend and out.get("backend", "native") != "native":
        del out["backend"]  # chosen when the library loads: a forked child cannot switch it
    try:
        allocconf.check_options(out)
    except ConfError:
        out.pop("max_split_size_mb", None)
        out.pop("max_non_split_rounding_mb", None)
    return out


SPACE = st.sampled_from(["", "", "", " ", "  ", "\t"])


@st.composite
def spaced(draw, options: dict[str, str]) -> str:
    """``options`` as a user might type them: whitespace around tokens, maybe a trailing comma."""
    parts = [f"{draw(SPACE)}{k}{draw(SPACE)}:{draw(SPACE)}{v}{draw(SPACE)}" for k, v in options.items()]
    return ",".join(parts) + (draw(st.sampled_from(["", "", ","])) if parts else "")


TOKENS = st.one_of(
    st.sampled_from(
        ["expandable_segments", "max_split_size_mb", "backend", "garbage_collection_threshold", "roundup_power2_divisions",
         "True", "False", "true", "native", "cudaMallocAsync", "64", "0.5", "20", "foo", ">", "1e-5", "-1"]
    ),
    st.text(alphabet="abxyz_019.-+>", min_size=1, max_size=4),
)
SEPS = st.sampled_from([",", ":", "[", "]", " ", "\t", ",,", "::", ", "])


@st.composite
def env_strings(draw) -> str:
    """What a user's environment may hold: mostly plausible, often broken."""
    if draw(st.booleans()):
        pieces = draw(st.lists(st.one_of(TOKENS, SEPS), max_size=12))
        return "".join(pieces)
    options = draw(valid_options())
    text = draw(spaced(options))
    if draw(st.booleans()) and text:  # one damage
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.one_of(SEPS, TOKENS, st.just(""))) + text[i + draw(st.integers(0, 3)) :]
    return text


OURS = st.fixed_dictionaries({"expandable_segments": st.sampled_from(["True", "False"])}, optional={
    "garbage_collection_threshold": st.sampled_from(["0.6", "0.8"]),
    "max_split_size_mb": st.sampled_from(["64", "512"]),
})

# ---------------------------------------------------------------- pure properties


@pytest.mark.hook
@SETTINGS
@given(valid_options())
def test_serialize_parse_roundtrip(options: dict[str, str]) -> None:
    text = allocconf.serialize(options)
    assert allocconf.parse(text) == list(options.items())
    assert not allocconf.aborts_import(text)
    for value in options.values():  # every value is one tokenizer atom or one [...] list
        assert (value and not any(ch in value for ch in " \t\n\v\f\r,:")) or value.startswith("[")


@pytest.mark.hook
@SETTINGS
@given(key_values())
def test_serialize_value_is_one_token_or_refused(kv: tuple[str, object]) -> None:
    key, value = kv
    try:
        text = allocconf.serialize_value(key, value)
    except ConfError:
        return
    assert allocconf.parse(f"{key}:{text}") == [(key, text)]
    if isinstance(value, bool):
        assert text in ("True", "False")
    if not text.startswith("["):
        assert allocconf.tokens(text) == [text]
        if text.isdigit():
            assert int(text) <= allocconf.MAX_INT


@pytest.mark.hook
@SETTINGS
@given(env_strings(), OURS, st.booleans())
def test_parse_and_merge_never_produce_malformed_text(text: str, ours: dict[str, str], override: bool) -> None:
    try:
        pairs = allocconf.parse(text)
    except ConfError:
        return
    assert not allocconf.aborts_import(text)
    merged, conflicts = allocconf.merge(pairs, ours, override)
    out = allocconf.serialize(merged)
    assert allocconf.parse(out) == merged
    assert not allocconf.aborts_import(out)
    for key in ours:  # the last value decides, as in torch
        want = ours[key] if (override or key not in dict(pairs)) else allocconf.last_value(pairs, key)
        assert allocconf.last_value(merged, key) == want
        assert (key in conflicts) == (key in dict(pairs) and allocconf.last_value(pairs, key) != ours[key])


# ---------------------------------------------------------------- torch 2.13 CPU, in process


@pytest.fixture(scope="module")
def setter():
    torch = pytest.importorskip("torch")
    s = torch._C._accelerator_setAllocatorSettings
    s = getattr(s, "__wrapped__", s)  # autoalloc's guard, if this process has one
    get = torch._C._accelerator_getAllocatorSettings

    def call(text: str) -> str | None:
        """None when torch accepts ``text`` (then its getter returns it); else the error."""
        s("large_segment_size_mb:20")  # sticky across calls: start from torch's default
        try:
            s(text)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        assert get() == text
        return None

    return call, torch.__version__


@SETTINGS
@given(key_values(since=(2, 13)))
def test_torch_213_accepts_every_serialized_value(setter, kv: tuple[str, object]) -> None:
    call, _ = setter
    key, value = kv
    try:
        text = allocconf.serialize_value(key, value)
    except ConfError:
        return
    assert call(f"{key}:{text}") is None


@SETTINGS
@given(valid_options(since=(2, 13)))
def test_torch_213_accepts_every_serialized_policy(setter, options: dict[str, str]) -> None:
    call, _ = setter
    assert call(allocconf.serialize(options)) is None


@SETTINGS
@given(env_strings(), OURS, st.booleans())
def test_torch_213_merged_strings(setter, text: str, ours: dict[str, str], override: bool) -> None:
    """Structurally sound whenever parse accepts; and valid whenever torch accepted the user's own string."""
    call, _ = setter
    try:
        pairs = allocconf.parse(text)
    except ConfError:
        return
    user_error = call(text)
    assert user_error is None or not user_error.startswith("RuntimeError"), (text, user_error)
    merged, _ = allocconf.merge(pairs, ours, override)
    try:
        allocconf.check_options(merged)
    except ConfError:
        return  # decide drops our sizes then
    error = call(allocconf.serialize(merged))
    if user_error is None:
        assert error is None, (text, error)
    else:  # the user's own bad value may survive the merge (or be overridden): never a structural error
        assert error is None or not error.startswith("RuntimeError"), (text, error)


# ---------------------------------------------------------------- torch 2.14.1 CUDA, batch in a subprocess

DRIVER = textwrap.dedent(
    r'''
    import ctypes, importlib.util, json, os, sys
    cases = json.load(sys.stdin)
    lib = os.path.join(importlib.util.find_spec("torch").submodule_search_locations[0], "lib")
    ctypes.CDLL(os.path.join(lib, "libc10.so"), mode=ctypes.RTLD_GLOBAL)
    os.environ.pop("PYTORCH_ALLOC_CONF", None)
    os.environ.pop("PYTORCH_HIP_ALLOC_CONF", None)

    def forked(fn, text):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            try:
                data = fn(text)
            except BaseException as exc:
                data = ["error", f"{type(exc).__name__}: {exc}"]
            payload = json.dumps(data).encode()
            while payload:
                payload = payload[os.write(w, payload):]
            os._exit(0)
        os.close(w)
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        return code, (json.loads(b"".join(chunks)) if chunks else None)

    def load_scan(text):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = text
        ctypes.CDLL(os.path.join(lib, "libc10_cuda.so"), mode=ctypes.RTLD_GLOBAL)
        return "loaded"

    results = [{"scan": forked(load_scan, c["text"])[0]} for c in cases]

    import torch

    def settings():
        s = torch.cuda.memory._snapshot()["allocator_settings"]
        return {"es": s["expandable_segments"], "max_split": s["max_split_size"], "raw": s["PYTORCH_CUDA_ALLOC_CONF"]}

    def from_env(text):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = text
        try:
            return ["ok", settings()]
        except Exception as exc:
            return ["raise", f"{type(exc).__name__}: {exc}"]

    def from_setter(text):
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        try:
            torch._C._accelerator_setAllocatorSettings(text)
            return ["ok", settings()]
        except Exception as exc:
            return ["raise", f"{type(exc).__name__}: {exc}"]

    for case, result in zip(cases, results):
        result["env"] = forked(from_env, case["text"])
        if case["setter"]:
            result["setter"] = forked(from_setter, case["text"])
    print(json.dumps({"torch": torch.__version__, "results": results}))
    '''
)


def _collect(strategy, n: int) -> list:
    """``n`` examples of a strategy (hypothesis drives the generation; the checks run in one batch)."""
    out: list = []

    @settings(max_examples=n, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def gather(example) -> None:
        out.append(example)

    gather()
    return out


@pytest.mark.cuda_build
@pytest.mark.skipif(not CUDA_PY, reason="AUTOALLOC_TORCH_CUDA_PYTHON is not set (scripts/test.sh --full sets it)")
def test_torch_2141_cuda_batch(tmp_path: Path) -> None:
    cases: list[dict] = []
    # (a) environment strings: the load-time scan model and no abort whenever parse accepts
    for text in dict.fromkeys(_collect(env_strings(), 250)):
        cases.append({"kind": "env", "text": text, "setter": False})
    # (b) every string autoalloc can write from a policy: torch accepts it from the env and the setter
    for options in _collect(valid_options(since=(2, 14), backend=False), 80):
        cases.append({"kind": "policy", "text": allocconf.serialize(options), "setter": True, "options": options})
    # (c) a user's valid string merged with ours: still valid, and torch parses what the merge says
    users = valid_options(since=(2, 14), backend=False).flatmap(spaced)
    for user, ours, override in _collect(st.tuples(users, OURS, st.booleans()), 80):
        merged, _ = allocconf.merge(allocconf.parse(user), ours, override)
        try:
            allocconf.check_options(merged)
        except ConfError:
            continue
        cases.append({"kind": "merged", "text": allocconf.serialize(merged), "setter": True, "user": user,
                      "es": allocconf.last_value(merged, "expandable_segments")})
    # fixed probes of the scan model (the backend key stops the scan after its value)
    for text in ["backend", "backend:", "backend:x,foo", "backend,[backend", "backend:[a", "a:backend:x", "[:x", "x:[",
                 "x:y,backend:native,foo", "backend::", "x:a]", "a:b:c", "expandable_segments:True,", ",x:y"]:
        cases.append({"kind": "env", "text": text, "setter": False})
    cases.append({"kind": "env", "text": "expandable_segments", "setter": False})  # known to abort
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "AUTOALLOC_"))}
    env["AUTOALLOC_DISABLE"] = "1"
    run = subprocess.run([CUDA_PY, "-c", DRIVER], input=json.dumps(cases), capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["torch"].startswith("2.14.1")
    failures = []
    for case, result in zip(cases, report["results"]):
        text = case["text"]
        aborted = result["scan"] == -6
        if aborted != allocconf.aborts_import(text):
            failures.append(("aborts_import model", text, result["scan"]))
        try:
            allocconf.parse(text)
            parsed = True
        except ConfError:
            parsed = False
        if parsed and (aborted or result["env"][0] != 0):
            failures.append(("parse accepted what aborts torch", text, result))
        if case["kind"] in ("policy", "merged"):
            for how in ("env", "setter"):
                code, outcome = result[how]
                if code != 0 or outcome[0] != "ok":
                    failures.append((f"torch refused it from the {how}", text, outcome))
                    continue
                if outcome[1]["raw"] != text:
                    failures.append((f"{how}: raw string differs", text, outcome))
                es = allocconf.last_value(allocconf.parse(text), "expandable_segments")
                if outcome[1]["es"] is not (es == "True"):
                    failures.append((f"{how}: expandable_segments", text, outcome))
                split = allocconf.last_value(allocconf.parse(text), "max_split_size_mb")
                if split is not None and outcome[1]["max_split"] != int(split) << 20:
                    failures.append((f"{how}: max_split_size", text, outcome))
    assert not failures, json.dumps(failures[:10], indent=1)
    assert report["results"][-1]["scan"] == -6  # the batch can see an abort at all
    kinds = [c["kind"] for c in cases]
    assert kinds.count("policy") >= 50 and kinds.count("merged") >= 40 and kinds.count("env") >= 100
