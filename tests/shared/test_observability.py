"""Prometheus and OpenTelemetry see one batcher: the owner's, exported where it is owned and followed from owner to
owner; a client exports nothing for it. (Multiprocess mode, with real workers: tests/metrics/test_shared.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from async_batcher.metrics import register_batcher, unregister_batcher
from async_batcher.shared import SharedBatcher
from tests.loops import until
from tests.shared.models import Model


def make() -> Model:
    return Model(name="model", max_batch_size=8, max_queue_time=0.01)


def series(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """The samples labelled ``batcher="model"``, by name and outcome (or reason, or bucket)."""
    return {
        (s.name, s.labels.get("outcome", s.labels.get("reason", s.labels.get("le", "")))): s.value
        for family in registry.collect()
        for s in family.samples
        if s.labels.get("batcher") == "model"
    }


async def test_a_shared_batcher_is_exported_once_by_its_owner_and_followed_to_the_next(address: str) -> None:
    # Two processes of one machine, each with its shared batcher and its own registry (its /metrics).
    first_registry, second_registry = CollectorRegistry(), CollectorRegistry()
    first: SharedBatcher[Any, Any] = SharedBatcher(make, address=address, name="predictor")
    second: SharedBatcher[Any, Any] = SharedBatcher(make, address=address, name="predictor")
    register_batcher(first, first_registry)  # before they start: which owns it is not known yet
    register_batcher(second, second_registry)
    assert series(first_registry) == series(second_registry) == {}
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(first)
        await stack.enter_async_context(second)
        assert (first.role, second.role) == ("owner", "client")
        assert await asyncio.gather(first.process(1), second.process(2), second.process(3)) == [2, 4, 6]
        owned = series(first_registry)
        assert owned[("async_batcher_items_total", "processed")] == 3  # every process's items, once
        assert owned[("async_batcher_batch_size_sum", "")] == 3
        assert series(second_registry) == {}  # the client: no empty copy of the series

        await first.stop()  # hands over: the second process's factory makes the next batcher
        await until(lambda: second.role == "owner")
        assert await asyncio.gather(second.process(4), second.process(5)) == [8, 10]
        taken = series(second_registry)
        assert taken[("async_batcher_items_total", "processed")] == 2  # the new owner's batcher counts from zero
        assert taken[("async_batcher_batch_size_sum", "")] == 2
        left = series(first_registry)
        assert ("async_batcher_items_total", "processed") not in left  # it no longer owns a batcher
        assert left[("async_batcher_batch_size_sum", "")] == 3  # the batches it ran, which happened, stay

        unregister_batcher(second, second_registry)  # stops following: the series go, the next batches are not seen
        assert series(second_registry) == {}
        assert await second.process(6) == 12
        assert series(second_registry) == {}


def test_watching_tells_each_owner_in_turn_and_a_watcher_that_raises_is_logged(
    address: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> list[tuple[str, object]]:
        told: list[tuple[str, object]] = []
        first: SharedBatcher[Any, Any] = SharedBatcher(make, address=address, name="predictor")
        second: SharedBatcher[Any, Any] = SharedBatcher(make, address=address, name="predictor")
        first.watch(lambda b: told.append(("first", b)))
        second.watch(lambda b: told.append(("second", b)))
        second.watch(lambda b: 1 / 0)  # logged; the others are told all the same
        async with first, second:
            owned = first.batcher
            late: list[object] = []
            unwatch = first.watch(late.append)  # owning now: told at once
            assert late == [owned] and told == [("first", owned)]
            unwatch()
            # Connected first: a connection made as the owner closes would wait out the handshake's timeout.
            assert await second.process(1) == 2
            await first.stop()
            await until(lambda: second.role == "owner")
            assert late == [owned]  # (no longer watching)
            assert told == [("first", owned), ("first", None), ("second", second.batcher)]
        return told

    told = asyncio.run(run())
    assert told[-1] == ("second", None)
    assert "a watcher" in caplog.text and "ZeroDivisionError" in caplog.text


async def test_opentelemetry_traces_the_owners_batches_and_every_callers_wait(address: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from async_batcher.opentelemetry import (
        EVENT_ANSWERED,
        EVENT_QUEUED,
        EVENT_SENT,
        instrument,
        is_instrumented,
        uninstrument,
    )

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    first: SharedBatcher[Any, Any] = SharedBatcher(make, address=address, name="predictor")
    second: SharedBatcher[Any, Any] = SharedBatcher(make, address=address, name="predictor")
    for shared in (first, second):  # in every process, before it starts
        instrument(shared, tracer_provider=provider)

    def events(span: Any) -> list[str]:
        return [event.name for event in span.events]

    def batch_spans() -> list[Any]:
        return [s for s in exporter.get_finished_spans() if s.name == "model batch"]

    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(first)
        await stack.enter_async_context(second)
        assert is_instrumented(first.batcher)  # the owner's batcher, by following it
        with tracer.start_as_current_span("in the owner") as in_owner:
            assert await first.process(1) == 2
        with tracer.start_as_current_span("in a client") as in_client:
            assert await second.process(2) == 4
        assert events(in_owner) == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]
        # In a client: its events, each once; its item went out in another process, which tells no one.
        assert events(in_client) == [EVENT_QUEUED, EVENT_ANSWERED]
        assert [link.context.span_id for span in batch_spans() for link in span.links] == [
            in_owner.get_span_context().span_id,
            in_client.get_span_context().span_id,
        ]

        await first.stop()  # the next owner's batcher is traced from its first batch
        await until(lambda: second.role == "owner")
        assert is_instrumented(second.batcher)
        with tracer.start_as_current_span("in the next owner") as in_next:
            assert await second.process(3) == 6
        assert events(in_next) == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]
        assert len(batch_spans()) == 3

        owned = second.batcher
        uninstrument(second)
        assert not is_instrumented(second) and not is_instrumented(owned)
        with tracer.start_as_current_span("untraced") as untraced:
            assert await second.process(4) == 8
        assert events(untraced) == [] and len(batch_spans()) == 3
    provider.shutdown()
