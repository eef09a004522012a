"""The streaming benchmark's server: the example's /generate, batched continuously, in static batches, or not at all.

``python -m benchmarks.streaming.server --mode continuous --port 8000``:

- ``continuous``: examples/streaming/app.py as it is (new requests join the running batch between steps);
- ``static``: the same with ``continuous_batching = False``: a batch runs until its last stream ends, and the
  requests that arrive meanwhile wait for the next batch;
- ``single``: one generation loop per request (prefill, then steps of one row), with the same model, the same
  events, and, like the batched modes, one model thread: the requests' steps take turns on it.

Same model (examples/streaming/model.py, same seed), same validation, same server-sent events in every mode.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: the repository's root is where the imports below are found
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from async_batcher.fastapi import add_batcher_exception_handlers, run_batchers
from examples.streaming import app as example
from examples.streaming.model import CharModel

__all__ = ["MODES", "StaticGenerator", "create_app", "main"]

MODES = ("continuous", "static", "single")


class StaticGenerator(example.Generator):
    """The example's generator without continuous batching: static batches."""

    continuous_batching = False


def _batched_app(generator_class: type[example.Generator]) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with run_batchers(generator_class(CharModel(), **example.SETTINGS)) as batchers:
            yield batchers

    app = FastAPI(lifespan=lifespan)
    add_batcher_exception_handlers(app)
    app.post("/generate")(example.generate)
    app.get("/stats")(example.stats)
    return app


def _single_app() -> FastAPI:
    model = CharModel()
    model_thread = ThreadPoolExecutor(1, thread_name_prefix="model")
    counters = {"steps": 0, "rows": 0, "prefilled": 0}

    async def in_thread(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(model_thread, fn, *args)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            model_thread.shutdown()

    app = FastAPI(lifespan=lifespan)

    @app.post("/generate")
    async def generate(body: example.GenerateRequest) -> StreamingResponse:
        states, token = await in_thread(model.prefill, [body.prompt.encode()])
        counters["prefilled"] += 1

        async def events() -> AsyncIterator[bytes]:
            nonlocal states, token
            yield example.sse({"token": int(token[0])})
            for _ in range(body.max_tokens - 1):
                states, token = await in_thread(model.step, states, token)
                counters["steps"] += 1
                counters["rows"] += 1
                yield example.sse({"token": int(token[0])})
            yield example.sse({"tokens": body.max_tokens}, event="end")

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.get("/stats")
    async def stats() -> dict[str, int]:
        return counters

    return app


def create_app(mode: str) -> FastAPI:
    if mode == "continuous":
        return _batched_app(example.Generator)
    if mode == "static":
        return _batched_app(StaticGenerator)
    if mode == "single":
        return _single_app()
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks.streaming.server", description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    uvicorn.run(create_app(args.mode), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
