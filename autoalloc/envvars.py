"""The environment variables autoalloc reads or writes, and the rank of this process.

A leaf: it imports only ``os``, and every part of the package (decision, application,
measurement, tools) takes these names from here. The start-up module (``_startup``) keeps its
own copies of the few it reads, because it must import nothing of the package;
``tests/test_layout.py`` checks that both agree.
"""

from __future__ import annotations

import os
from typing import Literal

# Switches and inputs
DISABLE_VAR = "AUTOALLOC_DISABLE"  # switch autoalloc off for this process and its children
DEBUG_VAR = "AUTOALLOC_DEBUG"  # trace each decision to stderr
CONFIG_VAR = "AUTOALLOC_CONFIG"  # the highest policy layer: a file named by the user
TRUSTED_DIRS_VAR = "AUTOALLOC_TRUSTED_DIRS"  # project files below these are used whoever owns them

# What a process tells its children
APPLIED_VAR = "AUTOALLOC_APPLIED"  # "rule;value" autoalloc applied: children know it as theirs
ORIGINAL_VAR = "AUTOALLOC_ORIGINAL"  # JSON: the allocator variables before autoalloc wrote them
WARNED_VAR = "AUTOALLOC_WARNED"  # digests of the warnings this job has already given
DEFERRED_VAR = "AUTOALLOC_DEFERRED"  # JSON: warnings a multi-node agent leaves to global rank 0

# Measurement (`autoalloc report`, `autoalloc ab`)
REPORT_VAR = "AUTOALLOC_REPORT"  # write a report of the optimizer steps at exit (file, dir, -)
WARMUP_VAR = "AUTOALLOC_REPORT_WARMUP"  # steps the report's figures leave out
STOP_VAR = "AUTOALLOC_AB_STOP_AFTER"  # end the run after this many optimizer steps
PROGRESS_VAR = "AUTOALLOC_AB_PROGRESS"  # a file rank 0 writes its step count to

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

Flag = Literal["on", "off", "unclear"]

# Global rank of a process that a job launcher started (torchrun, srun, mpirun, MPICH/Hydra),
# first one set wins; LOCAL_RANK and WORLD_SIZE complete what a report records.
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
# The node of a job on several nodes and a process's rank on it, as pairs: torchrun's (its
# agent sets them for its workers), then SLURM's, first pair set wins.
NODE_VARS = (("GROUP_RANK", "LOCAL_RANK"), ("SLURM_NODEID", "SLURM_LOCALID"))
REPORTED_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                      "PMI_RANK")


def truthy(value: str | None) -> bool:
    """Whether an environment flag such as ``AUTOALLOC_DISABLE`` is switched on."""
    return value is not None and value.strip().lower() in _TRUE


def flag(value: str | None) -> Flag:
    """An on/off environment variable read as the user wrote it: ``on`` for 1, true, yes, on;
    ``off`` for 0, false, no, off, the empty string or unset (any case, spaces around
    ignored); ``unclear`` for anything else."""
    if value is None:
        return "off"
    word = value.strip().lower()
    return "on" if word in _TRUE else "off" if word in _FALSE else "unclear"


def disable_problem(value: str | None) -> str | None:
    """The warning for an ``AUTOALLOC_DISABLE`` value that is neither true nor false (None:
    it is one of them). Such a value disables autoalloc too: whoever set the variable meant
    to switch it off, most likely."""
    if flag(value) != "unclear":
        return None
    shown = repr(value if len(value or "") <= 40 else f"{value[:40]}...")
    return (
        f"autoalloc: {DISABLE_VAR}={shown} is neither true (1, true, yes, on) nor false "
        f"(0, false, no, off, empty): autoalloc is disabled, as for {DISABLE_VAR}=1 "
        f"(write {DISABLE_VAR}=1 to say so, or {DISABLE_VAR}=0 to keep autoalloc on)."
    )


def global_rank(ranks: dict[str, int] | None = None) -> int | None:
    """This process's global rank in a distributed job, from the first rank variable set.

    ``ranks``: the integer rank variables as ``rank_vars()`` returns them (a report's record);
    by default the environment is read. None outside a distributed job, or for a value
    that is not a number.
    """
    if ranks is not None:
        return next((ranks[name] for name in RANK_VARS if name in ranks), None)
    for name in RANK_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            return int(value) if value.isdigit() else None
    return None


def node_speaker() -> int | None:
    """The node this process speaks for: its number where the process is the first of its
    node (local rank 0) on a node other than the job's first (which holds global rank 0);
    None elsewhere, or for a value that is not a number."""
    for node_var, local_var in NODE_VARS:
        node = os.environ.get(node_var, "").strip()
        if node:
            local = os.environ.get(local_var, "").strip()
            if node.isdigit() and int(node) and local.isdigit() and not int(local):
                return int(node)
            return None
    return None


def rank_vars() -> dict[str, int]:
    """The torch.distributed / SLURM / MPI rank variables of this process, as integers."""
    out = {}
    for name in REPORTED_RANK_VARS:
        try:
            out[name] = int(os.environ[name])
        except (KeyError, ValueError):
            pass
    return out
