"""The A/B plot: step time and reserved memory per step, one line per arm (needs matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoalloc.ab.table import GIB, primary

STYLES = ("-", "--", ":", "-.")


def plot(result: Mapping[str, Any], path: str, title: str) -> str | None:
    """Write the PNG; its path, or None when matplotlib is not installed (``autoalloc[bench]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return None
    fig, (ax_time, ax_mem) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for index, (arm, runs) in enumerate(result["runs_by_arm"].items()):
        color = f"C{index}"
        for number, run in enumerate(runs):
            report = primary(run["reports"])
            if report is None:
                continue
            _lines(
                ax_time, ax_mem, report, color, STYLES[number % len(STYLES)], f"{arm} #{number + 1}"
            )
    warmup = result["plan"]["warmup"]
    for ax in (ax_time, ax_mem):
        ax.axvspan(0.5, warmup + 0.5, color="0.92", zorder=0)
        ax.grid(alpha=0.3)
    ax_time.set_ylabel("step time (ms)")
    ax_time.legend(fontsize=8, ncol=4)
    ax_time.set_title(title)
    ax_mem.set_ylabel("reserved at step end (GiB)")
    ax_mem.set_xlabel("optimizer step (shaded: warm-up)")
    if not ax_mem.lines:
        ax_mem.text(
            0.5,
            0.5,
            "no CUDA memory statistics (the runs did not use CUDA)",
            ha="center",
            va="center",
            transform=ax_mem.transAxes,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _lines(
    ax_time: Any, ax_mem: Any, report: Mapping[str, Any], color: str, style: str, label: str
) -> None:
    ends = report.get("step_ends_s") or []
    times = [1000 * (ends[i] - ends[i - 1]) for i in range(1, len(ends))]
    line = {"color": color, "label": label, "linewidth": 1}
    ax_time.plot(list(range(2, len(ends) + 1)), times, style, **line)
    cuda = report.get("cuda_steps") or []
    if cuda:
        ax_mem.plot([s["step"] for s in cuda], [s["reserved"] / GIB for s in cuda], style, **line)
