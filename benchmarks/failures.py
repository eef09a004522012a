"""What the failure handling costs (issue 45), counted on the virtual clock: calls and seconds, not wall time.

- **Isolation** (``on_batch_error=Isolate()``): extra calls of ``process_batch`` to find one bad item in a batch of
  ``n``, over every position of it (the bound is ``2·log2(n)``), and for 2 and 4 bad items at random positions.
- **Out-of-memory split** (``split_on=SplitOn(...)``): a model that fits 256 items runs out of memory above 32 for
  a while (a spike), then fits 256 again: the calls split, and the calls it takes the ceiling to come back to 256,
  with the default growth and with ``grow_after=4``.
- **Retries** (``retry=RetryPolicy()``, defaults): the latency an item throttled ``k`` times gains, over 2000 items
  (full jitter: each wait is uniform in ``[0, bound)``).

Run: ``python -m benchmarks.failures``; writes ``reports/failures.md``. Deterministic (a seeded random) and quick.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import platform
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from async_batcher import AsyncBatcher
from async_batcher.failures import Isolate, Retry, RetryPolicy, SplitOn
from async_batcher.testing import run
from benchmarks.provenance import regenerated_by, revision

REPORTS = Path(__file__).resolve().parent.parent / "reports"


class Bad(AsyncBatcher[int, int]):
    def __init__(self, bad: set[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad = bad
        self.calls = 0

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.calls += 1
        if self.bad.intersection(batch):
            raise ValueError("bad item")
        return batch


async def extra_calls(n: int, bad: set[int]) -> int:
    b = Bad(bad, max_batch_size=n, max_queue_time=1.0, on_batch_error=Isolate(max_extra_calls=10 * n))
    await b.process_many(list(range(n)), return_exceptions=True)
    await b.stop()
    return b.calls - 1


async def isolation(rng: random.Random) -> list[str]:
    rows = [
        "| batch size n | 2·log2(n) | one bad item: worst | one bad item: mean | 2 bad items: mean "
        "| 4 bad items: mean |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in (8, 16, 64, 256, 1024):
        positions = range(n) if n <= 256 else rng.sample(range(n), 256)
        one = [await extra_calls(n, {p}) for p in positions]
        two = [await extra_calls(n, set(rng.sample(range(n), 2))) for _ in range(50)]
        four = [await extra_calls(n, set(rng.sample(range(n), 4))) for _ in range(50)]
        rows.append(
            f"| {n} | {2 * math.log2(n):.0f} | {max(one)} | {statistics.mean(one):.1f} | {statistics.mean(two):.1f} | "
            f"{statistics.mean(four):.1f} |"
        )
    return rows


class Model(AsyncBatcher[int, int]):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fits = 256
        self.calls = 0
        self.failed = 0

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.calls += 1
        await asyncio.sleep(0.01)
        if len(batch) > self.fits:
            self.failed += 1
            raise MemoryError(f"{len(batch)} > {self.fits}")
        return batch


async def spike(split: SplitOn) -> tuple[int, int, int, int]:
    """(calls that failed during the spike, calls until the ceiling is back after it, of them failed, calls of the
    whole run)."""
    m = Model(max_batch_size=256, max_queue_time=0.001, split_on=split)
    waves = 0

    async def wave() -> None:
        nonlocal waves
        waves += 1
        await asyncio.gather(*(m.process(x) for x in range(256)))

    await wave()
    m.fits = 32
    for _ in range(4):
        await wave()
    failed_in_spike = m.failed
    m.fits = 256
    before, failed = m.calls, m.failed
    while m.stats.ceilings:
        await wave()
        if waves > 10_000:
            raise RuntimeError("the ceiling never came back")
    recovered = m.calls - before
    total = m.calls
    await m.stop()
    return failed_in_spike, recovered, m.failed - failed, total


async def splits() -> list[str]:
    rows = [
        "| settings | calls that ran out of memory (spike) | calls to lift the ceiling after it | "
        "of them out of memory |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, split in (
        ("SplitOn(MemoryError) (grow_after=8, grow_by=256/16)", SplitOn(MemoryError)),
        ("SplitOn(MemoryError, grow_after=4)", SplitOn(MemoryError, grow_after=4)),
        ("SplitOn(MemoryError, grow_after=8, grow_by=64)", SplitOn(MemoryError, grow_by=64)),
    ):
        failed, recovered, again, _ = await spike(split)
        rows.append(f"| `{label}` | {failed} | {recovered} | {again} |")
    return rows


class Throttled(AsyncBatcher[int, int]):
    def __init__(self, times: dict[int, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.times = times
        self.tries: dict[int, int] = {}

    async def process_batch(self, batch: list[int]) -> list[Any]:
        results: list[Any] = []
        for x in batch:
            self.tries[x] = self.tries.get(x, 0) + 1
            results.append(Retry() if self.tries[x] <= self.times.get(x, 0) else x)
        return results


async def latency(k: int, policy: RetryPolicy) -> list[float]:
    items = 2000
    b = Throttled(dict.fromkeys(range(items), k), retry=policy, max_queue_time=0.0, max_batch_size=64)
    loop = asyncio.get_running_loop()

    async def one(x: int) -> float:
        began = loop.time()
        await b.process(x)
        return loop.time() - began

    waits = await asyncio.gather(*(one(x) for x in range(items)))
    await b.stop()
    return sorted(waits)


async def retries() -> list[str]:
    rows = [
        "| throttled k times | added latency: mean (ms) | p50 (ms) | p99 (ms) | max (ms) "
        "| bound: sum of the k caps (ms) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    policy = RetryPolicy(attempts=5, budget=None)
    for k in (1, 2, 3, 4):
        waits = await latency(k, policy)
        bound = sum(policy.bound(a) for a in range(1, k + 1))
        p = [waits[min(len(waits) - 1, math.ceil(q * len(waits)) - 1)] for q in (0.5, 0.99)]
        rows.append(
            f"| {k} | {1000 * statistics.mean(waits):.1f} | {1000 * p[0]:.1f} | {1000 * p[1]:.1f} | "
            f"{1000 * waits[-1]:.1f} | {1000 * bound:.0f} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m benchmarks.failures", description=__doc__.splitlines()[0]).parse_args(argv)
    random.seed(45)
    rng = random.Random(45)
    logging.disable(logging.WARNING)  # (each bad item's failure is logged: thousands of lines)

    async def all_of_them() -> list[str]:
        return [
            "## Isolation: extra calls to find the bad items",
            "",
            "`on_batch_error=Isolate()`; one batch of n items, bad items at every position (n ≤ 256; 256 random ones "
            "for 1024), 50 random draws for 2 and 4 bad items. Extra calls: calls of `process_batch` beyond the "
            "batch's first.",
            "",
            *await isolation(rng),
            "",
            "## Out-of-memory split: a spike, then back",
            "",
            "A model that fits 256 items per call fits 32 during a spike of 4 waves of 256 callers, then 256 again; "
            "`max_batch_size=256`. Waves of 256 callers follow until the ceiling is lifted.",
            "",
            *await splits(),
            "",
            "## Retries: the latency they add",
            "",
            "`retry=RetryPolicy(attempts=5, budget=None)` (backoff 50 ms, doubling, cap 5 s, full jitter); 2000 items, "
            "each answered `Retry()` on its first k tries; latency from the call to its result, the model "
            "instantaneous, `max_queue_time=0`.",
            "",
            *await retries(),
        ]

    body = run(all_of_them())
    report = [
        "# The failure handling: what it costs",
        "",
        regenerated_by("bench-failures", "python -m benchmarks.failures"),
        "",
        f"On the virtual clock (`async_batcher.testing.VirtualClockLoop`): counts and simulated seconds, no wall time. "
        f"Python {platform.python_version()}, revision {revision()}.",
        "",
        *body,
        "",
    ]
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "failures.md").write_text("\n".join(report))
    sys.stdout.write("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
