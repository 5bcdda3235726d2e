"""``autoalloc explain``: what autoalloc would do for a command, without running it.

Builds the same Policy and Decision the hook would, for a command line given as a list
(``["python", "train.py", ...]``, ``["train.py", ...]`` or ``["my-console-script", ...]``),
and turns them into a plain dict (for ``--json``) or text.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from autoalloc import entrypoint, sources, torchinfo
from autoalloc.decide import Decision, decide
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import pending_triggers
from autoalloc.policy import Policy, Rule

_PYTHON_RE = re.compile(r"python[0-9.]*(\.exe)?\Z")


def interpreter_argv(command: Sequence[str]) -> list[str]:
    """The full interpreter command line that running ``command`` would give the Python process."""
    if not command:
        return []
    first = command[0]
    if _PYTHON_RE.match(os.path.basename(first)) or first == sys.executable:
        return list(command)
    if first.endswith((".py", ".pyw")) or os.path.isdir(first):
        return [sys.executable, *command]
    found = first if os.sep in first else shutil.which(first)
    return [sys.executable, found or first, *command[1:]]


def _rule_dict(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {"name": rule.name, "action": rule.action, "layer": rule.source.layer, "file": rule.source.path}
    if rule.description:
        out["description"] = rule.description
    for key in ("scripts", "modules", "commands", "imports", "argv"):
        if getattr(rule, key):
            out[key] = list(getattr(rule, key))
    if rule.allocator:
        out["allocator"] = dict(rule.allocator)
    return out


def decision_dict(decision: Decision) -> dict[str, Any]:
    """A Decision as plain data."""
    return {
        "action": decision.action,
        "rule": decision.rule,
        "rule_source": decision.rule_source,
        "reason": decision.reason,
        "trigger": decision.trigger,
        "requested": dict(decision.requested),
        "env_before": dict(decision.env_before),
        "writes": dict(decision.writes),
        "unsets": list(decision.unsets),
        "setter_value": decision.setter_value,
        "read_var": decision.read_var,
        "value": decision.value,
        "warnings": list(decision.warnings),
        "notes": list(decision.notes),
    }


def policy_dict(policy: Policy) -> dict[str, Any]:
    """Layers, effective settings with provenance, and rules in match order."""

    def origin(valued: Any) -> str:
        return valued.source.describe() if valued.source else "default"

    return {
        "layers": [
            {"layer": s.layer, "path": s.path, "status": s.status, **({"message": s.message} if s.message else {})}
            for s in policy.layers
        ],
        "enabled": {"value": policy.enabled.value, "from": origin(policy.enabled)},
        "on_conflict": {"value": policy.on_conflict.value, "from": origin(policy.on_conflict)},
        "allocator": {k: {"value": v.value, "from": origin(v)} for k, v in policy.allocator.items()},
        "rules": [_rule_dict(r) for r in policy.rules],
        "inactive_rules": dict(policy.dropped),
    }


def explain(command: Sequence[str] | None = None, env: Mapping[str, str] | None = None, cwd: str | None = None) -> dict[str, Any]:
    """What autoalloc would decide for ``command`` (or for the working directory when None)."""
    env = dict(os.environ if env is None else env)
    cwd = cwd if cwd is not None else entrypoint.current_cwd()
    argv = interpreter_argv(command or [])
    entry = entrypoint.parse(argv, cwd) if argv else EntryPoint("unknown")
    shown, workers = entrypoint.decided_for(entry, sys.executable, cwd)
    torch = torchinfo.locate()
    policy = sources.load(shown, env, cwd)
    decision = decide(policy, shown, env, torch, ())
    result: dict[str, Any] = {
        "command": list(command or []),
        "entry_point": {
            "kind": shown.kind,
            "target": shown.target,
            "args": list(shown.args),
            **({"path": shown.path, "realpath": shown.realpath} if shown.path else {}),
        },
        "torch": None if torch is None else {"version": torch.version, "flavour": torch.flavour, "path": torch.path},
        **policy_dict(policy),
        "decision": decision_dict(decision),
    }
    if workers:
        result["launcher"] = {"kind": entry.kind, "target": entry.target, "worker_argv": workers}
    if decision.action == "none":
        result["import_triggers"] = sorted(pending_triggers(policy.rules, ()))
    return result


def _value(text: str | None) -> str:
    return "(unset)" if text is None else repr(text)


def render(report: Mapping[str, Any]) -> str:
    """The text form of an ``explain`` report."""
    lines: list[str] = []
    ep = report["entry_point"]
    target = f" {ep['target']}" if ep["target"] else ""
    lines.append(f"entry point:  {ep['kind']}{target}" + (f"  args: {' '.join(ep['args'])}" if ep["args"] else ""))
    if "launcher" in report:
        lines.append(f"              (as seen by the workers of {report['launcher']['target']})")
    t = report["torch"]
    lines.append(f"torch:        {t['version']} ({t['flavour']}) at {t['path']}" if t else "torch:        not found on sys.path")
    lines.append("policy layers (lowest first):")
    for layer in report["layers"]:
        message = f"  ({layer['message']})" if layer.get("message") else ""
        lines.append(f"  {layer['layer']:<8} {layer['status']:<9} {layer['path'] or '-'}{message}")
    lines.append(f"enabled:      {report['enabled']['value']}  [{report['enabled']['from']}]")
    lines.append(f"on_conflict:  {report['on_conflict']['value']}  [{report['on_conflict']['from']}]")
    options = ", ".join(f"{k}:{v['value']} [{v['from']}]" for k, v in report["allocator"].items())
    lines.append(f"allocator:    {options}")
    lines.append("rules, in match order:")
    for rule in report["rules"]:
        lines.append(f"  {rule['action']:<5} {rule['name']:<24} [{rule['layer']}]  {rule.get('description', '')}".rstrip())
    for name, why in report["inactive_rules"].items():
        lines.append(f"  off   {name:<24} {why}")
    d = report["decision"]
    lines.append(f"decision:     {d['action']}" + (f"  rule {d['rule']} from {d['rule_source']}" if d["rule"] else ""))
    if d["reason"]:
        lines.append(f"because:      {d['reason']}")
    if d["writes"] or d["unsets"]:
        lines.append("environment:")
        for name, value in d["writes"].items():
            lines.append(f"  {name}: {_value(d['env_before'].get(name))} -> {value!r}")
        for name in d["unsets"]:
            lines.append(f"  {name}: removed")
    if d["action"] == "apply":
        lines.append(f"torch reads:  {d['read_var']}={_value(d['value'])}")
    if report.get("import_triggers"):
        lines.append("watching:     " + ", ".join(report["import_triggers"]) + " (an import of one of these can still decide)")
    for warning in d["warnings"]:
        lines.append(f"warning:      {warning}")
    for note in d["notes"]:
        lines.append(f"note:         {note}")
    return "\n".join(lines)
