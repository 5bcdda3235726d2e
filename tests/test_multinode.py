"""A job on several nodes, on one machine: each node decides on its own; the nodes must agree.

Two ``torchrun`` launcher processes (two agents, one c10d rendezvous on 127.0.0.1, ``gloo``)
stand for ``torchrun --nnodes 2 --nproc_per_node 2`` on two nodes, and four ``srun``-style
processes with ``SLURM_PROCID``/``SLURM_NODEID`` for a SLURM job on two nodes. Every rank
reads back the same settings from torch itself and the job prints each warning once (global
rank 0). With a node-local user policy that differs (node 1 skips the trainer), the ranks
cannot all agree: the reports every rank wrote (``AUTOALLOC_REPORT``) make ``autoalloc
report`` name the ranks that differ, in one line. Real interpreters, real torch; full run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from tests.helpers import ES, NEMO, PY, Sandbox, autoalloc_warnings, probe_result

pytestmark = pytest.mark.slow

MERGED = f"max_split_size_mb:256,{ES}"
WORKER = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
seen = [None] * dist.get_world_size()
dist.all_gather_object(seen, {
    "rank": dist.get_rank(),
    "node": os.environ.get("GROUP_RANK"),
    "getter": torch._C._accelerator_getAllocatorSettings(),
    "applied": os.environ.get("AUTOALLOC_APPLIED"),
})
if dist.get_rank() == 0:
    print("RANKS " + json.dumps(seen), flush=True)
dist.destroy_process_group()
"""
SKIP_ON_NODE_1 = """\
[[rules]]
name = "node-local-skip"
scripts = ["**/train.py", "**/speech_to_text_ctc_bpe.py"]
action = "skip"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(sandbox: Sandbox, node: int, skip_on_node_1: bool) -> dict[str, str]:
    """A node's environment: its own HOME and user config (node-local, as on a cluster)."""
    home = sandbox.root / f"node{node}"
    config = home / ".config"
    (config / "autoalloc").mkdir(parents=True, exist_ok=True)
    if skip_on_node_1 and node == 1:
        (config / "autoalloc" / "config.toml").write_text(SKIP_ON_NODE_1)
    return {
        **sandbox.env,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(config),
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256",  # merged, with one warning per job
        "AUTOALLOC_REPORT": str(sandbox.root / "reports") + os.sep,  # a shared file system
        "OMP_NUM_THREADS": "1",
    }


def report_table(sandbox: Sandbox) -> str:
    shown = sandbox.run(["-m", "autoalloc", "report", str(sandbox.root / "reports")])
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def run_torchrun_nodes(
    sandbox: Sandbox, skip_on_node_1: bool, node_1: dict[str, str] | None = None
) -> list[tuple[int, str, str]]:
    """Both nodes' launchers, to the end; ``node_1``: what node 1's environment has of its own."""
    sandbox.write("wenet/wenet/bin/train.py", WORKER)
    port = free_port()
    nodes = []
    for node in (0, 1):
        args = [
            PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
            "--rdzv_id", "multinode-test", "--rdzv_conf", f"is_host={int(node == 0)}",
            "wenet/bin/train.py", "--config", "conf/train_conformer.yaml",
        ]  # fmt: skip
        nodes.append(
            subprocess.Popen(
                args,
                cwd=sandbox.work / "wenet",
                env={**node_env(sandbox, node, skip_on_node_1), **((node_1 or {}) if node else {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    for process in nodes:
        stdout, stderr = process.communicate(timeout=600)
        out.append((process.returncode, stdout, stderr))
    return out


def test_torchrun_two_nodes_agree_and_warn_once(sandbox: Sandbox) -> None:
    results = run_torchrun_nodes(sandbox, skip_on_node_1=False)
    for code, _, stderr in results:
        assert code == 0, stderr
    (line,) = [x for _, out, _ in results for x in out.splitlines() if x.startswith("RANKS ")]
    ranks = json.loads(line.split(" ", 1)[1])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["node"] for r in ranks} == {"0", "1"}  # two agents, two nodes
    for rank in ranks:
        assert (rank["getter"], rank["applied"]) == (MERGED, f"wenet-train;{MERGED}"), rank
    warnings = [w for _, _, err in results for w in autoalloc_warnings(err)]
    assert len(warnings) == 1 and "max_split_size_mb" in warnings[0]  # one for the job
    assert "ranks differ" not in report_table(sandbox)


def test_torchrun_two_nodes_with_differing_policies_name_the_ranks_once(
    sandbox: Sandbox,
) -> None:
    results = run_torchrun_nodes(sandbox, skip_on_node_1=True)
    for code, _, stderr in results:
        assert code == 0, stderr
    (line,) = [x for _, out, _ in results for x in out.splitlines() if x.startswith("RANKS ")]
    by_node = {r["node"]: r["getter"] for r in json.loads(line.split(" ", 1)[1])}
    assert by_node == {"0": MERGED, "1": "max_split_size_mb:256"}  # node 1 skipped
    warnings = [w for _, _, err in results for w in autoalloc_warnings(err)]
    assert len(warnings) <= 1  # rank 0's node speaks; node 1's ranks stay silent
    differ = [x for x in report_table(sandbox).splitlines() if x.startswith("ranks differ")]
    assert len(differ) == 1, differ
    assert (
        "rank 2 (" in differ[0]
        and "3 (" in differ[0]
        and "skip (rule node-local-skip)" in differ[0]
    )


def test_torchrun_a_node_whose_own_environment_departs_says_so_once(sandbox: Sandbox) -> None:
    # node 1's own environment keeps expandable segments off: its agent's warning goes to its
    # workers, where no worker holds global rank 0; the node's first worker says it, once
    off = "expandable_segments:False"
    results = run_torchrun_nodes(sandbox, False, {"PYTORCH_CUDA_ALLOC_CONF": off})
    for code, _, stderr in results:
        assert code == 0, stderr
    (line,) = [x for _, out, _ in results for x in out.splitlines() if x.startswith("RANKS ")]
    by_node = {r["node"]: r["getter"] for r in json.loads(line.split(" ", 1)[1])}
    assert by_node == {"0": MERGED, "1": off}
    node0, node1 = (autoalloc_warnings(err) for _, _, err in results)
    assert len(node0) == 1 and "max_split_size_mb" in node0[0]  # global rank 0: node 0's own
    assert len(node1) == 1, node1  # rank 2 (local rank 0 of node 1), not rank 3
    assert "on node 1 (" in node1[0] and f"sets {off}, rule wenet-train wants" in node1[0]


def srun_tasks(sandbox: Sandbox, skip_on_node_1: bool) -> list[subprocess.CompletedProcess[str]]:
    """``srun -N 2 -n 4 python train.py``: every task started on its own, SLURM_* set."""
    script = sandbox.script(NEMO)
    tasks = []
    for rank in range(4):
        node = rank // 2
        env = {
            **node_env(sandbox, node, skip_on_node_1),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank % 2),
            "SLURM_NODEID": str(node),
            "SLURM_NTASKS": "4",
            "SLURM_NNODES": "2",
            "SLURM_JOB_ID": "4242",
        }
        tasks.append(sandbox.run([str(script)], env=env))
    return tasks


def test_slurm_two_nodes_agree_and_warn_once(sandbox: Sandbox) -> None:
    tasks = srun_tasks(sandbox, skip_on_node_1=False)
    for task in tasks:
        assert task.returncode == 0, task.stderr
        probe = probe_result(task.stdout)
        assert (probe["getter"], probe["applied"]) == (MERGED, f"nemo-asr-train;{MERGED}")
    assert [len(autoalloc_warnings(t.stderr)) for t in tasks] == [1, 0, 0, 0]
    assert "ranks differ" not in report_table(sandbox)


def test_slurm_two_nodes_with_differing_policies_name_the_ranks_once(sandbox: Sandbox) -> None:
    tasks = srun_tasks(sandbox, skip_on_node_1=True)
    getters = [probe_result(t.stdout)["getter"] for t in tasks]
    assert getters == [MERGED, MERGED, "max_split_size_mb:256", "max_split_size_mb:256"]
    assert [len(autoalloc_warnings(t.stderr)) for t in tasks] == [1, 0, 0, 0]
    differ = [x for x in report_table(sandbox).splitlines() if x.startswith("ranks differ")]
    assert len(differ) == 1, differ
    assert "rank 2 (" in differ[0] and "3 (" in differ[0]
