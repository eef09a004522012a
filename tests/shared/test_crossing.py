"""What crosses between the processes, pushed: a value that pickles but does not unpickle on the other side (its
neighbours in the frame must not pay for it), numpy arrays of every layout through the out-of-band path, a storm of
cancellations, and the owner's batcher with its admission, retry and isolation settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from async_batcher import AsyncBatcher, NotPicklableError
from tests.loops import until
from tests.shared.models import Model
from tests.shared.test_contract import model_of, pair


def _refuse(what: str) -> Any:
    raise RuntimeError(f"{what} cannot be rebuilt here")


class Stranger:
    """Pickles, and fails to unpickle (as an object of a class the other process cannot import does)."""

    def __reduce__(self) -> Any:
        return (_refuse, ("a Stranger",))


class Answers(AsyncBatcher[Any, Any]):
    """Answers "stranger" with a Stranger, anything else with itself; streams as many parts as asked, the second of
    "stranger parts" a Stranger."""

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        return [Stranger() if x == "stranger" else x for x in batch]


class Parts(AsyncBatcher[Any, Any]):
    async def process_batch(self, batch: list[Any]) -> AsyncIterator[list[Any]]:
        from async_batcher import END

        for step in range(STEPS + 1):  # (more parts than the owner sends ahead of its reader)
            yield [
                Stranger() if x == "stranger" and step == 1 else (END if step == STEPS else f"{x}{step}") for x in batch
            ]


STEPS = 40


async def test_an_item_that_does_not_unpickle_in_the_owner_fails_alone(address: str) -> None:
    async with pair(address, Model) as (owner, client):
        outcomes = await asyncio.gather(
            client.process(1), client.process(Stranger()), client.process(2), return_exceptions=True
        )  # (one turn: one frame)
        assert outcomes[0] == 2 and outcomes[2] == 4, outcomes
        assert isinstance(outcomes[1], NotPicklableError) and "a Stranger cannot be rebuilt" in str(outcomes[1])
        assert sorted(model_of(owner).items) == [1, 2]


async def test_a_result_that_does_not_unpickle_in_the_client_fails_its_caller_alone(address: str) -> None:
    async with pair(address, Answers) as (_, client):
        outcomes = await asyncio.gather(
            client.process(1), client.process("stranger"), client.process(2), return_exceptions=True
        )  # (one batch: its answers in one frame)
        assert outcomes[0] == 1 and outcomes[2] == 2, outcomes
        assert isinstance(outcomes[1], NotPicklableError) and "does not unpickle in this process" in str(outcomes[1])


async def test_a_stream_part_that_does_not_unpickle_ends_that_stream_alone(address: str) -> None:
    async def make() -> Parts:
        return Parts(max_queue_time=0.01, concurrency=1)

    async with pair(address, make) as (owner, client):

        async def parts(item: str) -> list[Any]:
            got: list[Any] = []
            try:
                async for part in client.stream(item):
                    got.append(part)
            except NotPicklableError as exc:
                got.append(exc)
            return got

        async with asyncio.timeout(10):
            broken, fine = await asyncio.gather(parts("stranger"), parts("a"))
            assert fine == [f"a{step}" for step in range(STEPS)]
            assert broken[0] == "stranger0" and isinstance(broken[1], NotPicklableError) and len(broken) == 2
            await until(lambda: owner.stats.in_flight == 0)  # the owner's side of it ended too
            assert await parts("b") == [f"b{step}" for step in range(STEPS)]
