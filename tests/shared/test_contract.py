"""The contract across the boundary, with the owner and a client in this process, on a real Unix socket: what a
caller of a client gets is what a caller of the batcher itself would get."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from async_batcher import (
    AsyncBatcher,
    LateRefusalError,
    MessageTooLargeError,
    NotPicklableError,
    QueueFullException,
)
from async_batcher.shared import SharedBatcher
from tests.loops import until
from tests.shared.models import Keyed, Model, Odd, Steps


@contextlib.asynccontextmanager
async def pair(
    address: str, factory: Callable[[], Any], **kwargs: Any
) -> AsyncIterator[tuple[SharedBatcher[Any, Any], SharedBatcher[Any, Any]]]:
    """An owner and a client of it, both started; stopped (client first) on the way out."""
    owner = SharedBatcher(factory, address=address, name="shared", **kwargs)
    client = SharedBatcher(factory, address=address, name="shared", **kwargs)
    async with owner:
        assert owner.role == "owner"
        async with client:
            assert client.role == "client"
            await until(lambda: client._seat is not None and client._seat.client.link is not None, within=10)
            yield owner, client


def model_of(owner: SharedBatcher[Any, Any]) -> Any:
    assert owner.batcher is not None
    return owner.batcher


async def test_results_come_back_and_clients_share_the_owners_batches(address: str) -> None:
    async def make() -> Model:
        return Model(max_batch_size=64, max_queue_time=0.05)

    async with pair(address, make) as (owner, client):
        mine = [owner.process(i) for i in range(3)]
        theirs = [client.process(i) for i in range(3, 6)]
        assert list(await asyncio.gather(*mine, *theirs)) == [0, 2, 4, 6, 8, 10]
        assert sorted(model_of(owner).items) == list(range(6))
        assert len(model_of(owner).batches) == 1  # one batch for the callers of both processes


async def test_exceptions_cross_with_their_type_and_the_owners_traceback(address: str) -> None:
    async with pair(address, Model) as (_, client):
        outcomes = await asyncio.gather(client.process("fail"), client.process(1), return_exceptions=True)
        assert isinstance(outcomes[0], ValueError) and str(outcomes[0]) == "this item failed"
        assert outcomes[1] == 2
        with pytest.raises(RuntimeError, match="the whole batch failed") as raised:
            await client.process("raise")
        assert "Traceback in the owner" in "".join(raised.value.__notes__)


async def test_what_does_not_cross_fails_its_caller_alone_naming_its_type(address: str) -> None:
    async with pair(address, Odd) as (owner, client):
        outcomes: Any = await asyncio.gather(
            client.process("lock"), client.process("exc"), client.process("fine"), return_exceptions=True
        )
        lock, exc, fine = outcomes
        assert isinstance(lock, NotPicklableError) and "the result of type _thread.lock" in str(lock)
        assert isinstance(exc, NotPicklableError) and "tests.shared.models.Unpicklable" in str(exc)
        assert "no way back" in str(exc)
        assert fine == "fine"
        sent = owner.stats.submitted
        outcomes = await asyncio.gather(client.process(lambda: 1), client.process("x"), return_exceptions=True)
        item, other = outcomes
        assert isinstance(item, NotPicklableError) and "the item of type function" in str(item)
        assert other == "x"
        assert owner.stats.submitted == sent + 1  # the unpicklable item was never sent


async def test_a_cancelled_caller_withdraws_its_item_and_a_timeout_too(address: str) -> None:
    gate = asyncio.Event()

    async def make() -> Model:
        return Model(gate=gate, max_batch_size=1, max_queue_time=0, concurrency=1)

    async with pair(address, make) as (owner, client):
        first = asyncio.ensure_future(client.process(1))
        await until(lambda: model_of(owner).batches)
        cancelled = asyncio.ensure_future(client.process(2))
        timed = asyncio.ensure_future(client.process(3, timeout=0.2))
        await until(lambda: owner.stats.submitted == 3)
        cancelled.cancel()
        with pytest.raises(TimeoutError):
            await timed
        await until(lambda: owner.stats.cancelled == 1)
        gate.set()
        assert await first == 2
        assert model_of(owner).items == [1]  # neither the cancelled item nor the late one reached the model
        stats = owner.stats
        assert (stats.cancelled, stats.timed_out) == (1, 1)  # counted by the owner as in one process


async def test_priorities_keys_and_dedup_apply_in_the_owner(address: str) -> None:
    gate = asyncio.Event()

    async def make() -> Keyed:
        return Keyed(gate=gate, max_batch_size=10, max_queue_time=0, concurrency=1)

    async with pair(address, make) as (owner, client):
        first = asyncio.ensure_future(client.process(("a", 0)))
        await until(lambda: model_of(owner).batches)
        calls = [
            client.process(("c", 1), priority=5),
            client.process(("c", 2), priority=-5),
            client.process(("b", 9)),
            client.process(("c", 3), priority=-5),
            client.process(("c", 2), priority=-5),  # shares the row of the first ("c", 2)
        ]
        tasks = [asyncio.ensure_future(c) for c in calls]
        await until(lambda: owner.stats.submitted == 6)
        gate.set()
        assert await first == "a:0"
        assert list(await asyncio.gather(*tasks)) == ["c:1", "c:2", "b:9", "c:3", "c:2"]
        batches = model_of(owner).batches
        assert batches[0] == [("a", 0)]
        # By key; in a key's batch, the higher priority first; the twin took no row.
        assert sorted(batches[1:]) == [[("b", 9)], [("c", 2), ("c", 3), ("c", 1)]]
        assert owner.stats.deduplicated == 1


async def test_a_full_queue_refuses_across_with_its_retry_after(address: str) -> None:
    gate = asyncio.Event()

    async def make() -> Model:
        return Model(gate=gate, max_batch_size=1, max_queue_time=0, concurrency=1, max_queue_size=1)

    async with pair(address, make) as (owner, client):
        first = asyncio.ensure_future(client.process(1))
        await until(lambda: model_of(owner).batches)
        second = asyncio.ensure_future(client.process(2))
        await until(lambda: owner.stats.submitted == 2)
        with pytest.raises(QueueFullException):
            await client.process(3)
        gate.set()
        assert (await first, await second) == (2, 4)
    refused = LateRefusalError("late", predicted=2.0, budget=1.0, retry_after=3.0)
    copy = pickle.loads(pickle.dumps(refused))
    assert (type(copy), copy.retry_after, copy.predicted) == (LateRefusalError, 3.0, 2.0)


async def test_process_many_and_stream_cross(address: str) -> None:
    async with pair(address, Model) as (_, client):
        assert await client.process_many([1, 2, 3]) == [2, 4, 6]
        outcomes = await client.process_many([1, "fail"], return_exceptions=True)
        assert outcomes[0] == 2 and isinstance(outcomes[1], ValueError)
        with pytest.raises(ValueError, match="this item failed"):
            await client.process_many([1, "fail"])
    async with pair(address, Steps) as (_, client):
        assert [part async for part in client.stream(3)] == [3, 2, 1]
        many = [part async for part in client.stream(40)]  # more parts than the window ahead
        assert many == list(range(40, 0, -1))
        with pytest.raises(TypeError, match="iterate stream"):
            await client.process(1)


async def test_stats_of_the_owner_reach_a_client(address: str) -> None:
    async with pair(address, Model) as (owner, client):
        assert client.stats.submitted == 0
        await asyncio.gather(*(client.process(i) for i in range(5)))
        fetched = await client.fetch_stats()
        assert fetched.submitted == owner.stats.submitted == 5
        assert client.stats is fetched


async def test_a_turns_items_travel_in_one_frame_and_a_batchs_results_in_one(address: str) -> None:
    async def make() -> Model:
        return Model(max_batch_size=100, max_queue_time=0.01)

    async with pair(address, make) as (owner, client):
        assert client._seat is not None and owner._seat is not None and owner._seat.owner is not None
        link = client._seat.client.link
        assert link is not None
        (answers,) = owner._seat.owner.links
        sent, received = link.frames_out, answers.frames_out
        assert list(await asyncio.gather(*(client.process(i) for i in range(50)))) == [2 * i for i in range(50)]
        assert link.frames_out - sent == 1
        assert answers.frames_out - received == 1


async def test_numpy_arrays_cross_out_of_band(address: str) -> None:
    np = pytest.importorskip("numpy")

    class Echo(AsyncBatcher[Any, Any]):
        async def process_batch(self, batch: list[Any]) -> list[Any]:
            return [x + 1 for x in batch]

    async with pair(address, Echo) as (_, client):
        small, large = np.arange(10), np.arange(1_000_000, dtype=np.float64)
        got_small, got_large = await asyncio.gather(client.process(small), client.process(large))
        assert (got_small == small + 1).all() and (got_large == large + 1).all()
        assert got_large.flags.writeable


async def test_items_and_results_over_the_size_limit_are_refused_alone(address: str) -> None:
    async with pair(address, Odd, max_message_size=1024 * 1024) as (_, client):
        outcomes: Any = await asyncio.gather(
            client.process(b"x" * 2_000_000), client.process(1), return_exceptions=True
        )
        too_big, fine = outcomes
        assert isinstance(too_big, MessageTooLargeError) and too_big.limit == 1024 * 1024
        assert "the item of type bytes" in str(too_big)
        assert fine == 1
        with pytest.raises(MessageTooLargeError, match="the result of type bytes"):
            await client.process("big")
        assert await client.process(2) == 2
