"""docs/snippets/streaming_sse.py, the streaming guide's app, served by a real uvicorn."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest

from tests.servers import ThreadServer
from tests.streaming.sse import read_stream


def _spelled(prompt: str, n: int) -> list[str]:
    return list(itertools.islice(itertools.cycle(prompt), n))


@pytest.mark.single_loop
async def test_the_guides_app_streams_each_prompt_and_a_client_that_leaves_drops_out() -> None:
    from docs.snippets.streaming_sse import app, generator

    server = ThreadServer(app)
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            left, *streams = await asyncio.gather(
                read_stream(client, "leaving", 200, leave_after=2, key=None),
                read_stream(client, "abc", 30, key=None),
                read_stream(client, "hello", 45, key=None),
            )
            bad = await client.post("/generate", json={"prompt": "", "max_tokens": 3})
    finally:
        server.begin_shutdown()
        server.join()
    assert left.tokens == ["l", "e"] and left.ended is None
    assert [(s.ended, s.tokens) for s in streams] == [("end", _spelled("abc", 30)), ("end", _spelled("hello", 45))]
    assert bad.status_code == 422
    s = generator.stats
    assert (s.succeeded, s.cancelled, s.submitted) == (2, 1, 3) and s.batches < 3
    assert not await generator.is_running()  # the lifespan stopped it
