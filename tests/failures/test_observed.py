"""The failure handling as it is observed (issue 45): the Prometheus metrics (a real registry, scraped) and the
OpenTelemetry spans (the real SDK's in-memory exporter)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from async_batcher import AsyncBatcher
from async_batcher.failures import Isolate, Retry, RetryPolicy, SplitOn
from async_batcher.metrics import register_batcher
from async_batcher.opentelemetry import instrument

pytestmark = pytest.mark.virtual_time


class Unlucky(AsyncBatcher[int, int]):
    """Item 3 is bad, item 5 is throttled on its first try, and more than 4 items run out of memory."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tries: dict[int, int] = {}

    async def process_batch(self, batch: list[int]) -> list[Any]:
        if len(batch) > 4:
            raise MemoryError(f"{len(batch)} items")
        if 3 in batch:
            raise ValueError("bad 3")
        results: list[Any] = []
        for x in batch:
            self.tries[x] = self.tries.get(x, 0) + 1
            results.append(Retry() if x == 5 and self.tries[x] == 1 else x * 2)
        return results


def unlucky() -> Unlucky:
    return Unlucky(
        max_batch_size=8,
        max_queue_time=1.0,
        on_batch_error=Isolate(),
        retry=RetryPolicy(jitter=False),
        split_on=SplitOn(MemoryError),
    )


def samples(registry: CollectorRegistry, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for metric in text_string_to_metric_families(generate_latest(registry).decode()):
        if metric.name == family:
            for sample in metric.samples:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


async def test_the_metrics_count_each_action_and_show_the_ceiling() -> None:
    b = unlucky()
    registry = CollectorRegistry()
    register_batcher(b, registry)
    results = await asyncio.gather(*(b.process(x) for x in range(8)), return_exceptions=True)
    assert isinstance(results[3], ValueError)
    counted = samples(registry, "async_batcher_failure_handling")
    actions = {dict(labels)["action"]: value for labels, value in counted.items()}
    stats = b.stats
    assert actions == {
        "retried": stats.retried,
        "retry_refused": 0,
        "isolated": 1,
        "split": stats.splits,
        "extra_call": stats.extra_calls,
    }
    assert stats.retried == 1 and stats.splits == 1 and stats.extra_calls >= 3
    ceiling = samples(registry, "async_batcher_batch_ceiling")
    assert ceiling == {(("batcher", "Unlucky"), ("key", "")): 4.0}
    await b.stop()


async def test_each_call_of_a_part_is_a_span_that_says_which_part() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    b = unlucky()
    instrument(b, tracer_provider=provider)
    try:
        await asyncio.gather(*(b.process(x) for x in range(8)), return_exceptions=True)
        await b.stop()
    finally:
        provider.shutdown()
    spans = [dict(span.attributes or {}) for span in exporter.get_finished_spans() if span.name == "Unlucky batch"]
    first = spans[0]
    assert first["async_batcher.batch.size"] == 8 and "async_batcher.batch.part" not in first
    assert first["async_batcher.batch.outcome"] == "error"
    parts = [span.get("async_batcher.batch.part") for span in spans[1:]]
    # 8 items out of memory: two parts of 4. The first holds the bad item: bisected ([0, 1] succeeds, so [2, 3] is
    # split without a call: [2], then [3]); then the second part, whose item 5 is tried again in a batch of its own.
    assert parts == ["split", "bisect", "bisect", "bisect", "split", None]
    assert all(span.get("async_batcher.batch.ceiling") == 4.0 for span in spans[1:-1])
    assert any(span.get("async_batcher.batch.retry") == 1 for span in spans)
