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

from autoalloc import entrypoint, scan, selfimports, torchinfo, wrappers
from autoalloc.decide import layer_warnings
from autoalloc.entrypoint import EntryPoint
from autoalloc.match import first_match, pending_triggers, watches_training
from autoalloc.modulesets import MODULE_LISTS
from autoalloc.plan import Plan, library_names, plan, shown
from autoalloc.policy import LayerConfig, Policy, Rule, Source, compose
from autoalloc.records import replace

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
        report["policy_problems"] = layer_warnings(result.policy)
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
    """What a script's own source says it will get, and when: before torch starts (the plan
    decided from it), at its first optimizer, or never; or that the script does not exist.
    For a script or own ``-m`` module that no command-line rule decides, under a policy with
    ``training`` rules. None: nothing to predict."""
    entry = result.decided_for
    if entry.kind not in ("script", "module") or result.policy is None:
        return None
    if entry.kind == "script" and not os.path.isfile(entry.path):
        return {"outcome": "missing", "text": f"no such script: {entry.path} (below: what a "
                "script at that path would get)"}
    found = result.source
    if found is None:
        return None
    out: dict[str, Any] = {
        "evidence": found.names, "optimizer": found.optimizer, "unknown": list(found.unknown),
        "files": len(found.files), "configs": list(found.configs), "complete": found.complete,
        "unread": list(found.unread),
    }
    if result.decision.action == "apply":  # the plan decided from the source
        rule = result.decision.rule
        text = f"apply before torch starts ({rule}: {_reason(result.decision.reason)})"
        return out | {"outcome": "apply", "when": "before torch starts", "rule": rule,
                      "text": text}
    after = result.after_training(env, _source_names(result, found), late=True)
    rule = after.decision.rule if after.decision.action == "apply" else None
    outcome = _outcome(result, env, found, rule)
    if found.unread and outcome["outcome"] != "apply" and found.script in found.files:
        outcome["text"] += f"; not read: {_unread(found.unread)}"
    return out | outcome


def _source_names(result: Plan, found: scan.Scan) -> frozenset[str]:
    return found.imported(library_names(result.policy.rules if result.policy else ()))


def _reason(reason: str) -> str:
    return reason.partition(": ")[2] or reason


def _unread(unread: Sequence[str]) -> str:
    more = f" and {len(unread) - 2} more" if len(unread) > 2 else ""
    return ", ".join(os.path.basename(u) for u in unread[:2]) + more


def _outcome(
    result: Plan, env: Mapping[str, str], found: scan.Scan, rule: str | None
) -> dict[str, Any]:
    """The prediction's outcome, when, and its one-line text."""
    policy = result.policy
    if found.script not in found.files:
        why = next((u.rpartition(" (")[2] for u in found.unread), ")")
        return {"outcome": "depends", "when": None, "rule": None,
                "text": f"depends on what its source does: it could not be read ({why}"}
    if rule is not None:
        why = shown(next(r for r in policy.rules if r.name == rule), found) if policy else ""
        depends = {"outcome": "depends", "when": None, "rule": rule}
        if found.optimizer is None:
            return depends | {"text": "depends on whether it builds an optimizer: none found in "
                                      f"its source ({rule} would apply: {why})"}
        if not found.builds_here:  # an evaluation script may import what trains, and not call it
            return depends | {"text": "depends on whether it calls what builds an optimizer: "
                                      f"not the script, a module it imports ({rule} would "
                                      f"apply at its first optimizer: {why})"}
        text = f"apply at its first optimizer ({rule}: {why})"
        return {"outcome": "apply", "when": "at its first optimizer", "rule": rule, "text": text}
    off = {"outcome": "off", "when": None, "rule": None}
    other = _would_enable(result, found)
    missing = _no_speech_signal(result, found) if found.optimizer else None
    if other is not None:
        name, how = other
        if name == "audio-training" and missing is not None:
            how = f'{missing}; if it is other audio work: enable = ["{name}"]'
        return off | {"would_enable": name, "text": f"stays off: {how}"}
    if found.unknown:
        unknown = "; ".join(found.unknown[:2])
        return {"outcome": "depends", "when": None, "rule": None,
                "text": f"depends on what it imports at run time: {unknown}"}
    if found.optimizer is None:
        return off | {"text": "stays off: builds no optimizer"}
    if missing is not None:
        return off | {"text": f"stays off: {missing}"}
    return off | {"text": "stays off: it imports nothing a training rule counts "
                          f"(builds {found.optimizer})"}


def _would_enable(result: Plan, found: scan.Scan) -> tuple[str, str] | None:
    """A rule that is off (until enabled, or switched off by a layer) and would take the
    program if it were on: its name, and the first line's words for it."""
    policy = result.policy
    if policy is None:
        return None
    dropped = sorted(policy.dropped.items(), key=lambda item: "disabled by " not in item[1])
    for key, why in dropped:  # what a layer switched off first: it is the reason
        name = key.partition("@")[0]
        if why.startswith("off until enabled"):
            extra = LayerConfig(Source("user", "<explain>"), enable=(name,))
            configs = [*policy.configs, extra]
        elif why.startswith("disabled by "):
            configs = [replace(c, disable=tuple(n for n in c.disable if n != name))
                       for c in policy.configs]  # fmt: skip
        else:
            continue
        match = first_match(compose(configs).rules, result.decided_for,
                            _source_names(result, found), trains=True)
        if match.rule is None or match.rule.name != name or not match.rule.training:
            continue
        if why.startswith("disabled by "):
            where = why.removeprefix("disabled by ")
            return name, f'{name} would take it, but {where} switches it off (disable = ["{name}"])'
        kind = "trains other audio " if name == "audio-training" else ""
        return name, f'{kind}({name} would take it: enable = ["{name}"])'
    return None


def _no_speech_signal(result: Plan, found: scan.Scan) -> str | None:
    """For a program that trains with an audio stack of its own but shows nothing of the text
    side: the signal that is missing, and the rule that opts it in."""
    policy = result.policy
    rule = next((r for r in policy.rules if r.name == "speech-training"), None) if policy else None
    imported = _source_names(result, found)
    audio = next((n for n in rule.imports if n in imported), None) if rule else None
    if audio is None or any(n in imported for n in rule.not_imports):  # other audio work
        return None
    script = os.path.basename(found.script)
    return (f"it trains with audio ({audio} at {found.where(audio)}) but shows no "
            "speech-to-text signal (a CTC or RNN-T loss, a WER/CER metric, a tokenizer or text "
            "model); if it is speech-to-text, opt it in with two lines in autoalloc.toml: "
            f'[[rules]] / scripts = ["{script}"]')


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
    """A broken policy first (what follows is decided without its broken parts), then the
    prediction, then today's decision."""
    broken = [f"broken:       {text.removeprefix('autoalloc: ')}"
              for text in report.get("policy_problems", ())]
    prediction = report.get("prediction")
    first = [f"prediction:   {prediction['text']}"] if prediction else []
    return broken + first + _render_today(report)


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
    said = set(report.get("policy_problems", ()))  # on the first line already
    lines += [f"warning:      {warning}" for warning in d["warnings"] if warning not in said]
    lines += [f"warning:      {never}" for never in report.get("never_triggers", ())]
    lines += [f"note:         {note}" for note in d["notes"]]
    return lines
