"""Tests of the FastAPI guide's app, each running its lifespan around the requests.

pytest docs/snippets/fastapi_testing.py
(pip install pytest pytest-asyncio asgi-lifespan httpx)
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi.testclient import TestClient

from docs.snippets.fastapi_app import app  # your app


def test_score() -> None:
    # As a context manager, TestClient runs the lifespan: the batcher starts,
    # and on exit it drains and stops.
    with TestClient(app) as client:
        response = client.post("/score", json={"values": [1, 2, 3, 4]})
    assert response.status_code == 200
    assert response.json() == 10.0


@pytest.mark.asyncio  # (pytest-asyncio; needless with asyncio_mode = "auto")
async def test_score_concurrently() -> None:
    # httpx's ASGITransport does not run the lifespan (the batcher would never
    # start): LifespanManager runs it around the client.
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test"
        ) as client:
            responses = await asyncio.gather(
                *(
                    client.post("/score", json={"values": [i, 1, 2, 3]})
                    for i in range(4)
                )
            )
    assert [response.json() for response in responses] == [6.0, 7.0, 8.0, 9.0]
