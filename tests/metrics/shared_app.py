"""Two workers, one shared batcher, one ``/metrics``: ``uvicorn tests.metrics.shared_app:app --workers 2`` with
``PROMETHEUS_MULTIPROC_DIR`` and ``SHARED_TEST_ADDRESS`` set (tests/metrics/test_shared.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from async_batcher.metrics_multiprocess import MultiprocessExporter, make_metrics_app
from async_batcher.shared import SharedBatcher
from tests.shared.models import Model


def make_doubler() -> Model:  # in the owner only
    return Model(name="doubler", max_batch_size=16, max_queue_time=0.005)


doubler: SharedBatcher[Any, Any] = SharedBatcher(make_doubler, address=os.environ["SHARED_TEST_ADDRESS"])


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with MultiprocessExporter(doubler), doubler:  # every worker passes it; the owner writes it
        yield


app = FastAPI(lifespan=lifespan)
app.mount("/metrics", make_metrics_app())


@app.get("/double/{x}")
async def double(x: int) -> dict[str, Any]:
    return {"result": await doubler.process(x), "pid": os.getpid(), "role": doubler.role}
