"""examples/streaming/app.py under a real uvicorn on 127.0.0.1: concurrent streams, one batched model.

Each stream must carry exactly the tokens of its prompt generated alone (the model called directly), the streams
must share model steps, a client that leaves mid-stream must drop out of the batch while the others go on, and
nothing may be left running once the server has stopped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from examples.streaming.app import MAX_TOKENS, Generator
from tests.servers import ThreadServer
from tests.streaming.sse import read_stream

pytestmark = pytest.mark.single_loop


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def served() -> Iterator[ThreadServer]:
    """The example app served; after the test: stopped, every stream settled, no thread or error left behind."""
    from examples.streaming.app import app

    threads_before = set(threading.enumerate())
    errors = _Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "async_batcher")]
    for logger in loggers:
        logger.addHandler(errors)
    server = ThreadServer(app)
    server.start()
    generator: Generator = server.state["generator"]
    try:
        yield server
    finally:
        server.begin_shutdown()
        server.join()
        for logger in loggers:
            logger.removeHandler(errors)
    s = generator.stats
    assert s.queued == s.in_flight == 0 and s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out, s
    # (AnyIO's idle worker threads, from FastAPI's sync dependencies and httpx's name lookups, linger for 10 s
    # by design, running nothing.)
    left = [t for t in set(threading.enumerate()) - threads_before if not t.name.startswith("AnyIO worker")]
    assert not left, f"the server left threads running: {left}"
    assert not errors.records, [r.getMessage() for r in errors.records]


async def _stats(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/stats")
    assert response.status_code == 200
    stats: dict[str, Any] = response.json()
    return stats


async def test_each_stream_gets_the_tokens_of_its_prompt_alone_and_the_streams_share_steps(
    served: ThreadServer,
) -> None:
    requests = [
        ("Once upon a time", 40),
        ("a", 1),
        ("The quick brown fox jumps over the lazy dog", 75),
        ("Once upon a time", 12),  # the same prompt twice: two generations
        ("zzz", 120),
        ("naïve UTF-8 ✓", 33),
    ]
    model = served.state["generator"].model
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
        streams = await asyncio.gather(*(read_stream(client, prompt, n) for prompt, n in requests))
        stats = await _stats(client)
    for (prompt, n), stream in zip(requests, streams, strict=True):
        assert stream.status == 200 and stream.ended == "end" and stream.end_data == {"tokens": n}
        assert stream.tokens == model.generate(prompt.encode(), n), prompt
    assert stats["prefilled"] == len(requests) and stats["left"] == 0
    # Shared steps: fewer model steps than rows stepped, and fewer batches than requests (they joined one).
    assert stats["rows"] == sum(n - 1 for _, n in requests)
    assert stats["steps"] < stats["rows"] and stats["batches"] < len(requests)


async def test_a_client_that_leaves_drops_out_of_the_batch_and_the_others_complete(served: ThreadServer) -> None:
    model = served.state["generator"].model
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
        leaver = asyncio.ensure_future(read_stream(client, "I will not stay", MAX_TOKENS, leave_after=3))
        stayers = [asyncio.ensure_future(read_stream(client, f"stay {i}", 150)) for i in range(2)]
        left, *stayed = await asyncio.gather(leaver, *stayers)
        stats = await _stats(client)
    assert left.tokens == model.generate(b"I will not stay", 3) and left.ended is None
    for i, stream in enumerate(stayed):
        assert stream.ended == "end" and stream.tokens == model.generate(f"stay {i}".encode(), 150)
    # The generator saw it leave, and stepped it a few times (it would have gone on for 255 steps, beside the
    # others' 149).
    assert stats["left"] == 1
    assert stats["rows"] - 2 * 149 < 50
    assert served.state["generator"].stats.cancelled == 1


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "", "max_tokens": 5},
        {"prompt": "x" * 257, "max_tokens": 5},
        {"prompt": "ok", "max_tokens": 0},
        {"prompt": "ok", "max_tokens": MAX_TOKENS + 1},
        {"max_tokens": 5},
    ],
)
async def test_a_bad_request_is_422_and_reaches_no_batch(served: ThreadServer, body: dict[str, Any]) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
        response = await client.post("/generate", json=body)
        stats = await _stats(client)
    assert response.status_code == 422
    assert stats["prefilled"] == 0 and served.state["generator"].stats.submitted == 0
