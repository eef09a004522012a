"""What gets in, over HTTP (issue 46): a late refusal is a 503 with the Retry-After it computed, an oversized item a
413; and the refusals by reason in the Prometheus metrics."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from async_batcher import AsyncBatcher, LateRefusalError, OversizedItemError, QueueFullException
from async_batcher.fastapi import add_batcher_exception_handlers, batcher_lifespan
from async_batcher.metrics import register_batcher
from tests.api.test_metrics import scrape, value
from tests.servers import ThreadServer


class Slow(AsyncBatcher[bytes, int]):
    """A batch of n takes 0.2 + 0.1·n seconds (in a thread); an item weighs its length; ``hold`` keeps a batch."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def item_weight(self, item: bytes) -> float:
        return len(item)

    def process_batch(self, batch: list[bytes]) -> list[int]:
        self.entered.set()
        if not self.hold.wait(30):
            raise TimeoutError("never released")
        return [len(x) for x in batch]


def _app(batcher: Slow) -> FastAPI:
    app = FastAPI(lifespan=batcher_lifespan(batcher))
    add_batcher_exception_handlers(app, retry_after=7)

    @app.post("/size")
    async def size(body: dict[str, Any]) -> int:
        return await batcher.process(body["data"].encode(), timeout=body.get("timeout"))

    return app


@pytest.mark.single_loop
async def test_oversized_is_413_and_late_is_503_with_its_computed_retry_after() -> None:
    batcher = Slow(max_queue_weight=100, refuse_late=True, max_queue_time=0, default_timeout=60.0)
    server = ThreadServer(_app(batcher))
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            too_big = await client.post("/size", json={"data": "x" * 101})
            assert too_big.status_code == 413 and "Retry-After" not in too_big.headers
            assert "can never fit in max_queue_weight=100" in too_big.json()["detail"]
            lateness = batcher._admission.late.lateness
            assert lateness is not None
            for _ in range(10):  # batches measured: as if each took 2 s
                lateness.observe(1, 0.0, 2.0)
            batcher.hold.clear()
            first = asyncio.ensure_future(client.post("/size", json={"data": "a"}))
            await asyncio.to_thread(batcher.entered.wait, 30)
            late = await client.post("/size", json={"data": "b", "timeout": 0.5})  # a 2 s batch ahead of it
            assert late.status_code == 503
            assert "predicted to miss its deadline" in late.json()["detail"]
            assert int(late.headers["Retry-After"]) >= 2  # its own, not the default 7
            batcher.hold.set()
            assert (await first).json() == 1
    finally:
        batcher.hold.set()
        server.begin_shutdown()
        server.join()
    assert dict(batcher.stats.rejected_reasons) == {"oversized": 1, "late": 1}


@pytest.mark.virtual_time
async def test_the_refusals_by_reason_are_metrics() -> None:
    batcher = Slow(max_queue_weight=10, max_queue_time=0, default_timeout=60.0)
    registry = CollectorRegistry()
    register_batcher(batcher, registry)
    with pytest.raises(OversizedItemError):
        await batcher.process(b"x" * 11)
    batcher.refuse_late = True
    assert await batcher.process(b"z") == 1  # (measuring from the first call after it is turned on)
    lateness = batcher._admission.late.lateness
    assert lateness is not None
    for _ in range(10):
        lateness.observe(1, 0.0, 2.0)
    batcher.hold.clear()
    batcher.entered.clear()
    first = asyncio.ensure_future(batcher.process(b"a"))
    await asyncio.to_thread(batcher.entered.wait, 30)
    with pytest.raises(LateRefusalError):
        await batcher.process(b"b", timeout=0.5)
    batcher.hold.set()
    await first
    samples = scrape(registry)
    assert value(samples, "async_batcher_rejected_items_total", batcher="Slow", reason="oversized") == 1
    assert value(samples, "async_batcher_rejected_items_total", batcher="Slow", reason="late") == 1
    assert value(samples, "async_batcher_items_total", batcher="Slow", outcome="rejected") == 2
    await batcher.stop()


@pytest.mark.parametrize("computed", [0.0, 1e-6, 1.2])
async def test_a_computed_retry_after_is_never_0_seconds(computed: float) -> None:
    # A refusal that computed 0 (or less than a second) sent "Retry-After: 0", which invites an immediate retry.
    app = FastAPI()
    add_batcher_exception_handlers(app, retry_after=7)

    @app.get("/late")
    async def late() -> None:
        raise LateRefusalError("late", predicted=1.0, budget=0.5, retry_after=computed)

    @app.get("/full")
    async def full() -> None:
        raise QueueFullException("full", retry_after=computed)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for path in ("/late", "/full"):
            response = await client.get(path)
            assert response.status_code == 503
            assert response.headers["Retry-After"] == ("2" if computed > 1 else "1")
