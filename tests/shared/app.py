"""An app whose workers share one batcher: ``uvicorn tests.shared.app:app --workers 2`` (the address in
``$SHARED_TEST_ADDRESS``; the model logs its calls to ``$SHARED_TEST_LOG``)."""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI

from async_batcher.fastapi import add_batcher_exception_handlers, batcher_lifespan
from async_batcher.shared import SharedBatcher
from tests.shared.models import model

predictor: SharedBatcher[Any, Any] = SharedBatcher(model, name="model", address=os.environ["SHARED_TEST_ADDRESS"])
app = FastAPI(lifespan=batcher_lifespan(predictor))
add_batcher_exception_handlers(app)


@app.post("/double")
async def double(x: int) -> dict[str, Any]:
    return {"result": await predictor.process(x), "pid": os.getpid(), "role": predictor.role}
