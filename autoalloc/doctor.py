"""``autoalloc doctor`` and ``autoalloc.status()``: what torch itself uses, and why.

Verification, not assumption: ``status()`` imports torch (which is when the hook
decides, if it has not yet) and then asks torch what it read: the getter
``torch._C._accelerator_getAllocatorSettings()`` (2.12+), the parsed values of
``torch.cuda.memory._snapshot()["allocator_settings"]`` (CUDA builds, 2.3+) and
``get_allocator_backend()``. Both freeze torch's allocator configuration, so this runs
only when asked for, never on the import path.

What it reports:

- the interpreter, torch (version, flavour) and whether the hook is installed (a
  ``.pth``/``.start`` file in a site directory of this interpreter) and live here (the
  watcher is armed or a decision was recorded), with what defeats it (``-S``, ``-I``,
  ``AUTOALLOC_DISABLE``, a frozen application);
- the allocator variables of the environment and the one torch reads;
- this process's decision (rule, layer file, reason, warnings). In ``autoalloc doctor``
  that is doctor's own decision, made when doctor imported torch; in a training script
  that calls ``autoalloc.status()`` it is the script's;
- ``AUTOALLOC_APPLIED``: what a parent process of this job applied, and whether the
  variable torch reads still holds it (run ``autoalloc doctor`` from inside a job, or
  call ``autoalloc.status()`` there, to check what the job's processes get);
- when this process applied nothing: what a job matching a rule here would be told
  (the conflicts of item 1 of the README's "Conflicts": variables, ``expandable_segments:False``,
  ``backend:cudaMallocAsync``, unparseable values, unsupported platforms);
- the intent (the options autoalloc applied here or inherited) against what torch
  reports, key by key.

``ok`` is True when that intent is what torch reports (or nothing was intended: no rule
matched, a skip rule, ``AUTOALLOC_DISABLE``, ``-I``), False when it is not or when the
hook is not working in this interpreter. ``doctor`` exits 0 or 1 accordingly.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from autoalloc import __version__, allocconf
from autoalloc._startup import truthy
from autoalloc.allocconf import ALL_VARS
from autoalloc.decide import APPLIED_VAR, Decision, parse_applied, platform_notes

HOOK_FILES = ("autoalloc.pth", "autoalloc.start")
# allocator option -> (key in _snapshot()["allocator_settings"], kind)
_SNAPSHOT_KEYS = {
    "expandable_segments": ("expandable_segments", "bool"),
    "release_lock_on_cudamalloc": ("release_lock_on_cudamalloc", "bool"),
    "pinned_use_cuda_host_register": ("pinned_use_cuda_host_register", "bool"),
    "graph_capture_record_stream_reuse": ("graph_capture_record_stream_reuse", "bool"),
    "pinned_num_register_threads": ("pinned_num_register_threads", "int"),
    "garbage_collection_threshold": ("garbage_collection_threshold", "float"),
    "max_split_size_mb": ("max_split_size", "mib"),
}


@dataclass
class Status:
    """What autoalloc decided here and what torch reports; ``as_dict()`` for JSON, ``str()`` for people."""

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
    warnings: list[str] = field(default_factory=list)  # what autoalloc told this process when it decided
    notes: list[str] = field(default_factory=list)
    autoalloc: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return render(self)


def _site_dirs() -> list[str]:
    """The site directories of this interpreter, its venv's too when ``-S`` kept site from finding it."""
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
    """Installed (files), live (armed or decided), why not; and whether this is a deliberate opt-out."""
    files = [os.path.join(d, name) for d in _site_dirs() for name in HOOK_FILES if os.path.isfile(os.path.join(d, name))]
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else ""
    why: list[str] = []
    opted_out = False
    live = armed or decided
    if not live:
        if truthy(os.environ.get("AUTOALLOC_DISABLE")):
            why.append("AUTOALLOC_DISABLE is set")
            opted_out = True
        if sys.flags.isolated:
            why.append("python -I (isolated mode): autoalloc stays off")
            opted_out = True
        if sys.flags.no_site:
            why.append("python -S: .pth files were not processed")
        if getattr(sys, "frozen", False):
            why.append("a frozen application (sys.frozen): .pth files are not processed")
        if not files:
            why.append("autoalloc.pth is in no site directory of this interpreter (" + ", ".join(_site_dirs()) + ")")
        elif all(os.path.dirname(f) == user_site for f in files) and sys.flags.no_user_site:
            why.append("autoalloc.pth is only in the user site directory, which -s / PYTHONNOUSERSITE switches off")
        if not why:
            why.append("the import watcher is not on sys.meta_path (torch was imported before the hook armed?)")
    info = {"installed": bool(files), "files": files, "live": live, "armed": armed, "decided": decided, "not_live_because": why}
    return info, why, opted_out


def _aborting_value(info: Any, env: Mapping[str, str]) -> str | None:
    """Why ``import torch`` would abort (SIGABRT) here, or None: torch 2.10+ GPU builds scan this at load."""
    if info is None or info.flavour == "cpu" or info.release < (2, 10):
        return None
    for name in (allocconf.CUDA_VAR, allocconf.ALLOC_VAR):
        if name in env:
            if allocconf.aborts_import(env[name]):
                return f"{name}={env[name]!r} makes `import torch` abort on {info.describe()}"
            return None
    return None


def _torch_reports(torch: Any) -> dict[str, Any]:
    """What torch says is in effect (this builds torch's allocator config if nothing did yet)."""
    out: dict[str, Any] = {"getter": None, "snapshot": None, "backend": None, "errors": {}}
    c = getattr(torch, "_C", None)
    getter = getattr(c, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        try:
            out["getter"] = getter()
        except Exception as exc:
            out["errors"]["getter"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    gpu_build = getattr(torch.version, "cuda", None) is not None or getattr(torch.version, "hip", None) is not None
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
                out["snapshot"] = {k: v for k, v in settings.items() if not isinstance(v, (list, dict))}
            except Exception as exc:
                text = str(exc).splitlines()[0] if str(exc) else ""
                out["errors"]["snapshot"] = f"{type(exc).__name__}: {text}"
    return out


def _reported(key: str, reports: Mapping[str, Any], env_value: str | None) -> tuple[str | None, str]:
    """torch's value for ``key`` as allocator text, and where it came from."""
    snapshot = reports.get("snapshot")
    if snapshot and key in _SNAPSHOT_KEYS and _SNAPSHOT_KEYS[key][0] in snapshot:
        name, kind = _SNAPSHOT_KEYS[key]
        raw = snapshot[name]
        if kind == "bool":
            return ("True" if raw else "False"), "snapshot"
        if kind == "mib":
            return (None if raw is None or raw < 0 else str(raw // (1 << 20))), "snapshot"
        return str(raw), "snapshot"
    text, source = (reports["getter"], "getter") if reports.get("getter") is not None else (env_value, "environment")
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


def _decision_dict(decision: Decision) -> dict[str, Any]:
    return {
        "entry_point": decision.entry.describe(),
        "action": decision.action,
        "rule": decision.rule,
        "layer_file": decision.rule_source,
        "reason": decision.reason,
        "trigger": decision.trigger,
        "requested": dict(decision.requested),
        "writes": dict(decision.writes),
        "unsets": list(decision.unsets),
        "via": decision.via or None,
        "read_var": decision.read_var,
        "value": decision.value,
        "warnings": list(decision.warnings),
        "notes": list(decision.notes),
    }


def _matching_job(state: Any, env: Mapping[str, str], torch_info: Any) -> dict[str, Any] | None:
    """What a job matching an apply rule would be told here (this process's policy and environment)."""
    from autoalloc import entrypoint, sources
    from autoalloc.decide import resolve
    from autoalloc.policy import Rule, Source

    entry = state.entry or entrypoint.EntryPoint("unknown")
    policy = state.policy or sources.load(entry, env, entrypoint.current_cwd())
    if not policy.enabled.value:
        return None
    probe = Rule("<a matching rule>", Source("doctor", "-"))
    job_env = {k: v for k, v in env.items() if k != APPLIED_VAR}
    d = resolve(policy, probe, entry, job_env, torch_info)
    return {
        "reads": d.read_var,
        "value": d.value,
        "warnings": [w.replace("rule <a matching rule>", "the rule") for w in d.warnings],
        "notes": [n for n in d.notes if n not in platform_notes(torch_info, sys.platform)[0]],
    }


def status() -> Status:
    """Import torch (the hook decides then, if it has not) and report what torch uses; see the module doc."""
    from autoalloc import hook, torchinfo

    armed = _watcher_armed()
    problems: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    fatal = None if "torch" in sys.modules else _aborting_value(torchinfo.locate(), os.environ)
    torch: Any = None
    if fatal:
        problems.append(f"{fatal}: not importing torch (it would abort this process too)")
    else:
        try:
            import torch
        except Exception as exc:
            problems.append(f"torch cannot be imported here: {type(exc).__name__}: {exc}")

    state = hook.STATE
    decision: Decision | None = state.decision
    env = dict(os.environ)
    hook_dict, not_live, opted_out = hook_info(decision is not None, armed or _watcher_armed())

    info = state.torch
    if info is None and torch is None:
        info = torchinfo.locate()
    if info is None and torch is not None:
        info = torchinfo.from_package_dir(os.path.dirname(torch.__file__)) or torchinfo.TorchInfo(
            torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None), os.path.dirname(torch.__file__)
        )
    torch_dict = None if info is None else {"version": info.version, "flavour": info.flavour, "path": info.path}
    read_var = allocconf.effective_var(env, info)
    environment = {
        "variables": {name: env.get(name) for name in ALL_VARS},
        "read_order": list(allocconf.read_order(info)),
        "torch_reads": read_var,
        APPLIED_VAR: env.get(APPLIED_VAR),
    }

    # The intent: what autoalloc applied here, or what a parent of this job applied.
    intent: dict[str, str] = {}
    applied = parse_applied(env.get(APPLIED_VAR))
    current = env.get(read_var, "") if read_var else ""
    inherited = None
    own = decision is not None and applied is not None and decision.writes.get(APPLIED_VAR) == env.get(APPLIED_VAR)
    if applied is not None and not own:
        intact = applied[1] == current
        inherited = {"rule": applied[0], "value": applied[1], "torch_reads": read_var, "current": current, "intact": intact}
    if decision is not None:
        if decision.action in ("apply", "inherited"):
            intent = decision.applied()
            if decision.action == "apply" and not intent and decision.requested:
                intent = dict(decision.requested)  # not applied (an unparseable value): not in effect
        warnings = list(decision.warnings)
        if own:
            notes.append(f"child processes inherit what this process applied ({APPLIED_VAR}) and stay silent")
        if decision.action != "inherited" and inherited is not None and not inherited["intact"]:
            problems.append(
                f"a parent process applied rule {applied[0]} ({applied[1]!r}), but {read_var or 'the variable'} "
                f"is now {current!r}: changed after autoalloc set it"
            )
            if decision.action in ("none", "skip"):
                intent = {}
    elif inherited is not None and not opted_out:
        try:
            intent = dict(allocconf.parse(applied[1]))
        except allocconf.ConfError:
            intent = {}
        if not inherited["intact"]:
            problems.append(f"{APPLIED_VAR} says rule {applied[0]} applied {applied[1]!r}, but {read_var} is {current!r}")
    if not hook_dict["live"]:
        if opted_out:
            notes.append("autoalloc is switched off here: " + "; ".join(not_live))
        else:
            problems.append("autoalloc's hook is not live in this interpreter: " + "; ".join(not_live))

    reports = _torch_reports(torch) if torch is not None else {"getter": None, "snapshot": None, "backend": None, "errors": {}}
    reports["imported"] = torch is not None
    in_effect: dict[str, dict[str, Any]] = {}
    for key, want in intent.items():
        got, source = _reported(key, reports, current if read_var else None)
        in_effect[key] = {"intended": want, "reported": got, "reported_by": source, "ok": _same(key, want, got)}
        if not in_effect[key]["ok"]:
            problems.append(f"autoalloc meant {key}:{want}, but torch reports {key}:{got} ({source})")
    backend = reports.get("backend")
    if intent.get("expandable_segments") == "True" and backend in ("pluggable", *allocconf.ASYNC_BACKENDS):
        in_effect["expandable_segments"]["ok"] = False
        problems.append(f"torch's allocator backend is {backend}: expandable segments have no effect")
    if info is not None:
        notes += platform_notes(info, sys.platform)[0]
        if info.release < (2, 3) and info.flavour != "cpu":
            notes.append(f"{info.describe()} cannot report its allocator settings: shown from the environment")

    matching_job = None
    if decision is None or decision.action not in ("apply", "inherited"):
        try:
            matching_job = _matching_job(state, env, info)
        except Exception as exc:  # reporting must not fail on a strange policy
            notes.append(f"cannot work out what a matching job would get: {exc!r}")

    not_working = not hook_dict["live"] and not opted_out
    ok = torch is not None and not not_working and all(v["ok"] for v in in_effect.values())
    ok = ok and not (inherited is not None and not inherited["intact"])
    summary = _summary(ok, decision, intent, in_effect, hook_dict, opted_out, read_var, current)
    if torch is None:
        summary = "torch was not imported: " + (problems[0] if problems else "unknown")
    return Status(
        ok=ok,
        summary=summary,
        python={
            "executable": sys.executable,
            "version": sys.version.split()[0],
            "flags": {"no_site": bool(sys.flags.no_site), "isolated": bool(sys.flags.isolated),
                      "no_user_site": bool(sys.flags.no_user_site)},
            "frozen": bool(getattr(sys, "frozen", False)),
        },
        autoalloc={"version": __version__, "path": os.path.dirname(os.path.abspath(__file__))},
        torch=torch_dict,
        hook=hook_dict,
        environment=environment,
        decision=None if decision is None else _decision_dict(decision),
        inherited=inherited,
        matching_job=matching_job,
        torch_reports=reports,
        in_effect=in_effect,
        problems=problems,
        warnings=warnings,
        notes=notes,
    )


def _summary(
    ok: bool, decision: Decision | None, intent: Mapping[str, str], in_effect: Mapping[str, Any],
    hook: Mapping[str, Any], opted_out: bool, read_var: str | None, current: str,
) -> str:
    options = ",".join(f"{k}:{v}" for k, v in intent.items())
    if not hook["live"]:
        return "autoalloc is switched off here" if opted_out else "autoalloc's hook is not live in this interpreter"
    if not intent:
        what = decision.action if decision is not None else "nothing"
        return f"nothing to verify: {what} ({decision.reason})" if decision is not None and decision.reason else (
            f"nothing to verify: {what}"
        )
    if ok:
        return f"in effect: torch uses {options}"
    missing = [(k, v) for k, v in in_effect.items() if not v["ok"]]
    if not missing:
        return "NOT in effect: see the problems below"
    meant = ",".join(f"{k}:{v['intended']}" for k, v in missing)
    got = ",".join(f"{k}:{v['reported']}" for k, v in missing)
    return f"NOT in effect: autoalloc meant {meant}; torch reports {got} ({missing[0][1]['reported_by']})"


def render(status: Status) -> str:
    """The text form of a status."""
    s = status
    lines = [f"autoalloc {s.autoalloc.get('version', '')}: {'OK' if s.ok else 'PROBLEM'}: {s.summary}"]
    lines.append(f"python:       {s.python['version']} ({s.python['executable']})")
    t = s.torch
    imported = "" if s.torch_reports.get("imported", True) else "  (not imported)"
    lines.append(f"torch:        {t['version']} ({t['flavour']}) at {t['path']}{imported}" if t else "torch:        not found")
    h = s.hook
    installed = ", ".join(h["files"]) if h["files"] else "no"
    lines.append(f"hook:         installed: {installed}; live here: {'yes' if h['live'] else 'no'}")
    for why in h["not_live_because"]:
        lines.append(f"              ({why})")
    env = s.environment
    for name, value in env["variables"].items():
        mark = "  <- torch reads this" if name == env["torch_reads"] else ""
        lines.append(f"{name + ':':<26}{'(unset)' if value is None else repr(value)}{mark}")
    d = s.decision
    if d is None:
        lines.append("decision:     none recorded in this process")
    else:
        rule = f" rule {d['rule']} from {d['layer_file']}" if d["rule"] else ""
        lines.append(f"decision:     {d['action']}{rule} for {d['entry_point']}")
        if d["reason"]:
            lines.append(f"because:      {d['reason']}")
        if d["action"] == "apply":
            lines.append(f"applied:      {d['read_var']}={d['value']!r}" + (" (runtime setter)" if d["via"] == "setter" else ""))
    if s.inherited is not None:
        i = s.inherited
        state = "still what torch reads" if i["intact"] else f"but {i['torch_reads']} is now {i['current']!r}"
        lines.append(f"inherited:    rule {i['rule']} applied {i['value']!r} in a parent process ({state})")
    r = s.torch_reports
    if r["getter"] is not None:
        lines.append(f"torch getter: {r['getter']!r}")
    if r["snapshot"] is not None:
        lines.append(f"torch parsed: expandable_segments={r['snapshot'].get('expandable_segments')}")
    if r["backend"] is not None:
        lines.append(f"backend:      {r['backend']}")
    for what, error in r["errors"].items():
        lines.append(f"torch {what} failed: {error}")
    for key, v in s.in_effect.items():
        mark = "ok" if v["ok"] else "NOT IN EFFECT"
        lines.append(f"  {key}: meant {v['intended']}, torch reports {v['reported']} ({v['reported_by']})  {mark}")
    for problem in s.problems:
        lines.append(f"problem:      {problem}")
    for warning in s.warnings:
        lines.append(f"warning:      {warning}")
    for note in s.notes:
        lines.append(f"note:         {note}")
    if s.matching_job is not None and (s.matching_job["warnings"] or s.matching_job["notes"]):
        lines.append("a job matching a rule here would be told:")
        for warning in s.matching_job["warnings"]:
            lines.append(f"  warning: {warning}")
        for note in s.matching_job["notes"]:
            lines.append(f"  note:    {note}")
    return "\n".join(lines)
