"""``autoalloc explain``: what autoalloc would do for a command, without running it.

Builds the same Policy and Decision the hook would, for a command line given as a list
(``["python", "train.py", ...]``, ``["train.py", ...]`` or ``["my-console-script", ...]``),
and turns them into a plain dict (for ``--json``) or text.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autoalloc import entrypoint, evidence, scan, selfimports, torchinfo, wrappers
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import first_match, pending_triggers, watches_training
from autoalloc.modulesets import MODULE_LISTS
from autoalloc.plan import Plan, plan
from autoalloc.policy import LayerConfig, Policy, Rule, Source, compose

_RULE_LISTS = ("scripts", "modules", "commands", "argv", *MODULE_LISTS)


def interpreter_argv(command: Sequence[str]) -> list[str]:
    """The full interpreter command line that running ``command`` would give the Python process."""
    if not command:
        return []
    first = command[0]
    if re.match(wrappers.PYTHON_NAME, os.path.basename(first)) or first == sys.executable:
        return list(command)
    if first.endswith((".py", ".pyw")) or os.path.isdir(first):
        return [sys.executable, *command]
    found = first if os.sep in first else shutil.which(first)
    return [sys.executable, found or first, *command[1:]]


def _rule_dict(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": rule.name,
        "action": rule.action,
        "layer": rule.source.layer,
        "file": rule.source.path,
    }
    if rule.description:
        out["description"] = rule.description
    for key in _RULE_LISTS:
        if getattr(rule, key):
            out[key] = list(getattr(rule, key))
    if rule.training:
        out["training"] = True
    if rule.allocator:
        out["allocator"] = dict(rule.allocator)
    return out


def _switched_on(policy: Policy, rule: Rule) -> dict[str, str]:
    """``enabled_by`` for a rule that is off until enabled and a layer enabled it."""
    why = policy.switched_on.get(rule.name) if not rule.enabled else None
    return {"enabled_by": why.removeprefix("enabled by ")} if why else {}


def policy_dict(policy: Policy | None) -> dict[str, Any]:
    """Layers, effective settings with provenance, and rules in match order (empty: not read)."""
    if policy is None:
        return {
            "layers": [],
            "enabled": None,
            "on_conflict": None,
            "on_setter": None,
            "adaptive": None,
            "allocator": {},
            "rules": [],
            "inactive_rules": {},
        }

    def origin(valued: Any) -> str:
        return valued.source.describe() if valued.source else "default"

    return {
        "layers": [
            {
                "layer": s.layer,
                "path": s.path,
                "status": s.status,
                **({"message": s.message} if s.message else {}),
            }
            for s in policy.layers
        ],
        "enabled": {"value": policy.enabled.value, "from": origin(policy.enabled)},
        "on_conflict": {"value": policy.on_conflict.value, "from": origin(policy.on_conflict)},
        "on_setter": {"value": policy.on_setter.value, "from": origin(policy.on_setter)},
        "adaptive": {"value": policy.adaptive.value, "from": origin(policy.adaptive)},
        "allocator": {
            k: {"value": v.value, "from": origin(v)} for k, v in policy.allocator.items()
        },
        "rules": [_rule_dict(r) | _switched_on(policy, r) for r in policy.rules],
        "inactive_rules": dict(policy.dropped),
    }


def explain(
    command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    imported: Iterable[str] = (),
    trains: bool = False,
) -> dict[str, Any]:
    """What autoalloc would decide for ``command`` (or for the working directory when None).

    ``imported``: modules to count as imported by that run (``--import``), as if the
    program had imported them before torch or later (import triggers). ``trains``: as once
    the program has built its optimizer (``--trains``: ``training = true`` rules; the
    options then go through the runtime setter).
    """
    env = dict(os.environ if env is None else env)
    cwd = cwd if cwd is not None else entrypoint.current_cwd()
    argv = interpreter_argv(command or [])
    entry = entrypoint.parse(argv, cwd) if argv else EntryPoint("unknown")
    torch = torchinfo.locate()
    result = plan(
        entry, env, cwd, torch, imported, python=sys.executable, late=trains, trains=trains
    )
    shown = result.decided_for
    report: dict[str, Any] = {
        "command": list(command or []),
        "imported": sorted(set(imported)),
        "trains": trains,
        "entry_point": _entry_dict(shown),
        "torch": None
        if torch is None
        else {
            "version": torch.version,
            "flavour": torch.flavour,
            "path": torch.path,
        },
        **policy_dict(result.policy),
        "decision": result.decision.as_dict(),
    }
    program = result.program
    if program is not None and program.steps:
        report["wrappers"] = wrappers.as_dict(program)
    launcher = program.launcher() if program is not None else None
    if launcher is not None:
        report["launcher"] = {
            "kind": launcher.entry.kind,
            "target": launcher.entry.target,
            "worker_argv": list(result.workers) if result.workers else None,
        }
    if result.policy is not None:
        report["never_triggers"] = [
            text for rule in result.policy.rules for text in selfimports.messages(rule)
        ]
    if result.decision.action == "none" and result.policy is not None:
        pending = pending_triggers(result.policy.rules, result.imported)
        dead = set(selfimports.never_triggers(pending))  # warned about above, never watched
        report["import_triggers"] = sorted(pending - dead)
        if not trains and watches_training(result.policy.rules):
            report["training_rules"] = list(
                dict.fromkeys(r.name for r in result.policy.rules if r.training)
            )
        report["late"] = late_outlook(result, env, list(command or []))
    prediction = predict(result, env, cwd) if command and not (imported or trains) else None
    if prediction is not None:
        report["prediction"] = prediction
    return report


def predict(result: Plan, env: Mapping[str, str], cwd: str | None) -> dict[str, Any] | None:
    """What a script's own source says it will get at run time (``scan``), for a script that
    nothing decides at ``import torch`` and a policy with ``training`` rules; or that the
    script does not exist. None: nothing to predict."""
    entry, cwd = result.decided_for, cwd or os.getcwd()
    if entry.kind not in ("script", "module") or result.policy is None:
        return None
    path = entry.path if entry.kind == "script" else _module_file(entry.target, cwd)
    if entry.kind == "script" and not os.path.isfile(path):
        return {"outcome": "missing", "text": f"no such script: {path} (below: what a "
                "script at that path would get)"}
    if path is None or result.decision.action != "none":
        return None
    if not watches_training(result.policy.rules):
        return None
    found = scan.scan(path, entry.args, cwd, evidence.installed_dirs())
    out: dict[str, Any] = {
        "evidence": found.names, "optimizer": found.optimizer, "unknown": list(found.unknown),
        "files": len(found.files), "configs": list(found.configs), "complete": found.complete,
    }
    after = result.after_training(env, found.imported(), late=True)
    rule = after.decision.rule if after.decision.action == "apply" else None
    return out | _outcome(result, env, found, rule)


def _module_file(module: str, cwd: str) -> str | None:
    """The file ``python -m module`` runs, when it is the program's own (under ``cwd``)."""
    base = os.path.join(cwd, *module.split("."))
    for path in (os.path.join(base, "__main__.py"), base + ".py"):
        if os.path.isfile(path):
            return path
    return None


def _outcome(
    result: Plan, env: Mapping[str, str], found: scan.Scan, rule: str | None
) -> dict[str, Any]:
    """The prediction's outcome and its one-line text."""
    unknown = "; ".join(found.unknown[:2])
    if rule is not None:
        why = _why(result.policy, rule, found)
        if found.optimizer is None:
            text = (f"depends on whether it builds an optimizer: none found in its source "
                    f"({rule} would apply: {why})")
            return {"outcome": "depends", "rule": rule, "text": text}
        text = f"apply at its first optimizer ({rule}: {why}; builds {found.optimizer})"
        return {"outcome": "apply", "rule": rule, "text": text}
    other = _would_enable(result, env, found)
    if other is not None:
        kind = "trains other audio " if other == "audio-training" else ""
        text = f'stays off: {kind}({other} would take it: enable = ["{other}"])'
        return {"outcome": "off", "rule": None, "would_enable": other, "text": text}
    if unknown:
        return {"outcome": "depends", "rule": None,
                "text": f"depends on what it imports at run time: {unknown}"}
    if found.optimizer is None:
        return {"outcome": "off", "rule": None, "text": "stays off: builds no optimizer"}
    return {"outcome": "off", "rule": None, "text": "stays off: it imports nothing a training "
            f"rule counts (builds {found.optimizer})"}


def _why(policy: Policy | None, name: str, found: scan.Scan) -> str:
    """``imports soundfile at own.py:1 and jiwer at own.py:3``: the names that made the rule."""
    rule = next(r for r in (policy.rules if policy else ()) if r.name == name)
    imported = found.imported()
    shown = []
    for names in (getattr(rule, key) for key, kind in MODULE_LISTS.items() if kind.counts):
        hit = next((n for n in names if n in imported), None)
        if hit is not None and hit not in shown:
            shown.append(hit)
    return "imports " + " and ".join(f"{n} at {_where(n, found)}" for n in shown)


def _where(name: str, found: scan.Scan) -> str:
    if name in found.names:
        return found.names[name]
    return next(w for n, w in found.names.items() if n.startswith(name + "."))


def _would_enable(result: Plan, env: Mapping[str, str], found: scan.Scan) -> str | None:
    """An off-until-enabled rule that would take the program once enabled."""
    policy = result.policy
    if policy is None:
        return None
    for key, why in policy.dropped.items():
        name = key.partition("@")[0]
        if not why.startswith("off until enabled"):
            continue
        extra = LayerConfig(Source("user", "<explain>"), enable=(name,))
        enabled = compose([*policy.configs, extra])
        match = first_match(enabled.rules, result.decided_for, found.imported(), trains=True)
        if match.rule is not None and match.rule.name == name and match.rule.training:
            return name
    return None


def late_outlook(result: Plan, env: Mapping[str, str], command: list[str]) -> list[dict[str, Any]]:
    """For a program nothing decided at ``import torch``: each apply rule that can still decide
    later (once it imports a trigger, or builds its optimizer having imported one), what the
    program would then get, and the ``explain`` form that checks it. Empty: nothing can."""
    out: list[dict[str, Any]] = []
    for rule in result.policy.rules if result.policy is not None else ():
        if rule.action != "apply" or not (rule.imports or rule.training):
            continue
        if any(item["rule"] == rule.name for item in out):
            continue  # one line per rule name (a rule given in parts)
        # a module autoalloc imports itself can never decide an import rule: not named
        lists = {key: [name for name in getattr(rule, key)
                       if rule.training or not selfimports.never_triggers([name])]
                 for key in MODULE_LISTS}
        trigger = lists["imports"][0] if lists["imports"] else None
        imported = [v[0] for k, v in lists.items() if v and MODULE_LISTS[k].counts]
        if result.trains or not rule.training:
            if trigger is None:
                continue
            after = result.after_import(trigger, env, imported, late=True)
        else:
            after = result.after_training(env, imported, late=True)
        if after.decision.action != "apply" or after.decision.rule != rule.name:
            continue  # an earlier rule decides, or its checkout markers keep it out
        flags = [*(x for name in imported for x in ("--import", name))]
        flags += ["--trains"] * rule.training
        out.append(
            {
                "rule": rule.name,
                "trains": rule.training,
                **lists,
                "value": after.decision.value,
                "check": shlex.join(["autoalloc", "explain", *flags, "--", *command]),
            }
        )
    return out


def _entry_dict(entry: EntryPoint) -> dict[str, Any]:
    return {
        "kind": entry.kind,
        "target": entry.target,
        "args": list(entry.args),
        **({"path": entry.path, "realpath": entry.realpath} if entry.path else {}),
    }


def _value(text: str | None) -> str:
    return "(unset)" if text is None else repr(text)


def render(report: Mapping[str, Any], verbose: bool = False) -> str:
    """The text form of an ``explain`` report: the decision first (what will happen, from
    which rule and file), then what it was made from: the program, the layers, the rules
    (active built-in ones that cannot decide this command on one line unless ``verbose``)."""
    lines = [*_render_decision(report), *_render_program(report), *_render_policy(report)]
    return "\n".join([*lines, *_render_rules(report, verbose)])


def _render_rules(report: Mapping[str, Any], verbose: bool) -> list[str]:
    if report["enabled"] is None:
        return []
    decided = report["decision"].get("rule")
    watched = set(report.get("import_triggers", ()))
    training = set(report.get("training_rules", ()))
    lines = ["rules, in match order (> decides):"]
    hidden = 0
    for rule in report["rules"]:
        deciding = rule["name"] == decided
        # a rule whose import or optimizer condition is still watched can yet decide
        watching = watched & set(rule.get("imports", ())) or rule["name"] in training
        can_decide = deciding or rule["layer"] != "builtin" or watching
        if not (verbose or can_decide):
            hidden += 1
            continue
        note = f"  (enabled by {rule['enabled_by']})" if "enabled_by" in rule else ""
        mark = ">" if deciding else " "
        head = f"{mark} {rule['action']:<5} {rule['name']:<24} [{rule['layer']}]"
        lines.append(f"{head}  {rule.get('description', '')}{note}".rstrip())
    for name, why in report["inactive_rules"].items():  # few, and worth knowing: always shown
        lines.append(f"  off   {name:<24} {why}")
    if hidden:
        lines.append(
            f"  ({hidden} more built-in rule{'' if hidden == 1 else 's'} that cannot decide "
            "this command: autoalloc explain --verbose lists them)"
        )
    return lines


def _render_program(report: Mapping[str, Any]) -> list[str]:
    ep = report["entry_point"]
    target = f" {ep['target']}" if ep["target"] else ""
    args = f"  args: {' '.join(ep['args'])}" if ep["args"] else ""
    lines = [f"entry point:  {ep['kind']}{target}{args}"]
    if "launcher" in report:
        lines.append(f"              (as seen by the workers of {report['launcher']['target']})")
    elif report.get("wrappers"):
        names = " -> ".join(w["name"] for w in report["wrappers"])
        lines.append(f"              (as run by {names})")
    if report.get("imported"):
        lines.append(
            f"imported:     {', '.join(report['imported'])} (as if the program imported them)"
        )
    if report.get("trains"):
        lines.append("trains:       yes (as once the program has built its optimizer)")
    t = report["torch"]
    found = f"{t['version']} ({t['flavour']}) at {t['path']}" if t else "not found on sys.path"
    lines.append(f"torch:        {found}")
    return lines


def _render_policy(report: Mapping[str, Any]) -> list[str]:
    if report["enabled"] is None:
        return ["policy layers: not read"]
    lines = ["policy layers (lowest first):"]
    for layer in report["layers"]:
        message = f"  ({layer['message']})" if layer.get("message") else ""
        lines.append(f"  {layer['layer']:<8} {layer['status']:<9} {layer['path'] or '-'}{message}")
    lines.append(f"enabled:      {report['enabled']['value']}  [{report['enabled']['from']}]")
    conflict = report["on_conflict"]
    lines.append(f"on_conflict:  {conflict['value']}  [{conflict['from']}]")
    setter = report["on_setter"]
    lines.append(f"on_setter:    {setter['value']}  [{setter['from']}]")
    lines.append(f"adaptive:     {report['adaptive']['value']}  [{report['adaptive']['from']}]")
    options = ", ".join(f"{k}:{v['value']} [{v['from']}]" for k, v in report["allocator"].items())
    lines.append(f"allocator:    {options}")
    return lines


def _render_late(late: Sequence[Mapping[str, Any]]) -> list[str]:
    """A program decided late: what it will get and on what that depends, first line first."""
    first = late[0]
    kinds = {item["trains"] for item in late}
    when = {
        frozenset({True}): "once it trains (builds an optimizer) after importing",
        frozenset({False}): "once it imports",
    }.get(frozenset(kinds), "once it imports (or trains after importing)")
    names = " or ".join(item["rule"] for item in late)
    lines = [f"decision:     late: none now, {first['value']!r} {when} what {names} names:"]
    for item in late:
        need = "trains after importing" if item["trains"] else "imports"
        lines.append(f"  {item['rule']}: {need} one of {_names(item['imports'])}")
        lines += [f"    {kind.shown} {_names(item[key])}"
                  for key, kind in MODULE_LISTS.items() if kind.requires and item[key]]
        if item["value"] != first["value"]:
            lines.append(f"    gets {item['value']!r}")
    widest = max(late, key=lambda item: len(item["imports"]))  # the most general rule
    lines.append(f"check:        {widest['check']}")
    return lines


def _names(names: Sequence[str], shown: int = 6) -> str:
    more = f" and {len(names) - shown} more (--json lists them)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _render_decision(report: Mapping[str, Any]) -> list[str]:
    prediction = report.get("prediction")
    first = [f"prediction:   {prediction['text']}"] if prediction else []
    return first + _render_today(report)


def _render_today(report: Mapping[str, Any]) -> list[str]:
    d = report["decision"]
    if d["action"] == "disabled" and not d["rule"]:
        lines = [f"decision:     disabled ({d['reason']})"]
    elif d["action"] == "none" and report.get("late"):
        lines = _render_late(report["late"])
        if report.get("prediction"):  # the prediction read the script: no generic example
            lines = [line for line in lines if not line.startswith("check:")]
    else:
        rule = f"  rule {d['rule']} from {d['rule_source']}" if d["rule"] else ""
        lines = [f"decision:     {d['action']}{rule}"]
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
        watched = ", ".join(report["import_triggers"])
        lines.append(f"watching:     {watched} (an import of one of these can still decide)")
    if report.get("training_rules") and not report.get("late"):
        names = ", ".join(report["training_rules"])
        lines.append(f"on training:  {names} (can still decide once the program trains)")
    lines += [f"warning:      {warning}" for warning in d["warnings"]]
    lines += [f"warning:      {never}" for never in report.get("never_triggers", ())]
    lines += [f"note:         {note}" for note in d["notes"]]
    return lines
