"""Histograms of batches (async_batcher.metrics.BatcherHistograms) and the recorder's observers behind them."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from async_batcher.metrics import BatcherHistograms, register_batcher, unregister_batcher
from async_batcher.stats import _Recorder
from tests.batchers import Recording

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(registry: CollectorRegistry) -> Samples:
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.mark.virtual_time
async def test_each_batch_is_observed_once_in_the_three_histograms() -> None:
    b = Recording(name="h", max_batch_size=4, max_queue_time=0.5, delay=0.02)
    registry = CollectorRegistry()
    register_batcher(b, registry)
    assert await asyncio.gather(*(b.process(i) for i in range(4))) == [0, 2, 4, 6]  # full: leaves at once
    assert await b.process(7) == 14  # alone: leaves after max_queue_time
    await b.stop()
    samples = scrape(registry)
    assert [len(batch) for batch in b.batches] == [4, 1]
    size = "async_batcher_batch_size"
    assert value(samples, f"{size}_count", batcher="h") == 2
    assert value(samples, f"{size}_sum", batcher="h") == 5
    assert value(samples, f"{size}_bucket", batcher="h", le="1.0") == 1
    assert value(samples, f"{size}_bucket", batcher="h", le="2.0") == 1
    assert value(samples, f"{size}_bucket", batcher="h", le="4.0") == 2
    wait = "async_batcher_batch_queue_wait_seconds"
    assert value(samples, f"{wait}_count", batcher="h") == 2
    assert value(samples, f"{wait}_sum", batcher="h") == pytest.approx(0.5)  # 0 for the full batch, then 0.5
    assert value(samples, f"{wait}_bucket", batcher="h", le="0.0001") == 1
    assert value(samples, f"{wait}_bucket", batcher="h", le="0.25") == 1
    assert value(samples, f"{wait}_bucket", batcher="h", le="0.5") == 2
    process = "async_batcher_batch_process_seconds"
    assert value(samples, f"{process}_count", batcher="h") == 2
    assert value(samples, f"{process}_sum", batcher="h") == pytest.approx(0.04)
    assert value(samples, f"{process}_bucket", batcher="h", le="0.01") == 0
    assert value(samples, f"{process}_bucket", batcher="h", le="0.025") == 2
    # The counts agree with the statistics' own.
    assert value(samples, "async_batcher_batches_total", batcher="h", reason="full") == 1  # the four
    assert value(samples, "async_batcher_batches_total", batcher="h", reason="deadline") == 1  # the one
    assert b.stats.batches == 2


@pytest.mark.virtual_time
async def test_buckets_are_configurable_and_checked() -> None:
    registry = CollectorRegistry()
    histograms = BatcherHistograms(registry, wait_buckets=[0.1, 1], process_buckets=[0.5], size_buckets=[2, 8])
    b = Recording(name="custom", max_batch_size=3, max_queue_time=0)
    register_batcher(b, registry, histograms=histograms)
    assert await asyncio.gather(*(b.process(i) for i in range(3))) == [0, 2, 4]
    await b.stop()
    samples = scrape(registry)
    buckets = sorted(
        labels
        for (name, labels) in samples
        if name == "async_batcher_batch_size_bucket" and ("batcher", "custom") in labels
    )
    assert {dict(labels)["le"] for labels in buckets} == {"2.0", "8.0", "+Inf"}
    assert value(samples, "async_batcher_batch_size_sum", batcher="custom") == 3
    # The registry keeps the histograms passed first: a later default registration uses them.
    other = Recording(name="other", max_queue_time=0)
    register_batcher(other, registry)
    assert histograms.batchers == [b, other]

    for bad in ([], [1, 1], [2, 1], [float("nan")]):
        with pytest.raises(ValueError, match="size_buckets must be non-empty, increasing"):
            BatcherHistograms(None, size_buckets=bad)
    with pytest.raises(TypeError, match="wait_buckets must be a sequence of numbers"):
        BatcherHistograms(None, wait_buckets=["a"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="histograms must be a bool"):
        register_batcher(Recording(name="x"), CollectorRegistry(), histograms="yes")  # type: ignore[arg-type]


@pytest.mark.virtual_time
async def test_unregistering_drops_the_series_and_stops_observing() -> None:
    registry = CollectorRegistry()
    b = Recording(name="gone", max_queue_time=0)
    register_batcher(b, registry)
    assert await b.process(1) == 2
    assert value(scrape(registry), "async_batcher_batch_size_count", batcher="gone") == 1
    unregister_batcher(b, registry)
    assert not [key for key in scrape(registry) if ("batcher", "gone") in key[1]]
    assert await b.process(2) == 4  # no observer left to call
    assert b._recorder.observers == ()
    await b.stop()
    # Two live batchers of one name would mix their series: refused, and the summaries stay as they were.
    keep = Recording(name="same")
    register_batcher(keep, registry)
    histograms = BatcherHistograms(CollectorRegistry())
    histograms.observe(keep)
    with pytest.raises(ValueError, match="already observed"):
        histograms.observe(Recording(name="same"))
    histograms.observe(keep)  # idempotent
    assert histograms.batchers == [keep]


def test_a_failing_observer_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    recorder = _Recorder()
    seen: list[tuple[int, float, float]] = []

    def broken(size: int, waited: float, elapsed: float) -> None:
        raise RuntimeError("observer bug")

    recorder.add_observer(broken)
    recorder.add_observer(lambda *args: seen.append(args))
    recorder.add_observer(broken)  # idempotent
    assert len(recorder.observers) == 2
    recorder.batch_ended(3, 0.25, 0.5)
    assert seen == [(3, 0.25, 0.5)]
    assert recorder.batches == 1
    assert "a batch observer raised" in caplog.text
    assert caplog.records[0].name == "async_batcher.stats"
    recorder.remove_observer(broken)
    recorder.remove_observer(broken)  # a no-op the second time
    recorder.batch_ended(1, 0.0, 0.0)
    assert len(seen) == 2
    with pytest.raises(TypeError, match="must be callable"):
        recorder.add_observer(42)  # type: ignore[arg-type]
