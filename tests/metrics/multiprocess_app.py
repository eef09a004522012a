"""A small app for uvicorn ``--workers 2`` with multiprocess metrics: ``GET /double/{x}`` through a batcher.

Served by tests/metrics/test_multiprocess.py as ``python -m uvicorn tests.metrics.multiprocess_app:app``, with
``PROMETHEUS_MULTIPROC_DIR`` set before start (every worker imports prometheus_client with it set).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from async_batcher import AsyncBatcher
from async_batcher.metrics_multiprocess import MultiprocessExporter, make_metrics_app


class Doubler(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [2 * x for x in batch]


# A short wait, so that concurrent requests share batches; the exporter copies the counters often.
batcher = Doubler(name="doubler", max_batch_size=16, max_queue_time=0.005)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with MultiprocessExporter(batcher, interval=0.05):
        try:
            yield
        finally:
            await batcher.stop()


async def double(request: Request) -> JSONResponse:
    x = int(request.path_params["x"])
    return JSONResponse({"result": await batcher.process(x), "pid": os.getpid()})


app = Starlette(
    routes=[Route("/double/{x:int}", double), Mount("/metrics", app=make_metrics_app())],
    lifespan=lifespan,
)
