"""The chart two scaling reports share: requests/s and p95 against the user count, one line per series."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_rps_and_p95"]


def plot_rps_and_p95(series: dict[str, list[dict[str, Any]]], path: Path, title: str) -> bool:
    """Draw ``series`` (label: steps with ``users``, ``rps`` and ``p95_ms``) to ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, steps in series.items():
        steps = sorted(steps, key=lambda s: s["users"])
        users = [s["users"] for s in steps]
        left.plot(users, [s["rps"] for s in steps], marker="o", label=label)
        right.plot(users, [s["p95_ms"] for s in steps], marker="o", label=label)
    left.set(xlabel="users (closed loop)", ylabel="requests/s", title=f"Throughput, {title}")
    right.set(xlabel="users (closed loop)", ylabel="p95 ms", title="p95 latency")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
