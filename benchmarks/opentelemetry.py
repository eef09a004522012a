"""``python -m benchmarks.opentelemetry``: what ``async_batcher.opentelemetry`` costs per item, off and on.

The steady shape of the overhead benchmark (``--callers`` callers, each awaiting its items one after the other,
through one batcher whose ``process_batch`` doubles them), as ratios against references in the same run, the
configurations interleaved round by round so that load from elsewhere on a shared machine hits all alike:

- ``plain``: not instrumented, callers without spans (the reference of the next two);
- ``instrumented, no provider``: ``instrument(batcher)`` and no tracer provider set (the API's proxy);
- ``on, callers without spans``: an SDK ``TracerProvider`` whose exporter drops what it gets (the SDK's recording
  cost without I/O): one span per batch, no link;
- ``plain, callers with spans``: not instrumented, each item awaited inside a span of its caller's (the reference
  of the next: the application's own spans are not this package's cost);
- ``on, callers with spans``: instrumented: a span per batch, a link and three events per item.

The median of ``--rounds`` rounds, in microseconds per item. Standard library, the OpenTelemetry SDK and uvloop
(``--event-loop uvloop``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from async_batcher import AsyncBatcher
from async_batcher.opentelemetry import instrument

__all__ = ["main"]


class _Dropping(SpanExporter):
    """Takes every span and keeps none: the SDK's work, without the exporter's I/O."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Doubler(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [x * 2 for x in batch]


async def _steady(call: Callable[[int], Awaitable[int]], items: int, callers: int) -> float:
    per = items // callers

    async def caller(first: int) -> None:
        for x in range(first, first + per):
            if await call(x) != 2 * x:
                raise AssertionError(f"item {x}: wrong result")

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c * per) for c in range(callers)))
    return time.perf_counter() - t0


def _configurations(provider: TracerProvider) -> dict[str, tuple[_Doubler, Callable[[int], Awaitable[int]]]]:
    tracer = provider.get_tracer("benchmark")
    made: dict[str, tuple[_Doubler, Callable[[int], Awaitable[int]]]] = {}

    def batcher(name: str, provider: Any = None, *, on: bool) -> _Doubler:
        b = _Doubler(name=name, max_batch_size=1000, max_queue_time=0)
        if on:
            instrument(b, tracer_provider=provider)
        return b

    def in_span(b: _Doubler) -> Callable[[int], Awaitable[int]]:
        async def call(x: int) -> int:
            with tracer.start_as_current_span("request"):
                return await b.process(x)

        return call

    for name, b, spans in (
        ("plain", batcher("plain", on=False), False),
        ("instrumented, no provider", batcher("noprovider", on=True), False),
        ("on, callers without spans", batcher("on", provider, on=True), False),
        ("plain, callers with spans", batcher("plainspans", on=False), True),
        ("on, callers with spans", batcher("onspans", provider, on=True), True),
    ):
        made[name] = (b, in_span(b) if spans else b.process)
    return made


_REFERENCE = {
    "instrumented, no provider": "plain",
    "on, callers without spans": "plain",
    "on, callers with spans": "plain, callers with spans",
}


async def _run(args: argparse.Namespace) -> dict[str, list[float]]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Dropping()))
    configurations = _configurations(provider)
    timings: dict[str, list[float]] = {name: [] for name in configurations}
    for _, call in configurations.values():  # warm-up
        await _steady(call, args.items // 10, args.callers)
    for _ in range(args.rounds):
        for name, (_, call) in configurations.items():
            timings[name].append(await _steady(call, args.items, args.callers) / args.items * 1e6)
    for b, _ in configurations.values():
        await b.stop()
    provider.shutdown()
    return timings


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.opentelemetry", description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=20_000, help="items per run")
    p.add_argument("--callers", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = p.parse_args(argv)
    if args.event_loop == "uvloop":
        import uvloop

        timings = uvloop.run(_run(args))
    else:
        timings = asyncio.run(_run(args))
    median = {name: statistics.median(values) for name, values in timings.items()}
    shape = f"{args.event_loop}, {args.items} items, {args.callers} callers"
    print(f"µs per item, median of {args.rounds} rounds ({shape})\n")
    print("| configuration | µs per item | ÷ reference |")
    print("|---|---:|---:|")
    for name, value in median.items():
        reference = _REFERENCE.get(name)
        ratio = f"{value / median[reference]:.2f} (÷ {reference})" if reference else "reference"
        print(f"| {name} | {value:.2f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
