"""Stopping a shared batcher as users do: from several tasks at once, from inside the owner's process_batch (awaited,
or in a task of its own), and items submitted from inside it: each as a batcher of one process behaves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from async_batcher import AsyncBatcher, ReentrantCallError
from tests.loops import until
from tests.shared.test_contract import pair


class Hooks(AsyncBatcher[Any, Any]):
    """Does what its items say, to the shared batcher in ``self.shared``: "stop" awaits its stop, "stop later" stops
    it in a task, "again" submits an item to it; other items come back as they are."""

    shared: Any = None
    stopper: asyncio.Task[None] | None = None

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        for x in batch:
            if x == "stop":
                try:
                    async with asyncio.timeout(5):
                        await self.shared.stop()
                except Exception as exc:
                    out.append(exc)
                    continue
            elif x == "stop later":
                Hooks.stopper = asyncio.ensure_future(self.shared.stop())
            elif x == "again":
                try:
                    out.append(await self.shared.process("inner"))
                except Exception as exc:
                    out.append(exc)
                continue
            out.append(x)
        return out


def hooks() -> Hooks:
    return Hooks(max_queue_time=0, concurrency=1)


@pytest.mark.parametrize("shared", [False, True])
async def test_stop_awaited_inside_the_owners_process_batch_is_refused_at_once(address: str, shared: bool) -> None:
    if not shared:  # (what one process does: the reference)
        async with hooks() as plain:
            Hooks.shared = plain
            with pytest.raises(ReentrantCallError, match="stop"):
                await plain.process("stop")
        return
    async with pair(address, hooks) as (owner, client):
        Hooks.shared = owner
        with pytest.raises(ReentrantCallError, match="stop"):
            await client.process("stop")  # (not a wait of 5 s, then a TimeoutError)
        assert owner.role == "owner" and await client.process(1) == 1  # nothing was stopped


async def test_stop_from_a_task_of_the_owners_process_batch_hands_over(address: str) -> None:
    async with pair(address, hooks) as (owner, client):
        Hooks.shared = owner
        assert await client.process("stop later") == "stop later"
        assert Hooks.stopper is not None
        async with asyncio.timeout(10):
            await Hooks.stopper
            await until(lambda: client.role == "owner")
            assert await client.process(2) == 2


async def test_an_item_submitted_from_inside_the_owners_process_batch_is_refused_as_in_one_process(
    address: str,
) -> None:
    async with pair(address, hooks) as (owner, client):
        Hooks.shared = owner
        with pytest.raises(ReentrantCallError, match="from inside its own process_batch"):
            await client.process("again")  # (its process_batch answered the item with the error it got)


async def test_stop_called_from_many_tasks_at_once_stops_once(address: str) -> None:
    async with pair(address, hooks) as (owner, client):
        assert await client.process(1) == 1
        async with asyncio.timeout(10):
            await asyncio.gather(*(b.stop() for b in (owner, client, owner, client)), client.stop(force=True))
        assert (owner.role, client.role) == (None, None)
