"""Items/s through one owner with N client processes; the owner's CPU per item; one caller's round trip."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import time
from typing import Any

from async_batcher.shared import SharedBatcher
from benchmarks.shared.common import noop, run


def owner_main(address: str, loop: str, ready: Any, done: Any, out: Any, latency_calls: int) -> None:
    async def main() -> None:
        async with SharedBatcher(noop, address=address, role="owner", name="noop") as shared:
            lat = await _latencies(shared, latency_calls)
            ready.set()
            t0, cpu0 = time.perf_counter(), os.times()
            submitted0 = shared.stats.submitted
            await asyncio.get_running_loop().run_in_executor(None, done.wait)
            t1, cpu1 = time.perf_counter(), os.times()
            items = shared.stats.submitted - submitted0
            cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
            out.put({"items": items, "seconds": t1 - t0, "cpu": cpu, "local_latency": lat})

    run(main(), loop)


async def _latencies(shared: SharedBatcher[Any, Any], n: int) -> list[float]:
    for i in range(200):  # warm up
        await shared.process(i)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        await shared.process(i)
        times.append(time.perf_counter() - t0)
    return times


def client_main(address: str, loop: str, callers: int, seconds: float, start: Any, out: Any, latency: int) -> None:
    async def main() -> None:
        async with SharedBatcher(noop, address=address, role="client", name="noop") as shared:
            for i in range(100):
                await shared.process(i)
            if latency:
                out.put({"latency": await _latencies(shared, latency)})
                return
            await asyncio.get_running_loop().run_in_executor(None, start.wait)
            count = 0
            stop_at = time.perf_counter() + seconds

            async def caller(k: int) -> None:
                nonlocal count
                x = k
                while time.perf_counter() < stop_at:
                    await shared.process(x)
                    count += 1
                    x += callers

            await asyncio.gather(*(caller(k) for k in range(callers)))
            out.put({"count": count})

    run(main(), loop)


def measure(address: str, loop: str, clients: int, callers: int, seconds: float) -> dict[str, float]:
    """One configuration: items/s through the owner, and the owner's CPU µs per item."""
    ctx = multiprocessing.get_context("spawn")
    ready, done, start = ctx.Event(), ctx.Event(), ctx.Event()
    out: Any = ctx.Queue()
    owner = ctx.Process(target=owner_main, args=(address, loop, ready, done, out, 0))
    owner.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the owner did not start")
        procs = [
            ctx.Process(target=client_main, args=(address, loop, callers, seconds, start, out, 0))
            for _ in range(clients)
        ]
        for p in procs:
            p.start()
        time.sleep(1.0)  # (the clients connect and warm up; then all start together)
        start.set()
        counts = [out.get(timeout=seconds + 60)["count"] for _ in procs]
        done.set()
        stats = out.get(timeout=60)
        for p in procs:
            p.join(30)
    finally:
        done.set()
        owner.join(30)
        if owner.is_alive():
            owner.kill()
    total = sum(counts)
    return {
        "items_per_s": total / seconds,
        "owner_cpu_us_per_item": 1e6 * stats["cpu"] / max(stats["items"], 1),
        "owner_cpu_share": stats["cpu"] / stats["seconds"],
    }


def latency(address: str, loop: str, calls: int) -> dict[str, float]:
    """One caller, one item after the other: the owner's own caller (no hop) and a client's, p50 and p99 in µs."""
    ctx = multiprocessing.get_context("spawn")
    ready, done, start = ctx.Event(), ctx.Event(), ctx.Event()
    out: Any = ctx.Queue()
    owner = ctx.Process(target=owner_main, args=(address, loop, ready, done, out, calls))
    owner.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the owner did not start")
        client = ctx.Process(target=client_main, args=(address, loop, 1, 0.0, start, out, calls))
        client.start()
        remote = out.get(timeout=120)["latency"]
        client.join(30)
        done.set()
        local = out.get(timeout=60)["local_latency"]
    finally:
        done.set()
        owner.join(30)
        if owner.is_alive():
            owner.kill()

    def pct(values: list[float], q: float) -> float:
        return 1e6 * statistics.quantiles(values, n=100)[int(q) - 1]

    return {
        "local_p50_us": pct(local, 50),
        "local_p99_us": pct(local, 99),
        "client_p50_us": pct(remote, 50),
        "client_p99_us": pct(remote, 99),
        "hop_p50_us": pct(remote, 50) - pct(local, 50),
    }
