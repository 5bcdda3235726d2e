"""The one decision pipeline: every step the hook takes before it writes, in one function.

``plan()`` is called by the hook (at ``import torch``), by ``autoalloc explain`` (for a
command line) and by ``autoalloc doctor`` (for its own process, and for "what would a
job matching a rule get here"). They differ only in what they do with the ``Plan``: the
hook carries out its decision, ``explain`` shows it, ``doctor`` compares it with what
torch reports. Where no rule decides, the program's own source (``scan``) may show that it
trains: then it is decided before torch starts (``_early``). Pure apart from reading the
policy files and the program's source.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from autoalloc import messages, scan, sources, wrappers
from autoalloc.allocconf import InEffect
from autoalloc.decide import Decision, decide, disabled, layer_warnings, resolve
from autoalloc.entrypoint import EntryPoint
from autoalloc.envvars import DISABLE_VAR, disable_problem, flag
from autoalloc.match import first_match, training_names, watches_training
from autoalloc.policy import Policy, Rule
from autoalloc.records import record, replace
from autoalloc.torchinfo import TorchInfo


@record(frozen=True)
class Plan:
    """What autoalloc decided for one process, and what it decided from."""

    entry: EntryPoint  # the process's own entry point
    decided_for: EntryPoint  # the program decided for: the one inside any wrappers, or entry
    # (its text decoded as UTF-8 where the interpreter could not)
    workers: tuple[str, ...] | None  # the launcher's worker command line, when it is one
    torch: TorchInfo | None
    policy: Policy | None  # None: the layers were not read (AUTOALLOC_DISABLE)
    decision: Decision
    imported: frozenset[str]  # the modules the decision counted as imported
    program: wrappers.Unwrapped | None = None  # the wrappers taken off (outermost first)
    trains: bool = False  # the decision counted the process as having built an optimizer
    source: scan.Scan | None = None  # the program's own source, where it was read

    def after_import(
        self, name: str, env: Mapping[str, str], imported: Iterable[str], late: bool,
        now: InEffect | None = None,
    ) -> Plan:
        """The plan once module ``name`` has been imported (a policy import trigger).

        The layers are not read again: the process decides from the policy it started with.
        ``now``: what torch uses, when torch is loaded (the options go under it).
        """
        if self.policy is None:
            return self
        seen = frozenset({*self.imported, *imported, name})
        decision = decide(self.policy, self.decided_for, env, self.torch, seen, late=late,
                          trains=self.trains, now=now)
        return replace(self, decision=decision, imported=seen)

    def after_training(
        self, env: Mapping[str, str], imported: Iterable[str], late: bool,
        now: InEffect | None = None,
    ) -> Plan:
        """The plan once the process has built its first optimizer (``training = true`` rules).

        ``imported`` replaces what the plan counted so far: what a training rule names counts
        only with evidence of use, which the names seen at ``import torch`` lack.
        """
        if self.policy is None:
            return self
        seen = frozenset({*imported, "torch"})
        decision = decide(self.policy, self.decided_for, env, self.torch, seen, late=late,
                          trains=True, now=now)
        return replace(self, decision=decision, imported=seen, trains=True)


def utf8_entry(entry: EntryPoint) -> EntryPoint:
    """``entry`` with surrogate-escaped text decoded as UTF-8 where it is valid UTF-8.

    Under a C locale without UTF-8 mode (``LC_ALL=C python -X utf8=0``) the interpreter
    decodes ``trainé.py`` as ``train\\udcc3\\udca9.py``; the policy's patterns are Unicode,
    so the same script must match them the same way it does under a UTF-8 locale.
    """

    def fix(text: str) -> str:
        try:
            return os.fsencode(text).decode("utf-8") if not text.isascii() else text
        except (UnicodeError, ValueError):
            return text

    return replace(
        entry,
        target=fix(entry.target),
        args=tuple(fix(a) for a in entry.args),
        path=fix(entry.path),
        realpath=fix(entry.realpath),
    )


def _load_program(
    entry: EntryPoint, env: Mapping[str, str], cwd: str | None, argv: Sequence[object] | None
) -> tuple[Policy, wrappers.Unwrapped]:
    """The program a command runs once its wrappers are taken off, and the policy for it.

    The wrappers come from the layers found for the command as started; when the program
    searches for its project file elsewhere (a script in another directory), the layers
    are read again for it, so a profiled run reads what the real run reads.
    """
    policy = sources.load(entry, env, cwd)
    program = wrappers.unwrap(entry, policy.wrappers, cwd, argv)
    start = sources.project_start
    if program.steps and start(program.entry, cwd) != start(entry, cwd):
        policy = sources.load(program.entry, env, cwd)
    return policy, program


def plan(
    entry: EntryPoint,
    env: Mapping[str, str],
    cwd: str | None,
    torch: TorchInfo | None,
    imported: Iterable[str] = (),
    *,
    python: str | None = None,
    argv: Sequence[object] | None = None,
    late: bool = False,
    platform: str = sys.platform,
    rule: str | None = None,
    trains: bool = False,
) -> Plan:
    """Decide for a process that runs ``entry`` in ``env`` and ``cwd`` and imports torch.

    ``imported``: the modules the program has imported (torch always counts: the decision
    is made at its import). ``late``: torch is loaded already, so options go through the
    runtime setter. ``argv``: the process's ``sys.argv`` at the decision (for
    ``runpy.run_path``; None for a command line not started). ``rule``: decide as if the
    rule of that name matched (``doctor``'s "what would a matching job get").
    ``trains``: as once the program has built its optimizer.
    """
    seen = frozenset({*imported, "torch"})
    # 1. The program to decide for: the one inside profilers, debuggers and launchers (a
    #    launcher decides for its workers, so that every rank inherits one decision and at
    #    most one warning), with 3. the policy layers that govern it.
    # Any value but a false one disables (AUTOALLOC_DISABLE=2 too, with a warning): the
    # start-up module arms the watcher for such a value, so that the warning comes here.
    disabled_here = flag(env.get(DISABLE_VAR)) != "off"
    if disabled_here:
        table = sources.builtin_wrappers() if sources.may_wrap(entry) else ()
        policy, program = None, wrappers.unwrap(entry, table, cwd, argv)
    else:
        policy, program = _load_program(entry, env, cwd, argv)
    if program.steps:
        inner = program.describe()
        messages.debug(f"{entry.describe()} runs another program: deciding for {inner}")
    workers = wrappers.worker_argv(program, python or sys.executable or "python")
    matched = utf8_entry(program.entry)  # matched as text; the file system gets the original
    made = {"entry": entry, "decided_for": matched, "torch": torch, "imported": seen,
            "workers": tuple(workers) if workers else None, "program": program}
    # 2. AUTOALLOC_DISABLE: nothing of autoalloc's, not even what a parent process wrote.
    if policy is None:
        decision = disabled(matched, env, torch, f"{DISABLE_VAR} is set")
        unclear = disable_problem(env.get(DISABLE_VAR))
        if unclear is not None:
            decision = replace(decision, warnings=(*decision.warnings, unclear))
        return Plan(**made, policy=None, decision=decision)
    # 4. The decision; 5. where no rule decides, what the program's own source shows.
    source = None
    if rule is None:
        decision = decide(policy, matched, env, torch, seen, late=late, platform=platform,
                          trains=trains)
        if decision.action == "none" and not (late or trains):
            source = read_source(policy, program.entry, cwd)
            early = _early(policy, matched, env, torch, seen, platform, source)
            decision = early or decision
    else:
        decision = _as_if(policy, rule, matched, env, torch, late, platform)
    return Plan(**made, policy=policy, decision=decision, trains=trains, source=source)


def read_source(policy: Policy, entry: EntryPoint, cwd: str | None) -> scan.Scan | None:
    """The program's own source as the ``training`` rules read it (``scan``, remembered across
    processes): a script's, or a ``-m`` module's under the working directory; None where
    there is none, or no rule reads it."""
    if entry.kind not in ("script", "module") or not watches_training(policy.rules):
        return None
    cwd = cwd or os.path.dirname(entry.path)  # a working directory deleted meanwhile
    path = entry.path if entry.kind == "script" else module_file(entry.target, cwd)
    if path is None or not os.path.isfile(path):
        return None
    return scan.cached(path, entry.args, cwd, scan.installed_dirs, training_names(policy.rules))


def module_file(module: str, cwd: str) -> str | None:
    """The file ``python -m module`` runs, when it is the program's own (under ``cwd``)."""
    base = os.path.join(cwd, *module.split("."))
    for path in (os.path.join(base, "__main__.py"), base + ".py"):
        if os.path.isfile(path):
            return path
    return None


def _early(
    policy: Policy, entry: EntryPoint, env: Mapping[str, str], torch: TorchInfo | None,
    seen: frozenset[str], platform: str, found: scan.Scan | None,
) -> Decision | None:
    """The decision before torch starts, where the entry script itself builds an optimizer
    (or runs a trainer) and a ``training`` rule applies to what the source shows: the
    weights and every child get the options, as for a named entry point. What a training
    rule names counts from the source only (what else is loaded is not the program's word)."""
    if found is None or not found.builds_here:
        return None
    imported = (seen - training_names(policy.rules)) | found.imported(library_names(policy.rules))
    match = first_match(policy.rules, entry, imported, trains=True)
    if match.rule is None or match.rule.action != "apply" or not match.rule.training:
        return None
    decision = decide(policy, entry, env, torch, imported, platform=platform, trains=True)
    if decision.action != "apply":
        return None
    return replace(decision, reason=f"its source shows it trains: {shown(match.rule, found)}")


def library_names(rules: Iterable[Rule]) -> frozenset[str]:
    """The ``training`` rules' names that only the built-in policy gives: names of libraries,
    which a module of the program's own of the same name never stands for (an own
    ``tgt.py`` is not the TextGrid library); a name a user's rule gives may be their own."""
    rules = tuple(rules)
    builtin = training_names(r for r in rules if r.source.layer == "builtin")
    return builtin - training_names(r for r in rules if r.source.layer != "builtin")


def shown(rule: Rule, found: scan.Scan) -> str:
    """``imports soundfile at own.py:1; uses torch.nn.CTCLoss at own.py:9; builds
    torch.optim.AdamW at own.py:20``: what made a training rule take the program."""
    from autoalloc.modulesets import MODULE_LISTS

    imported, said = found.imported(), []
    for names in (getattr(rule, key) for key, kind in MODULE_LISTS.items() if kind.counts):
        hit = next((n for n in names if n in imported), None)
        if hit is not None and hit not in said:
            said.append(hit)
    groups = [[n for n in said if (n in found.uses) is uses] for uses in (False, True)]
    parts = [f"{verb} " + " and ".join(f"{n} at {found.where(n)}" for n in names)
             for verb, names in zip(("imports", "uses"), groups) if names]
    if found.optimizer:
        parts.append(f"builds {found.optimizer}")
    return "; ".join(parts) or "what it builds"


def _as_if(
    policy: Policy,
    name: str,
    entry: EntryPoint,
    env: Mapping[str, str],
    torch: TorchInfo | None,
    late: bool,
    platform: str,
) -> Decision:
    """The decision if the ``apply`` rule ``name`` matched ``entry``."""
    found = next((r for r in policy.rules if r.name == name and r.action == "apply"), None)
    if found is None:
        raise LookupError(f"no active apply rule named {name!r}")
    if not policy.enabled.value:
        return decide(policy, entry, env, torch, late=late, platform=platform)
    decision = resolve(policy, found, entry, env, torch, late, platform)
    warnings = (*layer_warnings(policy), *decision.warnings)
    return replace(decision, reason=f"as if rule {name} matched", warnings=warnings)


def first_apply_rule(policy: Policy | None) -> str | None:
    """The name of the first ``apply`` rule in match order (``doctor``'s example job)."""
    if policy is None:
        return None
    return next((r.name for r in policy.rules if r.action == "apply"), None)
