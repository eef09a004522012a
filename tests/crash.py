"""Kill a server while a batcher is busy with it, and collect every caller's outcome."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from async_batcher import AsyncBatcher
from tools.servers import LocalServer

T = TypeVar("T")
R = TypeVar("R")


async def kill_mid_run(server: LocalServer, batcher: AsyncBatcher[T, R], items: list[T], late: T) -> list[object]:
    """Submit ``items`` concurrently, kill ``server`` once the first caller has its outcome, and return every
    caller's outcome (result or exception) in order. Fails (TimeoutError) if any caller is still waiting 60 s
    later, or if ``late``, submitted after the kill, does not fail too."""
    first_done = asyncio.Event()

    async def submit(item: T) -> object:
        try:
            return await batcher.process(item)
        except Exception as error:  # each caller's own outcome
            return error
        finally:
            first_done.set()

    async with asyncio.timeout(60):  # a hang fails the test instead of blocking the suite
        async with batcher:
            tasks = [asyncio.create_task(submit(item)) for item in items]
            await first_done.wait()
            server.kill()
            outcomes = await asyncio.gather(*tasks)
            late_outcome = await submit(late)
    assert isinstance(late_outcome, Exception), f"an item submitted after the kill got {late_outcome!r}"
    errors = [o for o in outcomes if isinstance(o, Exception)]
    assert errors, "the kill happened after every item: nothing was tested"
    assert len(errors) < len(outcomes), "nothing went through before the kill"
    return outcomes
