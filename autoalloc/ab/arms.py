"""The two arms of ``autoalloc ab``: the environment each run of the user's command gets.

**on**: the options the policy's deciding rule applies for the command, the way the user's
job gets them: autoalloc's hook applies them in the run, at ``import torch`` (in the
environment) or, for a program decided later (at its first optimizer, at an import
trigger), then, through torch's runtime setter. When no rule applies them, the policy's
``[allocator]`` defaults, written into the allocator variable by ``ab`` itself.
**off**: autoalloc disabled and ``expandable_segments:False`` merged into the variable torch
reads. Everything else of the user's environment is passed on unchanged. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoalloc import allocconf
from autoalloc.envvars import DISABLE_VAR

ES = "expandable_segments"


@dataclass(frozen=True)
class Arm:
    """One arm: its command, the environment changes (None: remove), what it intends and how."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str | None] = field(default_factory=dict)
    intent: bool | None = None  # expandable_segments the arm's processes should report
    how: str = ""
    hooked: bool = False  # autoalloc's hook applies the options in the run (as in the job)
    late: bool = False  # ... after torch has started: at the first optimizer, at a trigger

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        out = dict(base)
        for name, value in self.env.items():
            if value is None:
                out.pop(name, None)
            else:
                out[name] = value
        return out


def merged(env: Mapping[str, str], var: str, options: Mapping[str, str]) -> tuple[str, str]:
    """``options`` merged over ``var``'s value (ours win); the value, and a note if unparseable."""
    existing = env.get(var, "")
    try:
        pairs = allocconf.parse(existing)
    except allocconf.ConfError as exc:
        why = f"{var}={existing!r} is not parseable ({exc}): replaced"
        return allocconf.serialize(dict(options)), why
    value, _ = allocconf.merge(pairs, options, override=True)
    return allocconf.serialize(value), ""


def ab_arms(
    command: Sequence[str],
    explained: Mapping[str, Any],
    env: Mapping[str, str],
    later: Mapping[str, Any] | None = None,
) -> list[Arm]:
    """The on and off arms for ``command``, from the ``explain`` report of it; ``later``: the
    ``explain`` report of it once it has imported what its source imports and built its
    optimizer (``--import ... --trains``), for a program nothing decides at ``import torch``.
    """
    decision = explained["decision"]
    var = decision.get("read_var") or allocconf.CUDA_VAR
    cmd = tuple(command)
    if decision["action"] == "apply":
        options = dict(decision["requested"])
        on = Arm(
            name="on",
            command=cmd,
            env={DISABLE_VAR: None},
            intent=_intent(options),
            how=f"autoalloc's hook applies rule {decision['rule']} ({decision['rule_source']}) "
            "at `import torch`, in the environment: " + allocconf.serialize(options),
            hooked=True,
        )
    elif later is not None and later["decision"]["action"] == "apply":
        on = late_arm(cmd, later)
    else:
        options = {k: str(v["value"]) for k, v in explained["allocator"].items()}
        froms = {str(v["from"]) for v in explained["allocator"].values()}
        origins = sorted({"autoalloc's built-in default" if f == "default" else f for f in froms})
        why = decision.get("reason") or decision["action"]
        value, note = merged(env, var, options)
        on = Arm(
            name="on",
            command=cmd,
            env={DISABLE_VAR: "1", var: value},
            intent=_intent(options),
            how=f"no rule applies options to this command ({why}"
            + (", nor later from what its source imports" if later is not None else "")
            + f"): the policy's [allocator] defaults ({', '.join(origins)}), set by ab in "
            f"{var}={value}" + (f"; {note}" if note else ""),
        )
    off_value, note = merged(env, var, {ES: "False"})
    off = Arm(
        name="off",
        command=cmd,
        env={DISABLE_VAR: "1", var: off_value},
        intent=False,
        how=f"{DISABLE_VAR}=1 and {var}={off_value}" + (f"; {note}" if note else ""),
    )
    return [on, off]


def late_arm(command: tuple[str, ...], later: Mapping[str, Any]) -> Arm:
    """The on arm of a program a rule decides after torch has started: autoalloc's hook with
    the user's policy, nothing forced, so the options reach torch as in the job."""
    decision = later["decision"]
    training = any(
        r.get("training") for r in later.get("rules", ()) if r.get("name") == decision["rule"]
    )
    if training:
        when = "at its first optimizer, through the runtime setter"
    else:
        when = (
            f"once it imports {decision.get('trigger') or 'its trigger'} (through the runtime "
            "setter when torch has started)"
        )
    return Arm(
        name="on",
        command=command,
        env={DISABLE_VAR: None},
        intent=_intent(dict(decision["requested"])),
        how=f"rule {decision['rule']} ({decision['rule_source']}) applies {when}, as in your "
        f"job (predicted from what its source imports; each run's report says what happened): "
        f"{decision.get('value') or allocconf.serialize(dict(decision['requested']))}",
        hooked=True,
        late=True,
    )


def _intent(options: Mapping[str, str]) -> bool | None:
    value = options.get(ES)
    return None if value is None else str(value) == "True"


def interleave(arms: Sequence[Arm], repeat: int) -> list[tuple[Arm, int]]:
    """The run order: every arm once per repeat, alternating (on, off, on, off ...)."""
    return [(arm, r) for r in range(1, repeat + 1) for arm in arms]
