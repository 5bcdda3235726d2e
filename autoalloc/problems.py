"""What can be wrong with a policy: ``PolicyError`` and ``Problem``.

A leaf of its own so that the decision, which takes validated layers from the layer cache,
names them without importing the validator (``schema``, imported when a file is parsed).
"""

from __future__ import annotations

from autoalloc.records import record


class PolicyError(ValueError):
    """A policy file, or a part of it, that cannot be used; the message names the key."""


@record(frozen=True)
class Problem:
    """One mistake: what is wrong (naming the key) and what it costs."""

    text: str
    cost: str

    def sentence(self) -> str:
        end = "" if self.text.endswith(("?", ".")) else "."
        return f"{self.text}{end} {self.cost}"
