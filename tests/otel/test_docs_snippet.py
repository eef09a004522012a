"""docs/snippets/opentelemetry_app.py, the OpenTelemetry guide's app, served by a real uvicorn: one request's trace
shows its batch."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from async_batcher.opentelemetry import EVENT_ANSWERED, EVENT_QUEUED, EVENT_SENT
from tests.servers import ThreadServer


@pytest.mark.single_loop
async def test_each_requests_trace_names_its_batch_and_the_batch_links_every_request() -> None:
    from docs.snippets.opentelemetry_app import app, provider, scorer

    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # beside the app's own (which prints)
    server = ThreadServer(app)
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            bodies = [[float(i), 1.0, 2.0] for i in range(8)]
            responses = await asyncio.gather(*(client.post("/score", json=body) for body in bodies))
    finally:
        server.begin_shutdown()
        server.join()
    assert [r.json() for r in responses] == [float(i + 3) for i in range(8)]
    assert scorer.stats.batches < 8  # (they were batched)

    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "POST /score"]
    batches = {s.context.span_id: s for s in spans if s.name == "scorer batch"}
    assert len(requests) == 8 and sum(len(b.links) for b in batches.values()) == 8
    for request in requests:
        assert [e.name for e in request.events] == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]
        sent = dict(request.events[1].attributes or {})
        (batch,) = [b for b in batches.values() if f"{b.context.span_id:016x}" == sent["async_batcher.batch.span_id"]]
        assert request.context.span_id in {link.context.span_id for link in batch.links}
        assert f"{batch.context.trace_id:032x}" == sent["async_batcher.batch.trace_id"]
    models = [s for s in spans if s.name == "model"]
    assert models and {m.parent.span_id for m in models if m.parent} == set(batches)
