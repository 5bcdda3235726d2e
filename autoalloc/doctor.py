"""``autoalloc doctor`` and ``autoalloc.status()``: what torch itself uses, and why.

Verification, not assumption: ``status()`` imports torch (which is when the hook
decides, if it has not yet) and then asks torch what it read: the getter
``torch._C._accelerator_getAllocatorSettings()`` (2.12+), the parsed values of
``torch.cuda.memory._snapshot()["allocator_settings"]`` (CUDA builds, 2.3+) and
``get_allocator_backend()``. Both freeze torch's allocator configuration, so this runs
only when asked for, never on the import path. docs/commands.md ("autoalloc doctor") says
what it reports; ``Status`` holds it, ``render`` words it, and a note says why the layer
cache is not used, when it is not. The decision is this process's own: doctor's in
``autoalloc doctor``, the script's in a training script that calls ``autoalloc.status()``;
the hook is live where the watcher is armed or a decision was recorded.

``ok`` is True when the intent (the options autoalloc applied here or inherited) is what
torch reports, key by key (or nothing was intended: no rule matched, a skip rule,
``AUTOALLOC_DISABLE``, ``-I``), False when it is not or when the hook is not working in
this interpreter. ``doctor`` exits 0 or 1 accordingly.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autoalloc import allocconf, cachedir, entrypoint, torchinfo
from autoalloc.allocconf import ALL_VARS, ASYNC_BACKENDS
from autoalloc.decide import Decision, parse_applied, platform_notes
from autoalloc.envvars import APPLIED_VAR, DISABLE_VAR, truthy
from autoalloc.messages import PACKAGE_DIR, shortened
from autoalloc.plan import first_apply_rule, plan
from autoalloc.version import __version__

HOOK_FILES = ("autoalloc.pth", "autoalloc.start")
_OFF = "autoalloc is switched off here"  # the headline, and how the note that says why starts
_NOT_LIVE = "autoalloc's hook is not live in this interpreter"  # the same, for the problem


@dataclass
class Status:
    """What autoalloc decided here and what torch reports.

    ``as_dict()`` for JSON, ``str()`` for people.
    """

    ok: bool
    summary: str
    python: dict[str, Any]
    torch: dict[str, Any] | None
    hook: dict[str, Any]
    environment: dict[str, Any]
    decision: dict[str, Any] | None
    inherited: dict[str, Any] | None
    matching_job: dict[str, Any] | None
    torch_reports: dict[str, Any]
    in_effect: dict[str, dict[str, Any]]
    problems: list[str] = field(default_factory=list)  # what keeps the intent from being in effect
    warnings: list[str] = field(default_factory=list)  # what autoalloc said when it decided
    notes: list[str] = field(default_factory=list)
    autoalloc: dict[str, Any] = field(default_factory=dict)
    watching: dict[str, Any] = field(default_factory=dict)  # adaptive mode, training rules

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return render(self)


def _site_dirs() -> list[str]:
    """The site directories of this interpreter, its venv's too when ``-S`` kept site from
    finding it."""
    dirs: list[str] = []
    try:
        dirs.extend(site.getsitepackages())
        venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable or "")))
        if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
            dirs.extend(site.getsitepackages([venv]))
    except AttributeError:  # pragma: no cover - old virtualenv's site.py
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:  # pragma: no cover
        pass
    return [d for i, d in enumerate(dirs) if d and d not in dirs[:i]]


def _watcher_armed() -> bool:
    return any(getattr(finder, "autoalloc_watcher", False) for finder in sys.meta_path)


def hook_info(decided: bool, armed: bool) -> tuple[dict[str, Any], list[str], bool]:
    """Installed (files), live (armed or decided), why not; and whether this is a deliberate
    opt-out."""
    dirs = _site_dirs()
    files = [
        os.path.join(d, name)
        for d in dirs
        for name in HOOK_FILES
        if os.path.isfile(os.path.join(d, name))
    ]
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else ""
    why: list[str] = []
    opted_out = False
    live = armed or decided
    if not live:
        if truthy(os.environ.get(DISABLE_VAR)):
            why.append(f"{DISABLE_VAR} is set")
            opted_out = True
        if sys.flags.isolated:
            why.append("python -I (isolated mode): autoalloc stays off")
            opted_out = True
        if sys.flags.no_site:
            why.append("python -S: .pth files were not processed")
        if getattr(sys, "frozen", False):
            why.append("a frozen application (sys.frozen): .pth files are not processed")
        if not files:
            where = ", ".join(dirs)
            why.append(f"autoalloc.pth is in no site directory of this interpreter ({where})")
        elif all(os.path.dirname(f) == user_site for f in files) and sys.flags.no_user_site:
            why.append(
                "autoalloc.pth is only in the user site directory, which -s / PYTHONNOUSERSITE "
                "switches off"
            )
        if not why:
            why.append(
                "the import watcher is not on sys.meta_path "
                "(torch was imported before the hook armed?)"
            )
    info = {
        "installed": bool(files),
        "files": files,
        "live": live,
        "armed": armed,
        "decided": decided,
        "not_live_because": why,
    }
    return info, why, opted_out


def _aborting_value(info: Any, env: Mapping[str, str]) -> str | None:
    """Why ``import torch`` would abort (SIGABRT) here, or None.

    torch 2.10+ GPU builds scan the variable when they load.
    """
    if info is None or info.flavour == "cpu" or info.release < (2, 10):
        return None
    name = next((n for n in (allocconf.CUDA_VAR, allocconf.ALLOC_VAR) if n in env), None)
    if name is not None and allocconf.aborts_import(env[name]):
        return f"{name}={env[name]!r} makes `import torch` abort on {info.describe()}"
    return None


def _torch_reports(torch: Any) -> dict[str, Any]:
    """What torch says is in effect (this builds torch's allocator config if nothing did yet)."""
    out: dict[str, Any] = {"getter": None, "snapshot": None, "backend": None, "errors": {}}
    if torch is None:
        return out
    try:
        out["getter"] = torchinfo.allocator_string(torch)
    except Exception as exc:
        out["errors"]["getter"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    gpu_build = any(getattr(torch.version, name, None) is not None for name in ("cuda", "hip"))
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    if gpu_build and memory is not None:
        backend = getattr(memory, "get_allocator_backend", None)
        if backend is not None:
            try:
                out["backend"] = backend()
            except Exception as exc:
                out["errors"]["backend"] = f"{type(exc).__name__}: {exc}"
        snapshot = getattr(memory, "_snapshot", None)
        if snapshot is not None and out["backend"] in (None, "native"):
            try:
                settings = snapshot()["allocator_settings"]
                out["snapshot"] = {
                    k: v for k, v in settings.items() if not isinstance(v, (list, dict))
                }
            except Exception as exc:
                text = (str(exc).splitlines() or [""])[0]
                out["errors"]["snapshot"] = f"{type(exc).__name__}: {text}"
    return out


def _reported(
    key: str, reports: Mapping[str, Any], env_value: str | None
) -> tuple[str | None, str]:
    """torch's value for ``key`` as allocator text, and where it came from."""
    value = allocconf.from_snapshot(key, reports.get("snapshot") or {})  # False: not reported
    if value is not False:
        return value, "snapshot"
    getter = reports.get("getter")
    text, source = (getter, "getter") if getter is not None else (env_value, "environment")
    if text is None:
        return None, source
    try:
        return allocconf.last_value(allocconf.parse(text), key), source
    except allocconf.ConfError:
        return None, source


def _same(key: str, intended: str, reported: str | None) -> bool:
    if reported is None:
        return False
    if key in ("garbage_collection_threshold", "per_process_memory_fraction"):
        try:
            return abs(float(intended) - float(reported)) < 1e-9
        except ValueError:
            return False
    return "".join(intended.split()) == "".join(reported.split())


def _matching_job(state: Any, env: Mapping[str, str], info: Any, said: list[str]) -> dict | None:
    """What a fresh job here that the first ``apply`` rule matches would get, from the pipeline.

    ``said``: notes doctor gives already (the platform's), not repeated.
    """
    entry = state.plan.entry if state.plan is not None else entrypoint.EntryPoint("unknown")
    job_env = {k: v for k, v in env.items() if k != APPLIED_VAR}  # a job of its own, not a child
    cwd = entrypoint.current_cwd()
    policy = state.policy if state.policy is not None else plan(entry, job_env, cwd, info).policy
    name = first_apply_rule(policy)
    if name is None:
        return None
    job = plan(entry, job_env, cwd, info, rule=name).decision
    if job.action != "apply":
        return None
    return {
        "rule": name,
        "reads": job.read_var,
        "value": job.value,
        "warnings": list(job.warnings),
        "notes": [n for n in job.notes if n not in said],
    }


def _import_torch(problems: list[str]) -> Any:
    """torch, imported here (the hook decides now, if it has not), or None with the problem."""
    fatal = None if "torch" in sys.modules else _aborting_value(torchinfo.locate(), os.environ)
    if fatal:
        problems.append(f"{fatal}: not importing torch (it would abort this process too)")
        return None
    try:
        import torch
    except Exception as exc:
        problems.append(f"torch cannot be imported here: {type(exc).__name__}: {exc}")
        return None
    return torch


def _torch_info(state: Any, torch: Any) -> Any:
    """The installed torch, as the hook saw it, else as found now."""
    if state.torch is not None:
        return state.torch
    if torch is None:
        return torchinfo.locate()
    package = os.path.dirname(torch.__file__)
    return torchinfo.from_package_dir(package) or torchinfo.TorchInfo(
        torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None), package
    )


@dataclass
class _Intent:
    """What autoalloc meant to be in effect here, and what a parent process of this job applied."""

    options: dict[str, str] = field(default_factory=dict)
    inherited: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _intent(
    decision: Decision | None, env: Mapping[str, str], read_var: str | None, opted_out: bool
) -> _Intent:
    """The options autoalloc applied here or inherited, and what is wrong with them."""
    out = _Intent()
    applied = parse_applied(env.get(APPLIED_VAR))
    current = env.get(read_var, "") if read_var else ""
    own = (
        decision is not None
        and applied is not None
        and decision.writes.get(APPLIED_VAR) == env.get(APPLIED_VAR)
    )
    if applied is not None and not own:
        out.inherited = {
            "rule": applied[0],
            "value": applied[1],
            "torch_reads": read_var,
            "current": current,
            "intact": applied[1] == current,
        }
    changed = out.inherited is not None and not out.inherited["intact"]
    if decision is not None:
        if decision.action in ("apply", "inherited"):
            out.options = decision.applied()
            if decision.action == "apply" and not out.options and decision.requested:
                out.options = dict(decision.requested)  # not applied (unparseable): not in effect
        if own:
            out.notes.append(
                f"child processes inherit what this process applied ({APPLIED_VAR}) and stay silent"
            )
        if decision.action != "inherited" and changed:
            out.problems.append(
                f"a parent process applied rule {applied[0]} ({applied[1]!r}), but "
                f"{read_var or 'the variable'} is now {current!r}: changed after autoalloc set it"
            )
            if decision.action in ("none", "skip"):
                out.options = {}
    elif out.inherited is not None and not opted_out:
        try:
            out.options = dict(allocconf.parse(applied[1]))
        except allocconf.ConfError:
            out.options = {}
        if changed:
            out.problems.append(
                f"{APPLIED_VAR} says rule {applied[0]} applied {applied[1]!r}, "
                f"but {read_var} is {current!r}"
            )
    return out


def _in_effect(
    intent: Mapping[str, str], reports: Mapping[str, Any], current: str | None, problems: list[str]
) -> dict:
    """Key by key, what autoalloc meant against what torch reports."""
    in_effect: dict[str, dict[str, Any]] = {}
    for key, want in intent.items():
        got, source = _reported(key, reports, current)
        ok = _same(key, want, got)
        in_effect[key] = {"intended": want, "reported": got, "reported_by": source, "ok": ok}
        if not ok:
            problems.append(
                f"autoalloc meant {key}:{want}, but torch reports {key}:{got} ({source})"
            )
    backend = reports.get("backend")
    if intent.get("expandable_segments") == "True" and backend in ("pluggable", *ASYNC_BACKENDS):
        in_effect["expandable_segments"]["ok"] = False
        problems.append(
            f"torch's allocator backend is {backend}: expandable segments have no effect"
        )
    return in_effect


def _platform_notes(info: Any) -> list[str]:
    if info is None:
        return []
    notes = list(platform_notes(info, sys.platform)[0])
    if info.release < (2, 3) and info.flavour != "cpu":
        notes.append(
            f"{info.describe()} cannot report its allocator settings: shown from the environment"
        )
    return notes


def _python() -> dict[str, Any]:
    return {
        "executable": sys.executable,
        "version": sys.version.split()[0],
        "flags": {k: bool(getattr(sys.flags, k)) for k in ("no_site", "isolated", "no_user_site")},
        "frozen": bool(getattr(sys, "frozen", False)),
    }


def status() -> Status:
    """Import torch (the hook decides then, if it has not) and report what torch uses."""
    from autoalloc import guards, hook

    armed = _watcher_armed()
    problems: list[str] = []
    torch = _import_torch(problems)  # 1. the hook decides now, if nothing imported torch yet
    state, env = hook.STATE, dict(os.environ)
    decision: Decision | None = state.decision
    hook_dict, not_live, opted_out = hook_info(decision is not None, armed or _watcher_armed())
    info = _torch_info(state, torch)
    read_var = allocconf.effective_var(env, info)
    intent = _intent(decision, env, read_var, opted_out)  # 2. what autoalloc meant here
    problems += intent.problems
    notes = list(intent.notes)
    if not hook_dict["live"]:
        why = "; ".join(not_live)
        if opted_out:
            notes.append(f"{_OFF}: {why}")
        else:
            problems.append(f"{_NOT_LIVE}: {why}")
    reports = _torch_reports(torch)
    reports["imported"] = torch is not None
    snapshot = reports["snapshot"] or {}  # where it cannot say (False), guards' model answers
    setter = guards.setter_report(state, lambda k: allocconf.from_snapshot(k, snapshot), _same)
    if setter is not None:  # a runtime setter call changed what torch uses since it read the string
        reports["setter_calls"] = setter
    current = env.get(read_var, "") if read_var else None
    in_effect = _in_effect(intent.options, reports, current, problems)  # 3. against torch
    notes += _platform_notes(info) + _cache_notes()
    matching_job = None  # 4. what a job a rule matches would get here
    if decision is None or decision.action not in ("apply", "inherited"):
        try:
            matching_job = _matching_job(state, env, info, notes)
        except Exception as exc:  # reporting must not fail on a strange policy
            notes.append(f"cannot work out what a matching job would get: {exc!r}")
    ok = torch is not None and (hook_dict["live"] or opted_out)
    ok = ok and all(v["ok"] for v in in_effect.values())
    ok = ok and not (intent.inherited is not None and not intent.inherited["intact"])
    summary = _summary(ok, decision, intent.options, in_effect, hook_dict, opted_out)
    if doctor_itself(decision) and hook_dict["live"] and not intent.options and matching_job:
        summary = ready(matching_job)  # what a user runs a bare `autoalloc doctor` for
    if torch is None:
        summary = "torch was not imported: " + (problems[0] if problems else "unknown")
    found = None if info is None else {k: getattr(info, k) for k in ("version", "flavour", "path")}
    return Status(
        ok=ok, summary=summary, python=_python(),
        autoalloc={"version": __version__, "path": PACKAGE_DIR}, torch=found,
        hook=hook_dict, environment=_environment(env, info, read_var),
        decision=None if decision is None else decision.as_dict(), inherited=intent.inherited,
        matching_job=matching_job, torch_reports=reports, in_effect=in_effect, problems=problems,
        warnings=list(decision.warnings) if decision is not None else [], notes=notes,
        watching=_watching(state),
    )  # fmt: skip


def _cache_notes() -> list[str]:
    """Why the layer cache is not used, when it is not (every process then parses anew)."""
    state = cachedir.describe()
    if state["used"] or state["path"] is None:
        return []
    return [f"the layer cache is not used: {state['reason']} (autoalloc cache)"]


def _watching(state: Any) -> dict[str, Any]:
    """The ``adaptive`` mode and where it came from; the ``training`` rules and if they fired."""
    policy = state.policy
    if policy is None:
        return {}
    valued, watch = policy.adaptive, state.adaptive
    return {
        "adaptive": {
            "value": valued.value,
            "from": valued.source.describe() if valued.source else "default",
            "watching_steps": watch is not None and not watch.done,
        },
        "training": {
            "rules": [r.name for r in policy.rules if r.training],
            "optimizer_built": state.trains,
        },
    }


def _environment(env: Mapping[str, str], info: Any, read_var: str | None) -> dict[str, Any]:
    return {
        "variables": {name: env.get(name) for name in ALL_VARS},
        "read_order": list(allocconf.read_order(info)),
        "torch_reads": read_var,
        APPLIED_VAR: env.get(APPLIED_VAR),
    }


def _summary(
    ok: bool,
    decision: Decision | None,
    intent: Mapping[str, str],
    in_effect: Mapping[str, Any],
    hook: Mapping[str, Any],
    opted_out: bool,
) -> str:
    options = ",".join(f"{k}:{v}" for k, v in intent.items())
    if not hook["live"]:
        return _OFF if opted_out else _NOT_LIVE
    if not intent:
        return nothing_to_do(decision)
    if ok:
        return f"in effect: torch uses {options}"
    missing = [(k, v) for k, v in in_effect.items() if not v["ok"]]
    if not missing:
        return "NOT in effect: see the problems below"
    meant = ",".join(f"{k}:{v['intended']}" for k, v in missing)
    got = ",".join(f"{k}:{v['reported']}" for k, v in missing)
    by = missing[0][1]["reported_by"]
    return f"NOT in effect: autoalloc meant {meant}; torch reports {got} ({by})"


_CHECK_A_JOB = 'to check a job, run "autoalloc explain -- CMD" or "autoalloc ab -- CMD"'


def doctor_itself(decision: Decision | None) -> bool:
    """Whether this process's own decision is the one for ``autoalloc doctor`` itself."""
    return (
        decision is not None
        and decision.action == "none"
        and decision.entry.target in ("autoalloc", "autoalloc.__main__")
    )


def ready(job: Mapping[str, Any]) -> str:
    """The headline of a bare ``autoalloc doctor``: the hook is live, and what a job gets."""
    return (
        f"installed and live here; a job a rule matches (e.g. rule {job['rule']}) gets "
        f"{job['reads']}={shortened(job['value'])}; {_CHECK_A_JOB}"
    )


def nothing_to_do(decision: Decision | None) -> str:
    """The headline when this process meant no allocator options: why, and what to run instead
    (doctor's own process is rarely the one a user wants to know about)."""
    if decision is None:
        why = "torch was imported before autoalloc could decide"
    elif doctor_itself(decision):
        why = 'no rule matches "autoalloc doctor" itself'
    elif decision.action == "none":
        why = f"no rule matches {decision.entry.describe()}"
    else:
        why = f"{decision.action}: {decision.reason}" if decision.reason else decision.action
    return f"nothing to do in this process ({why}); {_CHECK_A_JOB}"


def render(s: Status) -> str:
    """The text form of a status."""
    verdict = "OK" if s.ok else "PROBLEM"
    lines = [f"autoalloc {s.autoalloc.get('version', '')}: {verdict}: {s.summary}"]
    lines += _render_setup(s) + _render_decision(s) + _render_torch(s) + _render_messages(s)
    return "\n".join(lines)


def _render_setup(s: Status) -> list[str]:
    lines = [f"python:       {s.python['version']} ({s.python['executable']})"]
    t = s.torch
    imported = "" if s.torch_reports.get("imported", True) else "  (not imported)"
    found = f"{t['version']} ({t['flavour']}) at {t['path']}{imported}" if t else "not found"
    lines.append(f"torch:        {found}")
    h = s.hook
    installed = ", ".join(h["files"]) if h["files"] else "no"
    lines.append(f"hook:         installed: {installed}; live here: {'yes' if h['live'] else 'no'}")
    lines += [f"              ({why})" for why in h["not_live_because"]]
    env = s.environment
    for name, value in env["variables"].items():
        mark = "  <- torch reads this" if name == env["torch_reads"] else ""
        lines.append(f"{name + ':':<26}{'(unset)' if value is None else shortened(value)}{mark}")
    return lines


def _render_decision(s: Status) -> list[str]:
    d = s.decision
    lines = []
    if d is None:
        lines.append("decision:     none recorded in this process")
    else:
        rule = f" rule {d['rule']} from {d['rule_source']}" if d["rule"] else ""
        lines.append(f"decision:     {d['action']}{rule} for {d['entry_point']}")
        if d["reason"]:
            lines.append(f"because:      {d['reason']}")
        if d["action"] == "apply":
            setter = " (runtime setter)" if d["via"] == "setter" else ""
            lines.append(f"applied:      {d['read_var']}={d['value']!r}{setter}")
    if s.inherited is not None:
        i = s.inherited
        now = f"but {i['torch_reads']} is now {i['current']!r}"
        state = "still what torch reads" if i["intact"] else now
        lines.append(
            f"inherited:    rule {i['rule']} applied {i['value']!r} in a parent process ({state})"
        )
    return lines


def _render_torch(s: Status) -> list[str]:
    r = s.torch_reports
    lines = []
    if r["getter"] is not None:
        lines.append(f"torch getter: {r['getter']!r}")
    if r["snapshot"] is not None:
        segments = r["snapshot"].get("expandable_segments")
        lines.append(f"torch parsed: expandable_segments={segments}")
    if r["backend"] is not None:
        lines.append(f"backend:      {r['backend']}")
    lines += [f"torch {what} failed: {error}" for what, error in r["errors"].items()]
    setter = r.get("setter_calls")
    if setter:
        count = len(setter["calls"])
        lines.append(f"setter calls: {count}; what was asked for, and what torch uses now:")
    for key, v in (setter or {}).get("options", {}).items():
        now = "torch's default" if v["now"] is None else v["now"]
        by = f", changed by the call at {v['changed_by']}" if v["changed_by"] else ""
        lines.append(
            f"  {key}: asked {v['asked']} (from {v['from']}), torch now uses {now} "
            f"({v['reported_by']}{by})  {'ok' if v['ok'] else 'LOST'}"
        )
    for key, v in s.in_effect.items():
        mark = "ok" if v["ok"] else "NOT IN EFFECT"
        lines.append(
            f"  {key}: meant {v['intended']}, torch reports {v['reported']} "
            f"({v['reported_by']})  {mark}"
        )
    return lines


def _render_watching(s: Status) -> list[str]:
    if not s.watching:
        return []
    a, t = s.watching["adaptive"], s.watching["training"]
    steps = "; watching the optimizer steps" if a["watching_steps"] else ""
    lines = [f"adaptive:     {a['value']}  [{a['from']}]{steps}"]
    if t["rules"]:
        built = "built" if t["optimizer_built"] else "not built yet"
        lines.append(f"training:     {', '.join(t['rules'])} (optimizer {built} in this process)")
    return lines


def _render_messages(s: Status) -> list[str]:
    lines = [*_render_watching(s)]
    lines += [f"problem:      {problem}" for problem in s.problems]
    lines += [f"warning:      {warning}" for warning in s.warnings]
    lines += [f"note:         {note}" for note in s.notes]
    job = s.matching_job
    if job is not None and (job["warnings"] or job["notes"]):
        lines.append(f"a job matching rule {job['rule']} here would be told:")
        lines += [f"  warning: {warning}" for warning in job["warnings"]]
        lines += [f"  note:    {note}" for note in job["notes"]]
    return lines
