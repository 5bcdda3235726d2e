#!/usr/bin/env python3
"""What autoalloc's startup hook costs, measured in one run against its budgets (P1-P3, S).

It builds a clean virtual environment (no other ``.pth`` files than a bare venv's),
installs autoalloc from this checkout *non-editable* (as ``pip install autoalloc`` would,
bytecode compiled), plus ``torch==2.13.0`` and numpy for P2, and compares each case
against the same venv with the hook files (``autoalloc.pth``, ``autoalloc.start``) moved
aside. Runs are interleaved (hook, no hook, hook, no hook, ...) and timed from spawn to
exit; the table gives medians, p10-p90 and the median of the paired differences.

- P1  ``python -c pass``: hook vs no hook (budget +2%), and ``python -X importtime -c pass``
      to check that the hook imports nothing but ``_autoalloc_startup``.
- S   the site-processing cost of ``autoalloc.pth`` beside setuptools' ``distutils-precedence.pth``
      and a bare ``.pth`` holding ``import sys``, in the same venv: ``site.main()`` timed inside
      ``python -S`` processes, each with one of the files (or none) in site-packages, the
      four arms alternating run by run; cost = median minus the median of "none" (budget:
      half of ``distutils-precedence.pth``'s).
- P1' P1 with ``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` for autoalloc (what a uv
      install without ``--compile-bytecode`` or a read-only site-packages gives).
- P2  ``python src/train_asr_bench.py`` (the script imports torch) in a project whose
      ``pyproject.toml`` has a matching rule, with a user policy too: hook vs no hook
      (budget +2%). The hook arm is checked to have applied the project rule.
- P3  the decision alone, in process: ``sources.load`` + ``decide.decide`` with 200 rules
      (100 project, 100 user; only the last one matches) and a script 30 directories below
      its project file (budget 5 ms, median of warm calls; the first call of a fresh
      process, which also imports tomllib/platformdirs/..., is reported beside it); the same
      with 10,000 rules (budget 1 s on the first call).

Usage::

    python benchmarks/startup.py                 # full run (about 2 minutes on 2 cores)
    python benchmarks/startup.py --quick         # tiny run counts: plumbing only
    python benchmarks/startup.py --runs 300 --json benchmarks/out/startup.json

Exit status: 0, or 1 when a check fails (the hook imports extra modules, the hook arm did
not apply the rule, the no-hook arm still has the hook). Timings never fail the run; the
``budget`` column says whether each figure is within its budget.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO / "benchmarks" / "out" / "startup-venv"
TORCH_REQ = "torch==2.13.0"
HOOK_FILES = ("autoalloc.pth", "autoalloc.start")
HOOK_MODULES = {"_autoalloc_startup"}
BUDGET_RATIO = 1.02
BUDGET_P3_MS = 5.0
BUDGET_P3_FIRST_MS = 15.0
BUDGET_P3_10K_MS = 1000.0
BUDGET_SITE_RATIO = 0.5  # of distutils-precedence.pth's site cost
SETUPTOOLS_REQ = "setuptools"  # for its distutils-precedence.pth, the reference hook
DISTUTILS_PTH = "distutils-precedence.pth"
BARE_PTH = "bare-import-sys.pth"  # the cost of any .pth file: site reads it, compiles the line


# --------------------------------------------------------------------------- statistics


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method)."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summary(values_ms: list[float]) -> dict:
    return {
        "n": len(values_ms),
        "median_ms": statistics.median(values_ms),
        "p10_ms": quantile(values_ms, 0.10),
        "p25_ms": quantile(values_ms, 0.25),
        "p75_ms": quantile(values_ms, 0.75),
        "p90_ms": quantile(values_ms, 0.90),
        "iqr_ms": quantile(values_ms, 0.75) - quantile(values_ms, 0.25),
        "min_ms": min(values_ms),
    }


def compare(hook_ms: list[float], nohook_ms: list[float], budget_ratio: float | None) -> dict:
    """Both arms' summaries, the ratio of medians and the paired differences (hook - no hook)."""
    diffs = [a - b for a, b in zip(hook_ms, nohook_ms)]
    hook, nohook = summary(hook_ms), summary(nohook_ms)
    ratio = hook["median_ms"] / nohook["median_ms"]
    out = {
        "hook": hook,
        "no_hook": nohook,
        "ratio": ratio,
        "delta_ms": hook["median_ms"] - nohook["median_ms"],
        "paired_delta_ms": {
            "median": statistics.median(diffs),
            "p10": quantile(diffs, 0.10),
            "p90": quantile(diffs, 0.90),
        },
        "samples_ms": {"hook": hook_ms, "no_hook": nohook_ms},
    }
    if budget_ratio is not None:
        out["budget_ratio"] = budget_ratio
        out["within_budget"] = ratio <= budget_ratio
    return out


# --------------------------------------------------------------------------- the venv


class Venv:
    """The benchmark's virtual environment and its hook switch."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = str(root / "bin" / "python")

    @property
    def site_packages(self) -> Path:
        out = subprocess.run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        )
        return Path(out.stdout.strip())

    def set_hook(self, on: bool) -> None:
        """Put the hook files in place, or move them aside (to ``NAME.aside``)."""
        site = self._site
        for name in HOOK_FILES:
            live, aside = site / name, site / (name + ".aside")
            if on and aside.exists():
                os.replace(aside, live)
            elif not on and live.exists():
                os.replace(live, aside)

    def compile_startup_modules(self) -> None:
        """Bytecode for every module a startup hook of this benchmark imports, written
        explicitly: pip may skip it, and PYTHONDONTWRITEBYTECODE=1 stops the runs writing it."""
        site = self._site
        targets = [site / "autoalloc", site / "_distutils_hack",
                   *site.glob("_autoalloc_*.py")]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cmd = [self.python, "-m", "compileall", "-q", *(str(t) for t in targets if t.exists())]
        subprocess.run(cmd, check=True, env=env, capture_output=True)

    def prepare(self) -> None:
        self._site = self.site_packages
        for name in HOOK_FILES:
            if not (self._site / name).exists() and not (self._site / (name + ".aside")).exists():
                raise SystemExit(f"startup.py: {name} was not installed into {self._site}")
        self.set_hook(True)
        # setuptools' .pth only takes part in the S comparison: the other cases measure a
        # venv with no .pth but autoalloc's
        place(self._site, DISTUTILS_PTH, False)


def place(site: Path, name: str, live: bool) -> None:
    """Put ``site/name`` in place, or move it aside to ``name.aside``."""
    on, off = site / name, site / (name + ".aside")
    if live and off.exists():
        os.replace(off, on)
    elif not live and on.exists():
        os.replace(on, off)


def pip(venv_python: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", venv_python, "install", "-q",
           "--disable-pip-version-check", *args]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"startup.py: {' '.join(cmd)} failed")


def build_venv(root: Path, fresh: bool, base_python: str) -> Venv:
    """A venv with autoalloc (non-editable, compiled) and torch; reused if it already has torch."""
    venv = Venv(root)
    has_torch = Path(venv.python).exists() and (
        subprocess.run(
            [venv.python, "-c", "import importlib.util as u; assert u.find_spec('torch')"],
            capture_output=True,
        ).returncode
        == 0
    )
    if fresh or not has_torch:
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        # No pip in the venv: fewer files, and the installer cannot leave a .pth of its own.
        subprocess.run([base_python, "-m", "venv", "--without-pip", str(root)], check=True)
        # torch's bytecode is not compiled here (saves ~30 s); the warm-up runs write it.
        pip(venv.python, "--no-compile", TORCH_REQ, "numpy")
        pip(venv.python, SETUPTOOLS_REQ)
    else:
        site = venv.site_packages
        for name in HOOK_FILES:  # a previous run that was interrupted
            if (site / (name + ".aside")).exists() and not (site / name).exists():
                os.replace(site / (name + ".aside"), site / name)
    # autoalloc itself as a user gets it: a built wheel, bytecode compiled.
    pip(venv.python, "--force-reinstall", str(REPO))
    venv.prepare()
    venv.compile_startup_modules()
    return venv


# --------------------------------------------------------------------------- timing


def spawn_time(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Milliseconds from spawn to exit (wall clock) and the child's CPU time (user + system).

    The CPU time is the cross-check on a busy machine: other processes stretch the wall
    clock of both arms, but hardly the CPU time the child itself used.
    """
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ]
    old = os.getcwd()
    os.chdir(cwd)
    try:
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
        _, status, usage = os.wait4(pid, 0)
        t1 = time.perf_counter_ns()
    finally:
        os.chdir(old)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        detail = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
        raise SystemExit(f"startup.py: {argv} exited {code}:\n{detail.stderr[-2000:]}")
    return (t1 - t0) / 1e6, (usage.ru_utime + usage.ru_stime) * 1000


def interleaved(
    venv: Venv, argv: list[str], env: dict[str, str], cwd: str, runs: int, warmup: int
) -> dict:
    """``runs`` pairs, hook and no hook alternating (A B A B ...), after ``warmup`` pairs."""
    samples: dict[str, list[float]] = {"hook": [], "no_hook": [], "hook_cpu": [], "no_hook_cpu": []}
    for i in range(warmup + runs):
        venv.set_hook(True)
        a = spawn_time(argv, env, cwd)
        venv.set_hook(False)
        b = spawn_time(argv, env, cwd)
        if i >= warmup:
            samples["hook"].append(a[0])
            samples["hook_cpu"].append(a[1])
            samples["no_hook"].append(b[0])
            samples["no_hook_cpu"].append(b[1])
    venv.set_hook(True)
    return samples


def measured(samples: dict, budget_ratio: float | None) -> dict:
    """Wall-clock comparison (judged against the budget) with the CPU-time one inside."""
    result = compare(samples["hook"], samples["no_hook"], budget_ratio)
    result["cpu"] = compare(samples["hook_cpu"], samples["no_hook_cpu"], None)
    del result["cpu"]["samples_ms"]
    result["samples_ms"]["hook_cpu"] = samples["hook_cpu"]
    result["samples_ms"]["no_hook_cpu"] = samples["no_hook_cpu"]
    return result


def run_out(
    venv: Venv, argv: list[str], env: dict[str, str], cwd: str
) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"startup.py: {argv} exited {result.returncode}:\n{result.stderr[-2000:]}")
    return result


def importtime(stderr: str) -> dict[str, tuple[int, int]]:
    """``-X importtime`` output -> {module: (self us, cumulative us)}."""
    out = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue  # the header line
        out[parts[2].strip()] = (int(parts[0]), int(parts[1]))
    return out


def importtime_check(venv: Venv, argv_tail: list[str], env: dict, cwd: str, runs: int) -> dict:
    """Modules the hook adds to a process, and their import times (median over ``runs``)."""
    sets = {True: [], False: []}
    for _ in range(runs):
        for on in (True, False):
            venv.set_hook(on)
            sets[on].append(
                importtime(
                    run_out(venv, [venv.python, "-X", "importtime", *argv_tail], env, cwd).stderr
                )
            )
    venv.set_hook(True)
    with_hook = set().union(*(set(s) for s in sets[True]))
    without = set().union(*(set(s) for s in sets[False]))
    always_with = set.intersection(*(set(s) for s in sets[True]))
    extra = sorted(with_hook - without)
    times = {
        name: {
            "self_us": statistics.median(s[name][0] for s in sets[True] if name in s),
            "cumulative_us": statistics.median(s[name][1] for s in sets[True] if name in s),
        }
        for name in extra
    }
    return {
        "extra_modules": extra,
        "missing_modules": sorted(without - with_hook),
        "hook_modules_present": sorted(HOOK_MODULES & always_with),
        "import_us": times,
        "extra_self_us_total": sum(t["self_us"] for t in times.values()),
    }


# --------------------------------------------------------------------------- fixtures


PROJECT_PYPROJECT = """\
[project]
name = "asr-project"
version = "0"

[tool.autoalloc]
[[tool.autoalloc.rules]]
name = "bench-project-rule"
scripts = ["**/train_asr*.py"]
action = "apply"
"""

USER_POLICY = """\
on_conflict = "keep"

[allocator]
expandable_segments = true

[[rules]]
name = "user-infer"
scripts = ["**/infer*.py", "**/serve*.py"]
action = "skip"

[[rules]]
name = "user-train"
scripts = ["**/my_trainer/**/train*.py"]
modules = ["mylab.train*"]
commands = ["mylab-train"]
imports = ["mylab.asr.data"]
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def base_env(work: Path, config_home: Path) -> dict[str, str]:
    """A clean environment: nothing that changes Python's, autoalloc's or torch's behaviour."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("AUTOALLOC_", "PYTORCH_", "PYTHON", "XDG_", "TORCH_", "VIRTUAL_ENV", "OMP_", "MKL_")
        )
    }
    env.update(
        HOME=str(work / "home"),
        XDG_CONFIG_HOME=str(config_home),
        XDG_CONFIG_DIRS=str(work / "xdg-site"),
        OMP_NUM_THREADS="1",
    )
    return env


P3_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    t0 = time.perf_counter()
    from autoalloc import decide, entrypoint, layercache, sources
    from autoalloc.torchinfo import TorchInfo
    t_import = time.perf_counter() - t0
    layercache.enable()  # as the hook does: an earlier process's validated layers are used
    iterations = int(sys.argv[1])
    cwd = os.getcwd()
    torch = TorchInfo("2.13.0+cu130", cuda="13.0")
    entry = entrypoint.parse([sys.executable, "train_asr_p3.py"], cwd)
    env = dict(os.environ)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        policy = sources.load(entry, env, cwd)
        decision = decide.decide(policy, entry, env, torch, set(sys.modules))
        times.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({
        "times_ms": times,
        "import_ms": t_import * 1000,
        "action": decision.action,
        "rule": decision.rule,
        "rules": len(policy.rules),
        "layers": [[s.layer, s.status] for s in policy.layers],
    }))
    """
)


def p3_fixture(work: Path, rules: int, depth: int) -> tuple[Path, Path]:
    """A project file at the top of a ``depth``-deep tree and a user policy; ``rules`` rules in all.

    ``rules=0``: the typical case instead, P2's small user policy and one project rule.
    """
    top = work / f"p3-{rules}"
    deep = top.joinpath(*[f"d{i:02d}" for i in range(depth)])
    deep.mkdir(parents=True, exist_ok=True)
    write(deep / "train_asr_p3.py", "import torch\n")
    config_home = work / f"p3-{rules}-xdg"
    if rules == 0:
        write(top / "pyproject.toml", PROJECT_PYPROJECT)
        write(config_home / "autoalloc" / "config.toml", USER_POLICY)
        return deep, config_home
    half = rules // 2
    project = ["[tool.autoalloc]"]
    for i in range(half):
        project.append(
            f'[[tool.autoalloc.rules]]\nname = "project-{i}"\n'
            f'scripts = ["**/proj_{i}/train*.py", "nomatch_{i}_*.py"]\n'
            f'modules = ["proj{i}.train*"]\ncommands = ["proj{i}-train"]\n'
        )
    write(top / "pyproject.toml", '[project]\nname = "p3"\n\n' + "\n".join(project))
    user = ["[allocator]\nexpandable_segments = true\n"]
    for i in range(rules - half - 1):
        user.append(
            f'[[rules]]\nname = "user-{i}"\nscripts = ["**/user_{i}/**/train*.py"]\n'
            f'modules = ["user{i}.train"]\n'
            f'imports = ["user{i}.asr.data"]\n'
        )
    user.append(
        '[[rules]]\nname = "user-last"\nscripts = ["**/d00/**/train_asr_p3.py"]\naction = "apply"\n'
    )
    write(config_home / "autoalloc" / "config.toml", "\n".join(user))
    return deep, config_home


# --------------------------------------------------------------------------- the cases


def p1(venv: Venv, env: dict, cwd: str, runs: int, warmup: int, probe_runs: int = 0) -> dict:
    result = measured(
        interleaved(venv, [venv.python, "-c", "pass"], env, cwd, runs, warmup), BUDGET_RATIO
    )
    if probe_runs:
        venv.set_hook(False)
        try:
            pth = str(venv._site / "autoalloc.pth.aside")
            samples = inprocess(venv, ["-c", PTH_LINE_PROBE, pth], env, cwd, probe_runs)
        finally:
            venv.set_hook(True)
        result["hook_line"] = {
            "wall": us_summary([s[0] for s in samples]),
            "cpu": us_summary([s[1] for s in samples]),
        }
    return result


# The hook's own work, timed inside one process: far less exposed to other processes than
# the whole-process comparison. Wall (perf_counter) and CPU (process_time) nanoseconds.
PTH_LINE_PROBE = """
import os, sys, time
src = open(sys.argv[1], encoding="utf-8").read()
scope = {"sitedir": os.path.dirname(os.path.abspath(sys.argv[1]))}  # as site.addpackage has it
t0, c0 = time.perf_counter_ns(), time.process_time_ns()
exec(src, scope)  # what site.py does with an import line of a .pth file
t1, c1 = time.perf_counter_ns(), time.process_time_ns()
assert any(getattr(f, "autoalloc_watcher", False) for f in sys.meta_path)
print(t1 - t0, c1 - c0)
"""

IMPORT_TORCH_PROBE = """
import sys, time  # both loaded at start-up already: this probe must not import what the hook needs
# argv[1]: comma-separated modules to import first: those torch imports anyway, so that the
# timing below is what the hook adds to the process ("net") rather than what it moves earlier.
for name in sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else []:
    __import__(name)
import _autoalloc_loader as startup  # what the watcher imports at the lookup of torch
spent = {"decide": [0, 0], "guards": [0, 0]}
run = startup.run
imported = set()

def timed(key, fn, *args):
    t0, c0 = time.perf_counter_ns(), time.process_time_ns()
    try:
        return fn(*args)
    finally:
        spent[key][0] += time.perf_counter_ns() - t0
        spent[key][1] += time.process_time_ns() - c0

def timed_run(step, module, *args):
    # the wrapped loader of torch calls run("before_exec") and run("after_exec")
    if module.__name__ != "torch":
        return run(step, module, *args)
    before = set(sys.modules)
    timed("decide" if step == "before_exec" else "guards", run, step, module, *args)
    if step == "before_exec":
        imported.update(set(sys.modules) - before)

startup.run = timed_run
import torch
import os
assert os.environ.get("AUTOALLOC_APPLIED"), "the hook did not apply"
print(*spent["decide"], *spent["guards"])
print(",".join(sorted(imported)))
"""

TORCH_MODULES_PROBE = "import json, sys, torch; print(json.dumps(sorted(sys.modules)))"


def inprocess(
    venv: Venv, argv_tail: list[str], env: dict, cwd: str, runs: int
) -> list[list[float]]:
    """Run ``python *argv_tail`` in ``runs`` fresh processes.

    Returns the numbers each process prints first, in microseconds.
    """
    out = []
    for _ in range(runs):
        line = run_out(venv, [venv.python, *argv_tail], env, cwd).stdout.splitlines()[0].split()
        out.append([int(x) / 1000 for x in line])
    return out


def us_summary(values: list[float]) -> dict:
    return {
        "median_us": statistics.median(values),
        "p10_us": quantile(values, 0.1),
        "p90_us": quantile(values, 0.9),
    }


def armed_check(venv: Venv, env: dict, cwd: str) -> dict:
    """Whether the watcher is on sys.meta_path, with and without the hook files."""
    code = "import sys; print(any(getattr(f, 'autoalloc_watcher', False) for f in sys.meta_path))"
    out = {}
    for on in (True, False):
        venv.set_hook(on)
        out["hook" if on else "no_hook"] = (
            run_out(venv, [venv.python, "-c", code], env, cwd).stdout.strip() == "True"
        )
    venv.set_hook(True)
    return out


def p2(
    venv: Venv, work: Path, runs: int, warmup: int, importtime_runs: int, probe_runs: int = 0
) -> dict:
    project = work / "project"
    write(project / "pyproject.toml", PROJECT_PYPROJECT)
    script = write(project / "src" / "train_asr_bench.py", "import torch\n")
    check = write(
        project / "src" / "train_asr_check.py",
        "import os, torch\n"
        "print(os.environ.get('AUTOALLOC_APPLIED'), os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))\n",
    )
    config_home = work / "xdg-config"
    write(config_home / "autoalloc" / "config.toml", USER_POLICY)
    env = base_env(work, config_home)
    applied = {}
    for on in (True, False):
        venv.set_hook(on)
        applied["hook" if on else "no_hook"] = run_out(
            venv, [venv.python, str(check)], env, str(project)
        ).stdout.strip()
    venv.set_hook(True)
    result = measured(
        interleaved(venv, [venv.python, str(script)], env, str(project), runs, warmup), BUDGET_RATIO
    )
    result["applied"] = applied
    result["applied_ok"] = applied["hook"].startswith("bench-project-rule;") and applied[
        "no_hook"
    ].startswith("None")
    result["importtime"] = importtime_check(venv, [str(script)], env, str(project), importtime_runs)
    if probe_runs:
        # run as a script that matches the project rule, like the timed one
        probe = write(project / "src" / "train_asr_probe.py", IMPORT_TORCH_PROBE)
        hook_modules = set(
            run_out(venv, [venv.python, str(probe)], env, str(project))
            .stdout.splitlines()[1]
            .split(",")
        )
        venv.set_hook(False)
        try:
            torch_modules = set(
                json.loads(
                    run_out(
                        venv, [venv.python, "-c", TORCH_MODULES_PROBE], env, str(project)
                    ).stdout
                )
            )
        finally:
            venv.set_hook(True)
        anyway = sorted(
            m for m in hook_modules & torch_modules if m != "torch" and not m.startswith("torch.")
        )
        gross = inprocess(venv, [str(probe)], env, str(project), probe_runs)
        net = inprocess(venv, [str(probe), ",".join(anyway)], env, str(project), probe_runs)
        result["hook_at_import_torch"] = {
            "decide_wall": us_summary([s[0] for s in gross]),
            "decide_cpu": us_summary([s[1] for s in gross]),
            "guards_wall": us_summary([s[2] for s in gross]),
            "guards_cpu": us_summary([s[3] for s in gross]),
            "net_decide_wall": us_summary([s[0] for s in net]),
            "net_decide_cpu": us_summary([s[1] for s in net]),
            "modules_hook_imports": sorted(hook_modules),
            "of_which_torch_imports_anyway": anyway,
        }
    return result


def p3(venv: Venv, work: Path, iterations: int, cold_runs: int, rules: int = 200) -> dict:
    deep, config_home = p3_fixture(work, rules, 30)
    env = base_env(work, config_home)
    script = write(work / "p3_decide.py", P3_SCRIPT)
    # the first process writes the layer cache; the ones timed after it read it, as a
    # process at `import torch` does when no policy file changed since the last one
    warm = json.loads(
        run_out(venv, [venv.python, str(script), str(iterations)], env, str(deep)).stdout
    )
    cold_first, cold_import = [], []
    for _ in range(cold_runs):
        one = json.loads(run_out(venv, [venv.python, str(script), "1"], env, str(deep)).stdout)
        cold_first.append(one["times_ms"][0])
        cold_import.append(one["import_ms"])
    times = warm["times_ms"][1:] or warm["times_ms"]  # the first call of the process is "cold"
    median = statistics.median(times)
    first = statistics.median(cold_first)
    # 200 rules: 5 ms warm, 15 ms on the first call; 10,000 rules: 1 s on the first call
    big = rules > 1000
    budget_warm = None if big else BUDGET_P3_MS
    budget_first = BUDGET_P3_10K_MS if big else BUDGET_P3_FIRST_MS
    within = first <= budget_first and (budget_warm is None or median <= budget_warm)
    return {
        "rules": warm["rules"],
        "depth": 30,
        "action": warm["action"],
        "rule": warm["rule"],
        "decision_ok": warm["action"] == "apply"
        and warm["rule"] == ("user-last" if rules else "bench-project-rule"),
        "layers": warm["layers"],
        "warm": summary(times),
        "cold_first_call": summary(cold_first),
        "cold_module_import": summary(cold_import),
        "median_ms": median,
        "budget_ms": budget_warm,
        "budget_first_call_ms": budget_first,
        "within_budget": within,
    }


SITE_PROBE = """
import time, site
t0, c0 = time.perf_counter_ns(), time.process_time_ns()
site.main()
print(time.perf_counter_ns() - t0, time.process_time_ns() - c0)
"""

SITE_ARMS = {
    "none": (),
    "bare": (BARE_PTH,),
    "distutils": (DISTUTILS_PTH,),
    "autoalloc": ("autoalloc.pth",),
}


def site_cost(venv: Venv, env: dict, cwd: str, runs: int, warmup: int) -> dict:
    """S: ``site.main()`` inside ``python -S``, with one of the arms' files in site-packages.

    The arms alternate run by run (the order rotates each round); an arm's cost is its
    median minus the median of "none", wall clock and CPU time. ``autoalloc.start`` stays
    aside: Python before 3.15 ignores it.
    """
    site = venv._site
    (site / (BARE_PTH + ".aside")).write_text("import sys\n")
    files = sorted({name for names in SITE_ARMS.values() for name in names})
    samples: dict[str, dict[str, list[float]]] = {a: {"wall": [], "cpu": []} for a in SITE_ARMS}
    arms = list(SITE_ARMS)
    venv.set_hook(False)
    try:
        for i in range(warmup + runs):
            for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:
                for name in files:
                    place(site, name, name in SITE_ARMS[arm])
                out = run_out(venv, [venv.python, "-S", "-c", SITE_PROBE], env, cwd).stdout
                wall, cpu = (int(x) / 1000 for x in out.split())
                if i >= warmup:
                    samples[arm]["wall"].append(wall)
                    samples[arm]["cpu"].append(cpu)
    finally:
        for name in files:
            place(site, name, False)
        venv.set_hook(True)
    out: dict = {"arms": {}, "samples_us": samples, "runs": runs}
    for kind in ("wall", "cpu"):
        base = statistics.median(samples["none"][kind])
        costs = {arm: statistics.median(samples[arm][kind]) - base for arm in SITE_ARMS}
        for arm in SITE_ARMS:
            out["arms"].setdefault(arm, {})[kind] = {
                "median_us": statistics.median(samples[arm][kind]),
                "cost_us": costs[arm],
                "of_distutils": costs[arm] / costs["distutils"] if costs["distutils"] > 0 else None,
            }
    ratio = out["arms"]["autoalloc"]["wall"]["of_distutils"]
    out["ratio"] = ratio
    out["budget_ratio"] = BUDGET_SITE_RATIO
    out["within_budget"] = ratio is not None and ratio <= BUDGET_SITE_RATIO
    return out


def p1_nobytecode(venv: Venv, env: dict, cwd: str, runs: int, warmup: int) -> dict:
    cache = venv._site / "autoalloc" / "__pycache__"
    top = list((venv._site / "__pycache__").glob("_autoalloc_*.pyc"))
    shutil.rmtree(cache, ignore_errors=True)
    for pyc in top:
        pyc.unlink()
    env = {**env, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        result = p1(venv, env, cwd, runs, warmup)
        top = list((venv._site / "__pycache__").glob("_autoalloc_*"))
        gone = not cache.exists() and not top
        result["pycache_absent_after"] = gone
    finally:
        venv.compile_startup_modules()
    return result


# --------------------------------------------------------------------------- report


def fmt_arm(s: dict) -> str:
    return f"{s['median_ms']:8.2f} [{s['p10_ms']:.2f}-{s['p90_ms']:.2f}]"


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "OVER")


def table(results: dict) -> str:
    meta = results["meta"]
    lines = [
        f"autoalloc startup benchmark: Python {meta['python']}, {meta['torch']}, "
        f"autoalloc {meta['autoalloc']}, {meta['cpus']} CPUs, "
        f"load average {meta['loadavg_start'][0]:.2f} at start, "
        f"{meta['loadavg_end'][0]:.2f} at end",
        f"{meta['runs']} interleaved pairs per case (P2: {meta['runs_p2']}); "
        "wall clock from spawn to exit, ms: median [p10-p90]",
        "",
        f"{'case':<46}{'no hook':>22}{'hook':>22}"
        f"{'delta (paired p10..p90)':>30}{'ratio':>8}  budget",
    ]
    rows = [
        ("P1  python -c pass", results.get("p1")),
        ("P1' python -c pass, no bytecode for autoalloc", results.get("p1_nobytecode")),
        ("P2  import torch, matching script + policies", results.get("p2")),
    ]
    for label, r in rows:
        if not r:
            continue
        for kind, data in (("wall", r), ("cpu", r["cpu"])):
            pd = data["paired_delta_ms"]
            delta = f"{data['delta_ms']:+.2f} ({pd['p10']:+.2f}..{pd['p90']:+.2f})"
            if kind == "cpu":
                name, budget = "    CPU time of the process (user+sys)", ""
            else:
                name = label
                budget = (
                    f"<= {r['budget_ratio']:.2f} {verdict(r['within_budget'])}"
                    if label[:3] != "P1'"
                    else "(reported)"
                )
            lines.append(
                f"{name:<46}{fmt_arm(data['no_hook']):>22}{fmt_arm(data['hook']):>22}"
                f"{delta:>30}{data['ratio']:>8.3f}  {budget}"
            )
    p3_rows = (
        ("p3", "P3  decision, 200 rules, depth 30"),
        ("p3_10k", "P3  decision, 10,000 rules, depth 30"),
        ("p3_typical", "    decision, typical policy, depth 30"),
    )
    for key, label in p3_rows:
        p3r = results.get(key)
        if not p3r:
            continue
        w, c = p3r["warm"], p3r["cold_first_call"]
        warm_budget = f"warm <= {p3r['budget_ms']:.0f} ms, " if p3r.get("budget_ms") else ""
        first_budget = f"first <= {p3r['budget_first_call_ms']:.0f} ms"
        ok = verdict(p3r["within_budget"])
        budget = f"{warm_budget}{first_budget} {ok}" if key != "p3_typical" else ""
        lines.append(
            f"{label:<46}{'warm':>6}{fmt_arm(w):>22}"
            f"{'first call of a process':>28}{fmt_arm(c):>22}  {budget}"
        )
        lines.append(
            f"      {p3r['rules']} rules in effect; rule {p3r['rule']!r} decided {p3r['action']}; "
            "importing the decision modules first: "
            f"{p3r['cold_module_import']['median_ms']:.1f} ms (median)"
        )
    site = results.get("site")
    if site:
        arms = site["arms"]
        rounds = site["runs"]
        head = f"S   site.main() cost in the same venv, {rounds} rounds of 4 alternating arms"
        lines += ["", head + " (us, median minus no .pth):"]
        labels = {
            "autoalloc": "autoalloc.pth",
            "distutils": "distutils-precedence.pth",
            "bare": "a .pth holding 'import sys'",
        }
        for arm, label in labels.items():
            w, c = arms[arm]["wall"], arms[arm]["cpu"]
            share = f"{w['of_distutils']:.2f}x" if w["of_distutils"] is not None else "-"
            costs = f"{w['cost_us']:8.0f} wall {c['cost_us']:8.0f} CPU"
            lines.append(f"      {label:<30}{costs}  = {share} distutils'")
        ratio = "-" if site["ratio"] is None else f"{site['ratio']:.2f}"
        lines.append(
            f"      autoalloc.pth / distutils-precedence.pth = {ratio} "
            f"(budget <= {site['budget_ratio']:.2f} {verdict(site['within_budget'])}); "
            f"site.main() with no .pth: {arms['none']['wall']['median_us']:.0f} us"
        )
    it = results.get("importtime")
    if it:
        extra = ", ".join(it["extra_modules"]) or "(none)"
        times = ", ".join(f"{k} {v['self_us']:.0f} us" for k, v in it["import_us"].items())
        lines += [
            "",
            f"python -X importtime -c pass: modules the hook adds: {extra} -> "
            f"{'ok' if it['ok'] else 'FAIL'} ({times})",
        ]
    p2r = results.get("p2")
    if p2r:
        pit = p2r["importtime"]
        lines.append(
            f"P2 hook arm: AUTOALLOC_APPLIED={p2r['applied']['hook']!r} -> "
            f"{'ok' if p2r['applied_ok'] else 'FAIL'}; "
            f"modules the hook adds to the torch process: {len(pit['extra_modules'])} "
            f"(self time {pit['extra_self_us_total'] / 1000:.1f} ms under -X importtime)"
        )
    line = (results.get("p1") or {}).get("hook_line")
    if line:
        lines.append(
            "P1 hook's own work in process (the .pth line, exec'd as site.py does): "
            f"{line['wall']['median_us']:.0f} us wall, "
            f"{line['cpu']['median_us']:.0f} us CPU (median)"
        )
    at = (p2r or {}).get("hook_at_import_torch")
    if at:
        lines.append(
            "P2 hook's own work in process at import torch: "
            f"decision {at['decide_wall']['median_us'] / 1000:.1f} ms wall "
            f"({at['decide_cpu']['median_us'] / 1000:.1f} ms CPU), guards after torch loaded "
            f"{at['guards_wall']['median_us'] / 1000:.1f} ms "
            f"({at['guards_cpu']['median_us'] / 1000:.1f} ms CPU), median"
        )
        lines.append(
            f"    the decision net of the {len(at['of_which_torch_imports_anyway'])} (of "
            f"{len(at['modules_hook_imports'])}) modules it imports that torch imports anyway: "
            f"{at['net_decide_wall']['median_us'] / 1000:.1f} ms wall "
            f"({at['net_decide_cpu']['median_us'] / 1000:.1f} ms CPU)"
        )
    armed = results.get("armed")
    if armed:
        lines.append(
            f"watcher armed: hook {armed['hook']}, no hook {armed['no_hook']} -> "
            f"{'ok' if armed['ok'] else 'FAIL'}"
        )
    return "\n".join(lines)


def git_state() -> str:
    """The checkout that was installed: commit, and whether the working tree differed from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "autoalloc"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return head.stdout.strip() + (
        " + uncommitted changes in autoalloc/" if dirty.stdout.strip() else ""
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny run counts (plumbing only; the figures mean little)",
    )
    ap.add_argument(
        "--runs",
        type=int,
        help="interleaved pairs for P1 and P1' (default 200; P2 gets a tenth, at least 3)",
    )
    ap.add_argument(
        "--runs-p2", type=int, help="interleaved pairs for P2 (default: --runs / 10, at least 3)"
    )
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    ap.add_argument(
        "--venv",
        metavar="DIR",
        default=str(DEFAULT_VENV),
        help=f"the venv (default {DEFAULT_VENV}; reused)",
    )
    ap.add_argument("--fresh", action="store_true", help="recreate the venv")
    ap.add_argument(
        "--python", default=sys.executable, help="base interpreter for the venv (default: this one)"
    )
    cases = "site,p1,p1_nobytecode,p2,p3"
    ap.add_argument("--only", default=cases, help=f"comma-separated cases ({cases})")
    args = ap.parse_args(argv)

    runs = args.runs or (6 if args.quick else 200)
    runs_p2 = args.runs_p2 or (2 if args.quick else max(3, runs // 10))
    warmup = 1 if args.quick else 5
    only = set(args.only.split(","))

    t_start = time.perf_counter()
    venv = build_venv(Path(args.venv).resolve(), args.fresh, args.python)
    t_setup = time.perf_counter() - t_start
    versions = json.loads(
        run_out(
            venv,
            [
                venv.python,
                "-c",
                "import json, sys, autoalloc, torch, setuptools as s; "
                "print(json.dumps([sys.version.split()[0], autoalloc.__version__,"
                " torch.__version__, s.__version__]))",
            ],
            {**os.environ, "AUTOALLOC_DISABLE": "1"},
            ".",
        ).stdout
    )
    results: dict = {
        "meta": {
            "python": versions[0],
            "autoalloc": versions[1],
            "torch": f"torch {versions[2]}",
            "setuptools": versions[3],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "runs": runs,
            "runs_p2": runs_p2,
            "warmup": warmup,
            "quick": args.quick,
            "venv": str(venv.root),
            "command": "python benchmarks/startup.py "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "setup_s": round(t_setup, 1),
            "loadavg_start": os.getloadavg(),
            "git": git_state(),
        }
    }
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="autoalloc-startup-") as tmp:
        work = Path(tmp)
        (work / "home").mkdir()
        env = base_env(work, work / "xdg-empty")
        cwd = str(work / "home")

        armed = armed_check(venv, env, cwd)
        armed["ok"] = armed["hook"] and not armed["no_hook"]
        results["armed"] = armed
        if not armed["ok"]:
            failures.append(f"the watcher is not armed as expected: {armed}")

        it = importtime_check(venv, ["-c", "pass"], env, cwd, 3 if args.quick else 15)
        it["ok"] = set(it["extra_modules"]) == HOOK_MODULES and not it["missing_modules"]
        results["importtime"] = it
        if not it["ok"]:
            failures.append(
                f"the hook imports {it['extra_modules']} (expected only {sorted(HOOK_MODULES)})"
            )

        if "site" in only:
            results["site"] = site_cost(venv, env, cwd, runs, warmup)
        if "p1" in only:
            results["p1"] = p1(venv, env, cwd, runs, warmup, 3 if args.quick else 50)
        if "p2" in only:
            results["p2"] = p2(
                venv,
                work,
                runs_p2,
                0 if args.quick else 2,
                1 if args.quick else 3,
                1 if args.quick else 10,
            )
            if not results["p2"]["applied_ok"]:
                failures.append(
                    f"P2: the hook arm did not apply the project rule: {results['p2']['applied']}"
                )
        if "p3" in only:
            results["p3"] = p3(venv, work, 20 if args.quick else 300, 2 if args.quick else 10)
            results["p3_typical"] = p3(
                venv, work, 20 if args.quick else 300, 2 if args.quick else 10, rules=0
            )
            big = (2, 1) if args.quick else (5, 5)
            results["p3_10k"] = p3(venv, work, *big, rules=10_000)
            for key in ("p3", "p3_typical", "p3_10k"):
                if not results[key]["decision_ok"]:
                    failures.append(
                        f"{key}: unexpected decision "
                        f"{results[key]['action']} / {results[key]['rule']}"
                    )
        if "p1_nobytecode" in only:
            results["p1_nobytecode"] = p1_nobytecode(venv, env, cwd, runs, warmup)
    venv.set_hook(True)

    results["failures"] = failures
    results["meta"]["total_s"] = round(time.perf_counter() - t_start, 1)
    results["meta"]["loadavg_end"] = os.getloadavg()
    print(table(results))
    if failures:
        print("\nFAILED: " + "; ".join(failures))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
