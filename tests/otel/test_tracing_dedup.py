"""Tracing with ``dedup_key`` (issue 46): every caller that shares a row is linked from its batch, each with its own
events."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from async_batcher.opentelemetry import EVENT_ANSWERED, EVENT_QUEUED, EVENT_SENT, instrument
from tests.otel.test_tracing import Doubling, Traced, call, event_names, linked, traced

__all__ = ["traced"]


class Shared(Doubling):
    def dedup_key(self, item: int) -> Hashable:
        return item % 2  # two rows: the even and the odd


async def test_every_caller_of_a_shared_row_is_linked_and_sees_its_own_events(traced: Traced) -> None:
    b = Shared(traced, name="shared", max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    assert await asyncio.gather(*(call(traced, b, x) for x in range(6))) == [0, 2, 0, 2, 0, 2]
    await b.stop()
    (span,) = traced.batches("shared")
    requests = [traced.one(f"request {x}") for x in range(6)]
    assert dict(span.attributes or {})["async_batcher.batch.size"] == 2  # its rows
    assert linked(span) == {r.context.span_id for r in requests}  # its callers
    for request in requests:
        assert event_names(request) == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]
