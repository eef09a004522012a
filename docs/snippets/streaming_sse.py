"""Tokens as server-sent events.

Saved as streaming_sse.py: uvicorn streaming_sse:app
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from async_batcher import END, AsyncBatcher
from async_batcher.fastapi import (
    add_batcher_exception_handlers,
    batcher_dependency,
    batcher_lifespan,
)


@dataclass(eq=False)  # compared by identity: two equal prompts are two generations
class Generation:
    prompt: str
    max_tokens: int
    sent: int = 0  # the generation's own state lives on it (or in a dict keyed by it)


class Generator(AsyncBatcher[Generation, str]):
    continuous_batching = True  # newcomers join the running batch between two steps

    async def process_batch(self, batch: list[Generation]) -> AsyncIterator[list[Any]]:
        while batch:
            # Your model's step here, for every generation of the batch at once (in a
            # thread if it computes: await asyncio.to_thread(model.step, ...)).
            await asyncio.sleep(0.005)
            parts: list[Any] = []
            for g in batch:  # (a toy model: it spells the prompt again and again)
                done = g.sent == g.max_tokens
                parts.append(END if done else g.prompt[g.sent % len(g.prompt)])
                g.sent += 1
            yield parts


class GenerateRequest(BaseModel):
    prompt: Annotated[str, Field(min_length=1, max_length=256)]
    max_tokens: Annotated[int, Field(ge=1, le=256)] = 16


generator = Generator(
    name="generator", max_batch_size=64, max_queue_time=0, max_queue_size=1000
)
app = FastAPI(lifespan=batcher_lifespan(generator))
add_batcher_exception_handlers(app)  # a full queue or a stop: 503 + Retry-After
GeneratorDep = Annotated[Generator, Depends(batcher_dependency("generator"))]


def sse(data: Any, event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n"


@app.post("/generate")
async def generate(body: GenerateRequest, gen: GeneratorDep) -> StreamingResponse:
    tokens = gen.stream(Generation(body.prompt, body.max_tokens))
    first = await anext(tokens)  # a 503 comes here, before the response starts

    async def events() -> AsyncIterator[str]:
        yield sse(first)
        try:
            async for token in tokens:  # a client that leaves cancels this: it
                yield sse(token)  # drops out of the batch, the others go on
        except Exception as exc:  # too late for a status code: say it in-band
            yield sse(type(exc).__name__, event="error")
        else:
            yield sse(None, event="end")

    return StreamingResponse(events(), media_type="text/event-stream")
