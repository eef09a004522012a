"""A bad input answered 422, the others of its batch 200.

uvicorn docs.snippets.fastapi_poison:app
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel

from async_batcher import AsyncBatcher
from async_batcher.failures import Isolate
from async_batcher.fastapi import (
    add_batcher_exception_handlers,
    batcher_dependency,
    batcher_lifespan,
)

POISON = "poison: this input failed alone"


class Parser(AsyncBatcher[str, int]):
    async def process_batch(self, batch: list[str]) -> list[int]:
        # One bad text fails the whole call: Isolate bisects it down to that text.
        return [int(text) for text in batch]


def poisoned(item: str, error: BaseException) -> None:
    # An item that failed alone, on its own input: the error its caller gets next.
    error.add_note(POISON)


parser = Parser(
    name="parser", max_queue_time=0.002, on_batch_error=Isolate(on_poison=poisoned)
)
app = FastAPI(lifespan=batcher_lifespan(parser))
add_batcher_exception_handlers(app)
ParserDep = Annotated[Parser, Depends(batcher_dependency("parser"))]


class Text(BaseModel):
    text: str


@app.post("/parse")
async def parse(body: Text, batcher: ParserDep) -> int:
    try:
        return await batcher.process(body.text)
    except Exception as exc:
        if POISON in getattr(exc, "__notes__", ()):
            # The request's own input: a client error.
            raise HTTPException(422, f"cannot parse {body.text!r}: {exc}") from exc
        # Anything else (the model down, a bisection out of budget, which fails
        # healthy items with the error that covered them): a server error, 500.
        raise
