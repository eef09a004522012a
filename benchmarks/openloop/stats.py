"""Percentiles of a step's latencies where a request that failed (an error or a timeout) counts as slower than any
answer: a p99 that lands on a failure is infinite, never the p99 of the answers alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile", "summary"]


def percentile(ordered: Sequence[float], failed: int, q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of ``ordered`` (sorted answers) and ``failed`` infinite values.

    NaN when there is nothing at all."""
    n = len(ordered) + failed
    if n == 0:
        return math.nan
    rank = max(1, math.ceil(q * n))  # 1-based
    return ordered[rank - 1] if rank <= len(ordered) else math.inf


def summary(latencies: list[float], failed: int, prefix: str = "") -> dict[str, float]:
    """p50, p90, p99, p99.9, max and mean in ms of ``latencies`` (seconds), ``failed`` counted as infinite."""
    ordered = sorted(latencies)
    out = {
        f"{prefix}{name}_ms": percentile(ordered, failed, q) * 1000
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))
    }
    out[f"{prefix}max_ms"] = (math.inf if failed else ordered[-1] * 1000) if (ordered or failed) else math.nan
    out[f"{prefix}mean_ms"] = sum(ordered) / len(ordered) * 1000 if ordered else math.nan
    return out
