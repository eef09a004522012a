"""Prometheus metrics: a real registry, scraped with ``generate_latest`` and read back with the text parser."""

from __future__ import annotations

import asyncio
import gc
import math
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

from async_batcher import BatcherStoppedError, batch
from async_batcher.metrics import BatcherCollector, register_batcher, unregister_batcher
from tests.batchers import Recording, until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(registry: CollectorRegistry) -> Samples:
    """Every sample of a scrape, by name and labels; checks that each family appears once."""
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), names
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` that carry ``labels``, whatever their others (a counter's reasons)."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)


@pytest.mark.virtual_time
async def test_a_scrape_reports_what_the_statistics_say() -> None:
    b = Recording(
        name="embedder",
        max_batch_size=5,
        max_queue_time=1.0,
        answer=lambda xs: [ValueError("bad") if x == 99 else 2 * x for x in xs],
    )
    registry = CollectorRegistry()
    register_batcher(b, registry)
    empty = scrape(registry)
    assert math.isnan(value(empty, "async_batcher_queue_wait_seconds", batcher="embedder", quantile="0.5"))
    assert total(empty, "async_batcher_batches_total", batcher="embedder") == 0

    await asyncio.gather(*(b.process(i) for i in range(5)))  # one full batch, at once
    with pytest.raises(ValueError, match="bad"):
        await b.process(99)  # a batch of one, after max_queue_time
    with pytest.raises(TimeoutError):
        await b.process(1, timeout=0.5)  # withdrawn before its batch goes out
    await b.stop()
    with pytest.raises(BatcherStoppedError):
        await b.process(1)

    stats = b.stats
    samples = scrape(registry)
    assert total(samples, "async_batcher_batches_total", batcher="embedder") == stats.batches == 2
    # Why each went: one full batch at once, the other when its max_queue_time was up.
    assert value(samples, "async_batcher_batches_total", batcher="embedder", reason="full") == 1
    assert value(samples, "async_batcher_batches_total", batcher="embedder", reason="deadline") == 1
    assert dict(stats.reasons) == {"full": 1, "deadline": 1}
    expected = {"submitted": 7, "processed": 6, "failed": 1, "cancelled": 0, "timed_out": 1, "rejected": 1}
    for outcome, count in expected.items():
        assert getattr(stats, outcome) == count
        assert value(samples, "async_batcher_items_total", batcher="embedder", outcome=outcome) == count
    assert value(samples, "async_batcher_batch_size_mean", batcher="embedder") == stats.mean_batch_size == 3.0
    for name, summary in (
        ("async_batcher_queue_wait_seconds", stats.queue_wait),
        ("async_batcher_process_time_seconds", stats.process_time),
    ):
        for quantile, p in (("0.5", summary.p50), ("0.95", summary.p95), ("0.99", summary.p99)):
            assert value(samples, name, batcher="embedder", quantile=quantile) == p
        assert value(samples, f"{name}_count", batcher="embedder") == 2
    assert value(samples, "async_batcher_queue_wait_seconds", batcher="embedder", quantile="0.99") == 1.0
    assert value(samples, "async_batcher_queued_items", batcher="embedder") == 0
    assert value(samples, "async_batcher_in_flight_batches", batcher="embedder") == 0


@pytest.mark.virtual_time
async def test_the_hold_counters_follow_the_statistics() -> None:
    # Eight closed-loop clients, a hold: the batches it kept back and its probes, as BatcherStats counts them.
    b = Recording(name="held", max_queue_time=0, max_hold_time=0.05, delay=0.1)
    registry = CollectorRegistry()
    registry.register(BatcherCollector(b))

    async def client(c: int) -> None:
        for _ in range(5):
            await b.process(c)
            await asyncio.sleep(0.01 + 0.001 * c)

    await asyncio.gather(*(client(c) for c in range(8)))
    await b.stop()
    stats = b.stats
    samples = scrape(registry)
    assert value(samples, "async_batcher_held_batches_total", batcher="held") == stats.held == 4
    assert value(samples, "async_batcher_hold_probes_total", batcher="held") == stats.probes == 1


@pytest.mark.virtual_time
async def test_the_gauges_show_the_moment() -> None:
    gate = asyncio.Event()
    b = Recording(name="held", max_batch_size=2, max_queue_time=60, gate=gate)
    registry = CollectorRegistry()
    registry.register(BatcherCollector(b))
    calls = [asyncio.ensure_future(b.process(i)) for i in range(3)]
    await until(lambda: len(b.batches) == 1)  # two items in flight, held at the gate; the third waits
    samples = scrape(registry)
    assert value(samples, "async_batcher_in_flight_batches", batcher="held") == 1
    assert value(samples, "async_batcher_queued_items", batcher="held") == 1
    gate.set()
    await b.stop()
    assert await asyncio.gather(*calls) == [0, 2, 4]
    samples = scrape(registry)
    assert value(samples, "async_batcher_in_flight_batches", batcher="held") == 0
    assert value(samples, "async_batcher_queued_items", batcher="held") == 0


def test_batchers_of_one_registry_share_a_collector_and_are_held_weakly() -> None:
    @batch(name="fn")
    async def fn(xs: list[int]) -> list[int]:
        return xs

    registry = CollectorRegistry()
    a, b = Recording(name="a"), Recording(name="b")
    collector = register_batcher(a, registry)
    assert register_batcher(b, registry) is collector
    assert register_batcher(fn, registry) is collector  # a @batch function stands for its batcher
    register_batcher(a, registry)  # idempotent
    assert collector.batchers == [a, b, fn.batcher]
    names = {dict(labels)["batcher"] for (name, labels) in scrape(registry) if name == "async_batcher_items_total"}
    assert names == {"a", "b", "fn"}

    with pytest.raises(ValueError, match="name="):
        register_batcher(Recording(name="a"), registry)
    unregister_batcher(fn, registry)
    del b
    gc.collect()
    assert collector.batchers == [a]
    assert {dict(key[1])["batcher"] for key in scrape(registry) if key[0] == "async_batcher_items_total"} == {"a"}
    unregister_batcher(a, CollectorRegistry())  # not exported there: nothing happens


def test_names_are_checked_at_registration() -> None:
    registry = CollectorRegistry()
    registry.register(BatcherCollector())
    with pytest.raises(ValueError, match="Duplicated"):
        registry.register(BatcherCollector())  # two collectors would emit the same families twice
    with pytest.raises(TypeError, match="AsyncBatcher"):
        BatcherCollector(object())


def test_a_renamed_batcher_does_not_make_the_scrape_invalid(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    a, b = Recording(name="a"), Recording(name="b")
    registry.register(BatcherCollector(a, b))
    b.name = "a"
    samples = scrape(registry)
    assert {dict(key[1])["batcher"] for key in samples if key[0] == "async_batcher_items_total"} == {"a"}
    assert "two exported batchers are named 'a'" in caplog.text


def test_importing_the_package_does_not_import_prometheus_client() -> None:
    code = "import sys, async_batcher; assert 'prometheus_client' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.virtual_time
async def test_the_openmetrics_exposition_and_the_asgi_app_serve_it_too() -> None:
    b = Recording(name="served", max_queue_time=0)
    assert await b.process(1) == 2
    registry = CollectorRegistry()
    register_batcher(b, registry)

    text = openmetrics.generate_latest(registry).decode()
    families = {f.name: f for f in openmetrics_parser.text_string_to_metric_families(text)}  # the strict parser
    assert families["async_batcher_queue_wait_seconds"].type == "summary"

    # What mounting make_asgi_app at /metrics serves, driven as an ASGI server would.
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": []}
    await make_asgi_app(registry)(scope, receive, send)
    assert sent[0]["status"] == 200
    body = sent[1]["body"]
    assert isinstance(body, bytes)
    assert b'async_batcher_batches_total{batcher="served",reason="deadline"} 1.0' in body
    await b.stop()
