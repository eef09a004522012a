"""A FastAPI app whose request traces show their batch.

uvicorn docs.snippets.opentelemetry_app:app
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, FastAPI, Request, Response
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from async_batcher import AsyncBatcher
from async_batcher.fastapi import batcher_dependency, batcher_lifespan
from async_batcher.opentelemetry import instrument

# The application's tracing. Here the SDK prints each span; in production, a
# BatchSpanProcessor and an OTLP exporter to your collector.
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
tracer = provider.get_tracer("scoring-service")


class Scorer(AsyncBatcher[list[float], float]):
    async def process_batch(self, batch: list[list[float]]) -> list[float]:
        # What the batch traces is a child of the batch's span.
        with tracer.start_as_current_span("model"):
            return [sum(features) for features in batch]


scorer = Scorer(name="scorer", max_batch_size=64, max_queue_time=0.002)
instrument(scorer, tracer_provider=provider)  # a span per batch, linked to its requests
app = FastAPI(lifespan=batcher_lifespan(scorer))
ScorerDep = Annotated[Scorer, Depends(batcher_dependency("scorer"))]


@app.middleware("http")
async def trace_requests(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    # A span per request (what opentelemetry-instrumentation-fastapi does for you).
    name = f"{request.method} {request.url.path}"
    with tracer.start_as_current_span(name, kind=trace.SpanKind.SERVER):
        return await call_next(request)


@app.post("/score")
async def score(values: list[float], batcher: ScorerDep) -> float:
    # This request's span gets the events queued, sent (naming its batch's span)
    # and answered.
    return await batcher.process(values)
