"""A FastAPI app that batches its requests: uvicorn docs.snippets.fastapi_app:app"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI
from pydantic import BaseModel, Field

from async_batcher import AsyncBatcher
from async_batcher.fastapi import (
    add_batcher_exception_handlers,
    batcher_dependency,
    batcher_lifespan,
)


class Scorer(AsyncBatcher[list[float], float]):
    async def process_batch(self, batch: list[list[float]]) -> list[float]:
        # Your model here: one call for the whole batch.
        return [sum(features) for features in batch]


class Features(BaseModel):
    # Four numbers, no more, no fewer: a body of another shape is refused with 422
    # before it reaches a batch, where it could fail the requests stacked with it.
    values: Annotated[list[float], Field(min_length=4, max_length=4)]


scorer = Scorer(
    name="scorer", max_batch_size=64, max_queue_time=0.002, max_queue_size=1000
)
# The lifespan starts the batcher; on shutdown it drains and stops it.
app = FastAPI(lifespan=batcher_lifespan(scorer))
# A full queue (or a stopping batcher): 503 with Retry-After.
add_batcher_exception_handlers(app)
ScorerDep = Annotated[Scorer, Depends(batcher_dependency("scorer"))]


@app.post("/score")
async def score(body: Features, batcher: ScorerDep) -> float:
    return await batcher.process(body.values)
