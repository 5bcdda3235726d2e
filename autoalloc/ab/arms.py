"""The two arms of ``autoalloc ab``: the environment each run of the user's command gets.

**on**: the options the policy's deciding rule applies for the command (autoalloc's hook
applies them in the run, as it would in the user's job); when no rule applies them, the
policy's ``[allocator]`` defaults, written into the allocator variable by ``ab`` itself.
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
        return allocconf.serialize(
            dict(options)
        ), f"{var}={existing!r} is not parseable ({exc}): replaced"
    value, _ = allocconf.merge(pairs, options, override=True)
    return allocconf.serialize(value), ""


def ab_arms(
    command: Sequence[str], explained: Mapping[str, Any], env: Mapping[str, str]
) -> list[Arm]:
    """The on and off arms for ``command``, from the ``explain`` report of it."""
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
            how=f"autoalloc's hook applies rule {decision['rule']} ({decision['rule_source']}): "
            + allocconf.serialize(options),
        )
    else:
        options = {k: str(v["value"]) for k, v in explained["allocator"].items()}
        origins = sorted({_origin(str(v["from"])) for v in explained["allocator"].values()})
        why = decision.get("reason") or decision["action"]
        value, note = merged(env, var, options)
        on = Arm(
            name="on",
            command=cmd,
            env={DISABLE_VAR: "1", var: value},
            intent=_intent(options),
            how=f"no rule applies options to this command ({why}): the policy's [allocator] "
            f"defaults ({', '.join(origins)}), set by ab in {var}={value}"
            + (f"; {note}" if note else ""),
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


def _origin(where: str) -> str:
    return "autoalloc's built-in default" if where == "default" else where


def _intent(options: Mapping[str, str]) -> bool | None:
    value = options.get(ES)
    return None if value is None else str(value) == "True"


def interleave(arms: Sequence[Arm], repeat: int) -> list[tuple[Arm, int]]:
    """The run order: every arm once per repeat, alternating (on, off, on, off ...)."""
    return [(arm, r) for r in range(1, repeat + 1) for arm in arms]
