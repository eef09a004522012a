"""docs/snippets/fastapi_app.py, the FastAPI guide's app, served by a real uvicorn."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.servers import ThreadServer


@pytest.mark.single_loop
async def test_the_guides_app_batches_and_refuses_a_bad_shape_alone() -> None:
    from docs.snippets.fastapi_app import app, scorer

    server = ThreadServer(app)
    server.start()
    try:
        bodies = [{"values": [i, 1, 2, 3]} for i in range(8)]
        bodies[3] = {"values": [1, 2]}  # too short: 422, and the others still answered
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            responses = await asyncio.gather(*(client.post("/score", json=body) for body in bodies))
    finally:
        server.begin_shutdown()
        server.join()
    assert [r.status_code for r in responses] == [200, 200, 200, 422, 200, 200, 200, 200]
    assert [r.json() for i, r in enumerate(responses) if i != 3] == [float(i + 6) for i in range(8) if i != 3]
    assert scorer.stats.processed == 7 and scorer.stats.batches < 7
    assert not await scorer.is_running()  # the lifespan stopped it


def test_the_guides_test_with_testclient_runs_the_lifespan() -> None:
    from docs.snippets.fastapi_app import scorer
    from docs.snippets.fastapi_testing import test_score

    before = scorer.stats.processed
    test_score()
    assert scorer.stats.processed == before + 1


async def test_the_guides_test_with_lifespan_manager_runs_the_lifespan() -> None:
    from docs.snippets.fastapi_app import scorer
    from docs.snippets.fastapi_testing import test_score_concurrently

    before = scorer.stats
    await test_score_concurrently()
    after = scorer.stats
    assert after.processed == before.processed + 4 and after.batches < before.batches + 4  # batched
    assert not await scorer.is_running()  # the lifespan stopped it


async def test_the_guides_poison_item_is_a_422_and_the_rest_of_its_batch_200() -> None:
    from asgi_lifespan import LifespanManager

    from docs.snippets.fastapi_poison import app, parser

    texts = ["1", "2", "3", "x", "5", "6", "7", "8"]
    isolated = parser.stats.isolated  # the module's batcher keeps its counts from a run on the other loop
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            responses = await asyncio.gather(*(client.post("/parse", json={"text": t}) for t in texts))
    assert [r.status_code for r in responses] == [200, 200, 200, 422, 200, 200, 200, 200]
    assert [r.json() for i, r in enumerate(responses) if i != 3] == [1, 2, 3, 5, 6, 7, 8]
    assert "cannot parse 'x'" in responses[3].json()["detail"]
    assert parser.stats.isolated == isolated + 1  # (the batches with it bisected down to it)
