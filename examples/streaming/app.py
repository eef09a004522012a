"""Token streaming behind FastAPI: every request's tokens come from one batched model, as server-sent events.

    cd examples/streaming                     # this folder: app.py and model.py, side by side
    pip install -r requirements.txt
    uvicorn app:app
    curl -N -X POST localhost:8000/generate -H 'Content-Type: application/json' \\
        -d '{"prompt": "Once upon a time", "max_tokens": 20}'

Each model step advances every running generation by one token (one row each). With ``continuous_batching``,
a request that arrives while others generate joins them at the next step (its prompt is prefilled first)
instead of waiting for the whole batch to finish, as LLM servers do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from async_batcher import END, AsyncBatcher
from async_batcher.fastapi import add_batcher_exception_handlers, batcher_dependency, run_batchers

if __package__:  # imported as examples.streaming.app (the repository's tests and benchmark)
    from .model import CharModel
else:  # uvicorn app:app, from this folder
    from model import CharModel

MAX_PROMPT = 256
MAX_TOKENS = 256


class GenerateRequest(BaseModel):
    prompt: Annotated[str, Field(min_length=1, max_length=MAX_PROMPT)]
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 32


@dataclass(eq=False)  # compared by identity: two requests with the same prompt are two generations
class Generation:
    prompt: bytes
    max_tokens: int


@dataclass
class Running:
    state: np.ndarray  # (layers, width)
    token: int  # the last token generated, fed to the next step
    count: int = 1


class Generator(AsyncBatcher[Generation, int]):
    """Streams the tokens of each generation; one model step per yield, for every generation of the batch."""

    continuous_batching = True  # requests that arrive join the running batch between two steps

    def __init__(self, model: CharModel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.counters = {"steps": 0, "rows": 0, "prefilled": 0, "left": 0}

    async def process_batch(self, batch: list[Generation]) -> AsyncIterator[list[Any]]:
        running: dict[Generation, Running] = {}  # kept by generation: the batcher edits the list between steps
        while batch:
            for gone in running.keys() - set(batch):  # ended, or its client left
                self.counters["left"] += running.pop(gone).count < gone.max_tokens
            # One step at a time (concurrency=1), in a thread: the event loop keeps serving HTTP meanwhile.
            yield await asyncio.to_thread(self.step, list(batch), running)

    def step(self, batch: list[Generation], running: dict[Generation, Running]) -> list[Any]:
        """One step, in a worker thread: prefill the newcomers, advance the others; one part per generation."""
        new = [g for g in batch if g not in running]
        done = {g for g in batch if g in running and running[g].count == g.max_tokens}
        going = [g for g in batch if g in running and g not in done]
        if new:
            states, tokens = self.model.prefill([g.prompt for g in new])
            for i, g in enumerate(new):
                running[g] = Running(states[:, i], int(tokens[i]))
        if going:
            states = np.stack([running[g].state for g in going], axis=1)
            states, tokens = self.model.step(states, np.array([running[g].token for g in going]))
            for i, g in enumerate(going):
                running[g] = Running(states[:, i], int(tokens[i]), running[g].count + 1)
        self.counters["steps"] += 1
        self.counters["rows"] += len(going)
        self.counters["prefilled"] += len(new)
        return [END if g in done else running[g].token for g in batch]


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One server-sent event."""
    return (f"event: {event}\n" if event else "").encode() + b"data: " + json.dumps(data).encode() + b"\n\n"


SETTINGS: dict[str, Any] = {
    "name": "generator",
    "max_batch_size": 128,  # the most generations stepped together
    "max_queue_time": 0,  # a batch starts as soon as the model is free; the others join it
    "max_queue_size": 1024,  # past that, 503 + Retry-After
    "stream_buffer": MAX_TOKENS,  # a client that reads slowly never holds the batch back
}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    async with run_batchers(Generator(CharModel(), **SETTINGS)) as batchers:  # drained and stopped at shutdown
        yield batchers


app = FastAPI(title="Token streaming, batched", lifespan=lifespan)
add_batcher_exception_handlers(app)
GeneratorDep = Annotated[Generator, Depends(batcher_dependency("generator"))]


@app.post("/generate")
async def generate(body: GenerateRequest, generator: GeneratorDep) -> StreamingResponse:
    tokens = generator.stream(Generation(body.prompt.encode(), body.max_tokens))
    first = await anext(tokens)  # a full queue or a stop is a 503 here, before the response starts

    async def events() -> AsyncIterator[bytes]:
        yield sse({"token": first})
        count = 1
        try:
            async for token in tokens:  # if the client leaves, Starlette cancels this: the generation stops
                yield sse({"token": token})
                count += 1
        except Exception as exc:  # the model failed mid-stream: the status line is long gone, say it in-band
            yield sse({"detail": type(exc).__name__}, event="error")
        else:
            yield sse({"tokens": count}, event="end")

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@app.get("/stats")
async def stats(generator: GeneratorDep) -> dict[str, int]:
    # Steps, rows stepped, prompts prefilled, generations their client left, batches (one per start).
    return {**generator.counters, "batches": generator.stats.batches}
