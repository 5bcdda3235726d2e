#!/usr/bin/env python3
"""What autoalloc costs, counted in instructions: callgrind, hook vs no hook, in one run.

Wall-clock ratios on a shared machine swing by several percent from run to run; the
number of instructions a process executes does not (callgrind counts them, deterministic
to well under 1% with ``PYTHONHASHSEED`` fixed). This benchmark uses the venv of
``benchmarks/startup.py`` (autoalloc installed from this checkout as a wheel, torch 2.13.0
CPU, setuptools), compiles the bytecode of everything in it as ``pip install`` does (the
runs themselves write none), gives every process an empty ``HOME`` (so only the built-in
policy applies, unless a case brings its own), works in a folder of the system's temporary
directory (outside every project: a checkout's ``pyproject.toml`` above the scripts would be
their project's, parsed by the first process) and counts each case with the hook files in
place and moved aside:

- P1   ``python -c pass``.
- P1'  what each ``.pth`` adds to ``python -c pass`` in the same venv: ``autoalloc.pth``,
       setuptools' ``distutils-precedence.pth``, and a ``.pth`` holding ``import sys``.
- P2   ``python plain.py`` (``import torch``; no rule matches; its project's
       ``pyproject.toml`` lists autoalloc as a dependency, without a ``[tool.autoalloc]``
       table), the same import in a script laid out as NeMo's
       ``examples/asr/asr_ctc/speech_to_text_ctc_bpe.py`` (the built-in policy applies), and
       that script under a project ``autoalloc.toml`` of 20 rules (the last one applies);
       and of 200 rules: what P3's policy size costs in a real ``import torch``, the
       decision with the rest of the hook's path (the guards' import and installation).
       The hook arm is checked to have decided as expected. These count with the layer
       cache an earlier process wrote (warm); ``p2-cold`` counts ``python plain.py`` as the
       first process after the cache was emptied (it parses the built-in policy and writes
       the cache).
- probe ``importlib.util.find_spec("torch")``: how libraries test for torch.
- P3   the decision alone (``sources.load`` + ``decide.decide``), first call in a fresh
       process, imports included: 200 and 10,000 rules (half in a project file 30
       directories above the script, half in a user file; the last one matches); counted
       inside the call that decides only (callgrind's ``--toggle-collect`` on the C function
       that calls it, ``functools.reduce``): what the process does before and after does not
       count. ``warm``: the layer cache was written by an earlier process; ``cold``: no
       cache yet; ``at import torch``: warm, with the modules a no-hook ``import torch``
       loads (``typing``, ``dataclasses``, ``re``, ``pickle``, ...) imported first, which
       is what the decision adds where it runs, right before torch's own code; counted
       also as the whole process minus one that does not decide (what the decision leaves
       to the rest of the process, collecting and freeing what it created, counts there).
- net  the decision at ``import torch`` without torch: the modules torch imports anyway
       loaded first, then the hook's ``before_exec`` (and the import of ``autoalloc.guards``)
       on a stand-in module, counted inside the call that runs them, as P3; a quick
       (seconds, not minutes) estimate of P2's difference, without the run-to-run swing of
       a whole ``import torch`` (a few million instructions).

Milliseconds-equivalent: instructions divided by the rate of the no-hook ``import torch``
process on this machine (its instructions over its CPU time, median of a few native runs).

Usage::

    python benchmarks/instructions.py --json benchmarks/results/DATE-instructions.json
    python benchmarks/instructions.py --only p1,site,net    # seconds: no torch import counted

Without valgrind it says so and exits 0. A P2 count takes about 2 minutes of CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import startup as wall  # (the wall-clock benchmark beside this one: same venv)

CASES = ("p1", "site", "probe", "p2", "p2-cold", "p2-own", "p2-match", "p2-match20",
         "p2-match200", "p3", "net")  # fmt: skip
GOALS = {"p1": 0.02, "p2": 0.01, "p2-cold": 0.015, "site": 0.5, "p3-200": 15.0,
         "p3-10000": 1000.0}  # fmt: skip
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")
NEMO_SCRIPT = ("NeMo", "examples", "asr", "asr_ctc", "speech_to_text_ctc_bpe.py")


# The C function whose calls P3 counts alone: the decision runs inside functools.reduce
# (an otherwise unused builtin), so what the process does before it does not count.
MARKER = "functools_reduce"


def count(argv: list[str], env: dict[str, str], cwd: Path, inside: str | None = None) -> int:
    """Instructions ``argv`` executes (callgrind, no cache simulation, no output file);
    ``inside``: only those executed inside calls of that C function."""
    only = ["--collect-atstart=no", f"--toggle-collect={inside}"] if inside else []
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *only, *argv]
    out = subprocess.run(cmd, env=env, cwd=str(cwd), capture_output=True, text=True)
    found = COLLECTED.findall(out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"instructions.py: {argv} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return int(found[-1])


def decision_counted(instructions: int) -> int:
    """A decision counted inside ``MARKER``, or exit: callgrind found no such symbol (a
    stripped build) and counted nothing."""
    if instructions < 1_000_000:
        raise SystemExit(f"instructions.py: callgrind found no {MARKER} to count inside")
    return instructions


def native(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    out = subprocess.run(argv, env=env, cwd=str(cwd), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"instructions.py: {argv} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out.stdout


def compile_venv(venv: wall.Venv) -> None:
    """Bytecode for every module of the venv, as pip writes it (the runs write none)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cmd = [venv.python, "-m", "compileall", "-q", "-j", "0", str(venv._site)]
    subprocess.run(cmd, env=env, capture_output=True)  # exit 1: some of torch's files are not 3.11


def work_folder(venv: Path) -> Path:
    """Where the cases' scripts, projects and ``HOME`` lie: one folder per venv in the system's
    temporary directory, outside this checkout, whose ``pyproject.toml`` names autoalloc as a
    key (a console script): above the scripts, it would be their project's file."""
    name = f"autoalloc-instructions-{os.getuid()}-{zlib.crc32(bytes(venv)):08x}"
    return Path(tempfile.gettempdir()) / name


def environment(work: Path) -> dict[str, str]:
    """Nothing that changes Python's, autoalloc's or torch's behaviour; an empty HOME."""
    home = work / "home"
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    drop = ("AUTOALLOC_", "PYTORCH_", "PYTHON", "XDG_", "TORCH_", "VIRTUAL_ENV", "OMP_", "MKL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(HOME=str(home), PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1")  # fmt: skip
    return env


def arms(venv: wall.Venv, argv: list[str], env: dict, cwd: Path, off: int | None = None) -> dict:
    """One count with the hook files aside (unless ``off`` has it), one with them in place."""
    if off is None:
        venv.set_hook(False)
        try:
            off = count(argv, env, cwd)
        finally:
            venv.set_hook(True)
    on = count(argv, env, cwd)
    return {"no_hook": off, "hook": on, "added": on - off, "ratio": on / off}


# --------------------------------------------------------------------------- cases


# The floors of any .pth that imports a module: an empty one, imported as is, and imported
# behind the check autoalloc's line makes (that the module lies beside the .pth).
FLOOR_MODULE = "_autoalloc_floor_empty"
FLOOR_PTHS = {
    "empty-module": f"import {FLOOR_MODULE}\n",
    "empty-module-checked": (
        f'import os; os.path.exists(sitedir + "/{FLOOR_MODULE}.py") '
        f'and __import__("{FLOOR_MODULE}")\n'
    ),
}


def case_site(venv: wall.Venv, env: dict, work: Path, none: int | None) -> dict:
    """P1': each .pth alone in the venv, ``python -c pass``; cost = count minus no .pth."""
    site = venv._site
    (site / (wall.BARE_PTH + ".aside")).write_text("import sys\n")
    argv = [venv.python, "-c", "pass"]
    out: dict = {}
    venv.set_hook(False)
    try:
        out["none"] = none if none is not None else count(argv, env, work)
        for arm, name in (("distutils", wall.DISTUTILS_PTH), ("bare", wall.BARE_PTH)):
            wall.place(site, name, True)
            try:
                out[arm] = count(argv, env, work)
            finally:
                wall.place(site, name, False)
        out.update(floors(venv, argv, env, work))
    finally:
        venv.set_hook(True)
    out["autoalloc"] = count(argv, env, work)
    arms = ("autoalloc", "distutils", "bare", *FLOOR_PTHS)
    cost = {arm: out[arm] - out["none"] for arm in arms}
    return {"counts": out, "cost": cost, "ratio": cost["autoalloc"] / cost["distutils"]}


def floors(venv: wall.Venv, argv: list[str], env: dict, work: Path) -> dict:
    """``python -c pass`` with a .pth importing an empty module (bytecode compiled)."""
    site, out = venv._site, {}
    module = site / f"{FLOOR_MODULE}.py"
    module.write_text("")
    writes = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([venv.python, "-m", "py_compile", str(module)], check=True, env=writes)
    try:
        for arm, line in FLOOR_PTHS.items():
            pth = site / "zz-autoalloc-floor.pth"
            pth.write_text(line)
            try:
                out[arm] = count(argv, env, work)
            finally:
                pth.unlink()
    finally:
        module.unlink()
        for pyc in (site / "__pycache__").glob(f"{FLOOR_MODULE}.*"):
            pyc.unlink()
    return out


def nemo_tree(root: Path, rules: int) -> Path:
    """A NeMo-shaped checkout with ``import torch`` at its ASR training script's place;
    ``rules``: a project ``autoalloc.toml`` with that many rules, the last matching."""
    script = wall.write(root.joinpath(*NEMO_SCRIPT), "import torch\n")
    if rules:
        body = [
            f'[[rules]]\nname = "lab-{i}"\nscripts = ["**/lab_{i}/train*.py", "lab{i}_*.py"]\n'
            f'modules = ["lab{i}.train*"]\ncommands = ["lab{i}-train"]\n'
            f'imports = ["lab{i}.asr.data"]\n'
            for i in range(rules - 1)
        ]
        body.append('[[rules]]\nname = "lab-ctc"\nscripts = ["**/asr_ctc/speech_to_text_*.py"]\n')
        wall.write(root / "NeMo" / "autoalloc.toml", "\n".join(body))
    return script


PLAIN_PYPROJECT = """[project]
name = "plain"
version = "0.1"
dependencies = ["torch", "autoalloc"]
"""


def case_p2(venv: wall.Venv, env: dict, work: Path, kind: str, off: int | None) -> dict:
    """``off``: the no-hook count of ``import torch`` from another script, when there is one
    (without the hook a process does not depend on its script's path but for a few
    thousand instructions, and each count takes minutes)."""
    plain = kind in ("p2", "p2-cold")
    if plain:
        script, expect = wall.write(work / "plain" / "plain.py", "import torch\n"), ": none ("
        wall.write(work / "plain" / "pyproject.toml", PLAIN_PYPROJECT)
    elif kind == "p2-own":  # its source is read at import torch (remembered: warm)
        script, expect = wall.write(work / "own" / "train_text.py", own_script()), ": none ("
    elif kind == "p2-match":
        script, expect = nemo_tree(work / "match", 0), ": apply rule nemo-asr-train "
    else:  # p2-match20, p2-match200
        rules = int(kind.removeprefix("p2-match"))
        script, expect = nemo_tree(work / f"match{rules}", rules), ": apply rule lab-ctc "
    in_nemo = kind.startswith("p2-match")
    cwd = next(p for p in script.parents if p.name == "NeMo") if in_nemo else script.parent
    traced = subprocess.run([venv.python, str(script)], env={**env, "AUTOALLOC_DEBUG": "1"},
                            cwd=str(cwd), capture_output=True, text=True).stderr  # fmt: skip
    decided = next((line for line in traced.splitlines() if str(script) in line), traced[-300:])
    if kind == "p2-cold":  # the traced run wrote the layer cache: the counted one writes it anew
        shutil.rmtree(Path(env["HOME"]) / ".cache" / "autoalloc")
    result = arms(venv, [venv.python, str(script)], env, cwd, off)
    result["no_hook_from"] = "p2" if off is not None else kind
    result["applied"] = decided.split(": ", 2)[-1]
    result["decided_as_expected"] = expect in decided
    return result


def own_script(functions: int = 21) -> str:
    """A program of the user's own, 300 lines, that matches nothing: a text classifier whose
    source the decision reads (imports, a model, a loop that builds an optimizer), run with no
    argument so that only ``import torch`` and its definitions execute."""
    head = ("import argparse\nimport json\nimport math\nimport os\nimport sys\n\nimport torch\n"
            "from torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n")
    body = "".join(textwrap.dedent(f"""
        def step_{i}(model, batch, optimizer, scale={i}):
            \"\"\"One training step of variant {i}: forward, loss, backward.\"\"\"
            inputs, labels = batch
            logits = model(inputs) * math.sqrt(scale + 1)
            loss = nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            stats = {{"loss": float(loss), "variant": {i}}}
            if os.environ.get("VERBOSE_{i}"):
                print(json.dumps(stats), file=sys.stderr)
            return stats
        """) for i in range(functions))
    tail = textwrap.dedent("""
        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--steps", type=int, default=10)
            args = parser.parse_args()
            model = nn.Sequential(nn.Embedding(100, 16), nn.Flatten(), nn.Linear(128, 4))
            data = TensorDataset(torch.randint(0, 100, (64, 8)), torch.randint(0, 4, (64,)))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for step, batch in zip(range(args.steps), DataLoader(data, batch_size=8)):
                step_0(model, batch, optimizer)


        if __name__ == "__main__" and len(sys.argv) > 1:
            main()
        """)
    return head + body + tail


P3_SCRIPT = textwrap.dedent(
    """
    import functools, os, sys
    for name in (sys.argv[2] if len(sys.argv) > 2 else "").split(","):
        if name:  # the modules torch imports anyway (the "at import torch" count)
            try:
                __import__(name)
            except Exception:
                pass

    def decision(*_):
        if sys.argv[1] == "0":
            return "none - 0"
        from autoalloc import decide, entrypoint, layercache, sources
        from autoalloc.torchinfo import TorchInfo
        layercache.enable()  # as the hook does
        cwd = os.getcwd()
        entry = entrypoint.parse([sys.executable, "train_asr_p3.py"], cwd)
        env = dict(os.environ)
        policy = sources.load(entry, env, cwd)
        torch = TorchInfo("2.13.0+cu130", cuda="13.0")
        d = decide.decide(policy, entry, env, torch, set(sys.modules))
        return f"{d.action} {d.rule} {len(policy.rules)}"

    sys.stdout.write(functools.reduce(decision, [0, 1]) + "\\n")  # the marker call
    """
)


def torch_modules(venv: wall.Venv, env: dict, cwd: Path) -> list[str]:
    """The modules a no-hook ``import torch`` loads, torch's own left out."""
    listing = "import json, sys; print(json.dumps(sorted(sys.modules)))"
    venv.set_hook(False)
    try:
        loaded = json.loads(native([venv.python, "-c", "import torch; " + listing], env, cwd))
    finally:
        venv.set_hook(True)
    return [m for m in loaded if m != "torch" and not m.startswith("torch.")]


def case_p3(venv: wall.Venv, env: dict, work: Path, rules: int, cold: bool) -> dict:
    """The instructions executed inside the decision call (``MARKER``): the process's start
    and the modules it loads before do not count. ``warm``/``cold``: imports included;
    ``at-import-torch``: the modules a no-hook ``import torch`` loads imported first, as at
    ``import torch`` (warm cache). ``none``: the same call deciding nothing (the marker's own
    cost, a few thousand instructions). ``at-import-torch-process``: the same as a whole
    process minus one that does not decide, which also counts what the decision leaves to
    the rest of the process (collecting and, at exit, freeing what it created)."""
    deep, config_home = wall.p3_fixture(work, rules, 30)
    script = wall.write(work / "p3_count.py", P3_SCRIPT)
    cache = work / f"p3-{rules}-cache"
    env = {**env, "XDG_CONFIG_HOME": str(config_home), "XDG_CACHE_HOME": str(cache)}
    anyway = ",".join(torch_modules(venv, env, deep))
    venv.set_hook(False)
    try:
        shutil.rmtree(cache, ignore_errors=True)
        out: dict = {}
        if cold:
            out["cold"] = count([venv.python, str(script), "1"], env, deep, MARKER)
        decided = native([venv.python, str(script), "1"], env, deep).split()
        out["warm"] = count([venv.python, str(script), "1"], env, deep, MARKER)
        out["none"] = count([venv.python, str(script), "0"], env, deep, MARKER)
        out["at-import-torch"] = count([venv.python, str(script), "1", anyway], env, deep, MARKER)
        # the whole processes too: what the decision leaves to the rest of the process (its
        # objects' garbage collections and their teardown at exit) counts there
        whole = [count([venv.python, str(script), arm, anyway], env, deep) for arm in "10"]
        out["process"], out["process-none"] = whole
    finally:
        venv.set_hook(True)
    decision_counted(out["warm"])
    result = {"counts": out, "rules": int(decided[2]), "decision": decided[:2], "method": MARKER}
    result["decided_as_expected"] = decided[:2] == ["apply", "user-last"]
    result["added"] = {k: out[k] for k in ("cold", "warm", "at-import-torch") if k in out}
    result["added"]["at-import-torch-process"] = out["process"] - out["process-none"]
    return result


NET_SCRIPT = textwrap.dedent(
    """
    import sys
    mode, preload = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    for name in preload.split(","):
        if name:
            try:
                __import__(name)
            except Exception:
                pass
    import functools

    def decision(*_):
        if mode == "0":
            return
        import importlib.util, types
        module = types.ModuleType("torch")
        module.__spec__ = importlib.util.find_spec("torch")
        import _autoalloc_loader  # what the watcher imports at the lookup of torch

        _autoalloc_loader.run("before_exec", module, set(sys.modules))
        import autoalloc.guards

    functools.reduce(decision, [0, 1])  # the marker call: only what runs inside is counted
    if mode == "list":
        import json
        print(json.dumps(sorted(sys.modules)))
    """
)


def case_net(venv: wall.Venv, env: dict, work: Path) -> dict:
    """The hook's decision at ``import torch`` net of what torch imports anyway, torch left
    out: the instructions inside the call that runs it (``MARKER``), as for P3."""
    script = wall.write(work / "plain" / "net.py", NET_SCRIPT)
    torch_loads = torch_modules(venv, env, script.parent)
    # every module a no-hook `import torch` loads, as P3 does (not only those the hook loads
    # too, which would depend on whether the layer cache is warm); listed twice, the first
    # run writing the cache the counted runs read
    anyway = ",".join(torch_loads)
    for _ in range(2):
        hook_loads = json.loads(native([venv.python, str(script), "list"], env, script.parent))
    base = count([venv.python, str(script), "0", anyway], env, script.parent, MARKER)
    decided = count([venv.python, str(script), "1", anyway], env, script.parent, MARKER)
    decision_counted(decided)
    extra = sorted(set(hook_loads) - set(torch_loads) - {"torch"})
    return {"without": base, "with": decided, "added": decided, "modules_added": extra,
            "method": MARKER}  # fmt: skip


# --------------------------------------------------------------------------- report


def rate_per_ms(venv: wall.Venv, env: dict, work: Path, instructions: int, runs: int = 5) -> float:
    """Instructions per CPU millisecond of the no-hook ``import torch`` process here."""
    script = work / "plain" / "plain.py"
    venv.set_hook(False)
    try:
        cpu = [wall.spawn_time([venv.python, str(script)], env, str(script.parent))[1]
               for _ in range(runs)]  # fmt: skip
    finally:
        venv.set_hook(True)
    return instructions / statistics.median(cpu)


def m(n: float) -> str:
    return f"{n / 1e6:,.2f} M"


def table(r: dict) -> str:
    rows = ["| case | no hook | hook | added | goal |", "|---|---|---|---|---|"]

    def arm_row(label: str, res: dict, goal: float | None) -> None:
        pct = (res["ratio"] - 1) * 100
        judged = "" if goal is None else (" ok" if res["ratio"] - 1 <= goal else " **over**")
        goal_text = "" if goal is None else f"<= +{goal * 100:g}%{judged}"
        rows.append(f"| {label} | {m(res['no_hook'])} | {m(res['hook'])} | "
                    f"{m(res['added'])} ({pct:+.2f}%) | {goal_text} |")  # fmt: skip

    if "p1" in r:
        arm_row("P1 `python -c pass`", r["p1"], GOALS["p1"])
    if "site" in r:
        s = r["site"]
        ok = "ok" if s["ratio"] <= GOALS["site"] else "**over**"
        rows.append(
            f"| P1' site cost: `autoalloc.pth` vs `distutils-precedence.pth` "
            f"(`import sys` .pth: {m(s['cost']['bare'])}) | {m(s['cost']['distutils'])} | "
            f"{m(s['cost']['autoalloc'])} | {s['ratio']:.2f}x | <= 0.5x {ok} |"
        )
        base = s["counts"]["none"]
        for arm in FLOOR_PTHS:
            if arm in s["cost"]:
                c = s["cost"][arm]
                rows.append(f"| floor: a .pth importing an empty module ({arm}) | | | "
                            f"{m(c)} ({c / base:+.2%}) | |")  # fmt: skip
    if "probe" in r:
        arm_row('`importlib.util.find_spec("torch")`', r["probe"], None)
    labels = {"p2": "P2 `python plain.py` (no rule matches)",
              "p2-cold": "P2 `python plain.py`, cold layer cache (the first process)",
              "p2-own": "P2 an own 300-line `train_text.py` (no rule matches; its source read)",
              "p2-match": "P2 NeMo `speech_to_text_ctc_bpe.py` (built-in rule applies)",
              "p2-match20": "P2 the same, 20-rule project `autoalloc.toml`"}  # fmt: skip
    for key, label in labels.items():
        if key in r:
            arm_row(f"{label}: {r[key]['applied']}", r[key], GOALS.get(key, GOALS["p2"]))
    rate = r.get("rate_per_ms")
    if "p2-match200" in r:  # P3's policy size in a real process: P2's figure, P3's unit
        res = r["p2-match200"]
        ms = f" = {res['added'] / rate:.1f} ms-eq" if rate else ""
        arm_row(f"P2 the same, 200-rule project `autoalloc.toml`{ms}", res, None)
    for rules in (200, 10000):
        res = r.get(f"p3-{rules}")
        if res is None:
            continue
        for kind, added in res["added"].items():
            ms = f" = {added / rate:.1f} ms-eq" if rate else ""
            goal = GOALS[f"p3-{rules}"]
            ok = "" if not rate else (" ok" if added / rate <= goal else " **over**")
            what = {"at-import-torch": "at `import torch` (its modules loaded), warm cache",
                    "at-import-torch-process": "the same, counted as the whole process minus "
                    "one that does not decide"}  # fmt: skip
            rows.append(f"| P3 {rules} rules, first call, {what.get(kind, kind + ' cache')} | | | "
                        f"{m(added)}{ms} | <= {goal:g} ms{ok} |")  # fmt: skip
    if "net" in r:
        n = r["net"]
        rows.append(f"| net: decision at `import torch`, torch left out | | | {m(n['added'])} | |")
    if rate:
        rows.append(f"\nrate: {rate / 1e3:,.0f} k instructions per CPU ms "
                    "(the no-hook `import torch` process)")  # fmt: skip
    return "\n".join(rows)


def run_cases(
    venv: wall.Venv, env: dict, work: Path, only: set[str], cold: bool, p3_rules: list[int],
    save: Callable[[dict], None],
) -> dict:
    """Every case asked for, ``save``-ing the results after each (a count takes minutes)."""
    r = _Saved(save)
    if "p1" in only:
        r["p1"] = arms(venv, [venv.python, "-c", "pass"], env, work)
    if "site" in only:
        r["site"] = case_site(venv, env, work, r.get("p1", {}).get("no_hook"))
    if "probe" in only:
        code = "import importlib.util as u; u.find_spec('torch')"
        r["probe"] = arms(venv, [venv.python, "-c", code], env, work)
    for kind in ("p2", "p2-cold", "p2-own", "p2-match", "p2-match20", "p2-match200"):
        if kind in only:
            # p2-own imports other modules before torch: it is counted against its own baseline
            off = r.get("p2", {}).get("no_hook") if kind != "p2-own" else None
            r[kind] = case_p2(venv, env, work, kind, off)
    if "p3" in only:
        for rules in p3_rules:
            r[f"p3-{rules}"] = case_p3(venv, env, work, rules, cold or rules <= 1000)
    if "net" in only:
        r["net"] = case_net(venv, env, work)
    if "p2" in r:
        r["rate_per_ms"] = rate_per_ms(venv, env, work, r["p2"]["no_hook"])
    return dict(r)


class _Saved(dict):
    """A dict that hands itself to ``save`` whenever a case is added."""

    def __init__(self, save: Callable[[dict], None]) -> None:
        super().__init__()
        self.save = save

    def __setitem__(self, key: str, value: object) -> None:
        super().__setitem__(key, value)
        self.save(dict(self))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=wall.DEFAULT_VENV)
    ap.add_argument("--fresh", action="store_true", help="recreate the venv")
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated ({','.join(CASES)})")
    ap.add_argument("--cold-10k", action="store_true", help="also P3 10,000 rules without cache")
    ap.add_argument("--p3-rules", default="200,10000", help="P3's policy sizes (default 200,10000)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument("--source", type=Path, default=wall.REPO,
                    help="the autoalloc checkout to install (default: this one)")  # fmt: skip
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("instructions.py: valgrind is not installed here: no instruction counts "
              "(install it, e.g. `apt-get install valgrind`); benchmarks/startup.py "
              "measures wall-clock time without it")  # fmt: skip
        return 0
    only = set(args.only.split(","))
    unknown = only - set(CASES)
    if unknown:
        ap.error(f"unknown cases: {sorted(unknown)}")
    venv = wall.build_venv(args.venv.resolve(), args.fresh, sys.executable)
    source = args.source.resolve()
    if source != wall.REPO:
        wall.pip(venv.python, "--force-reinstall", "--no-deps", str(source))
        venv.prepare()
    compile_venv(venv)
    work = work_folder(args.venv.resolve())
    work.mkdir(mode=0o700, exist_ok=True)
    if work.stat().st_uid != os.getuid():  # a shared temporary directory: another user's
        raise SystemExit(f"instructions.py: {work} belongs to another user; remove it")
    env = environment(work)
    meta = {
        "python": platform.python_version(),
        "valgrind": native(["valgrind", "--version"], env, work).strip(),
        "source": str(source),
        "git": wall.git_state() if source == wall.REPO else "",
        "platform": platform.platform(),
    }

    def save(results: dict) -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({**results, "meta": meta}, indent=1) + "\n")

    sizes = [int(n) for n in args.p3_rules.split(",") if n]
    results = run_cases(venv, env, work, only, args.cold_10k, sizes, save)
    results["meta"] = meta
    save(results)
    print(table(results))
    wrong = [k for k, v in results.items()
             if isinstance(v, dict) and v.get("decided_as_expected") is False]  # fmt: skip
    if wrong:  # a count of the wrong decision measures nothing
        print(f"instructions.py: {wrong} did not decide as expected (see 'applied' in the JSON)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
