"""What crosses between the processes, pushed: a value that pickles but does not unpickle on the other side (its
neighbours in the frame must not pay for it), numpy arrays of every layout through the out-of-band path, a storm of
cancellations, and the owner's batcher with its admission, retry and isolation settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from async_batcher import AsyncBatcher, NotPicklableError, OutcomeUnknownError
from async_batcher.shared import SharedBatcher
from tests.loops import until
from tests.shared.models import Model, Odd
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


async def test_numpy_arrays_of_every_layout_cross_both_ways(address: str) -> None:
    np = pytest.importorskip("numpy")

    class Echo(AsyncBatcher[Any, Any]):
        async def process_batch(self, batch: list[Any]) -> list[Any]:
            return [(x.shape, x.dtype.str, x) for x in batch]

    async with pair(address, Echo) as (_, client):
        square = np.arange(4_000_000, dtype=np.float64).reshape(2000, 2000)  # 32 MB, out of band
        frozen = np.arange(300_000, dtype=np.int32)
        frozen.setflags(write=False)
        items = [
            square,
            square[:, ::2],  # not contiguous: in band
            square.T,  # Fortran order
            frozen,  # read-only
            np.zeros((0, 5)),
            np.zeros(100_000, dtype=[("a", "<i4"), ("b", "<f8")]),  # structured
            np.arange(10),  # small: in band
        ]
        for x, (shape, dtype, back) in zip(
            items, await asyncio.gather(*(client.process(x) for x in items)), strict=True
        ):
            assert (shape, dtype) == (x.shape, x.dtype.str) and back.shape == x.shape and back.dtype == x.dtype
            assert np.array_equal(back, x)


async def test_ten_thousand_callers_cancelled_at_once_are_all_withdrawn(address: str) -> None:
    gate = asyncio.Event()

    async def make() -> Model:
        return Model(gate=gate, max_batch_size=1, max_queue_time=0, concurrency=1)

    async with pair(address, make) as (owner, client):
        first = asyncio.ensure_future(client.process(-1))
        await until(lambda: model_of(owner).batches)
        plain = [asyncio.ensure_future(client.process(i)) for i in range(10_000)]  # (the owner's short path)
        timed = [asyncio.ensure_future(client.process(i, timeout=60)) for i in range(10_000, 12_000)]  # (its long one)
        await until(lambda: owner.stats.submitted == 12_001, within=60)
        for task in plain + timed:
            task.cancel()
        await until(lambda: owner.stats.cancelled == 12_000, within=60)
        gate.set()
        assert await first == -2
        assert model_of(owner).items == [-1]  # not one of them reached the model
        assert all(task.cancelled() for task in plain + timed)
        assert await client.process(5) == 10


async def test_room_waits_and_refusals_of_the_owners_batcher_hold_for_a_client(address: str) -> None:
    gate = asyncio.Event()

    async def make() -> Model:
        return Model(
            gate=gate, max_batch_size=1, max_queue_time=0, concurrency=1, max_queue_size=2, wait_when_full=True
        )

    async with pair(address, make) as (owner, client):
        first = asyncio.ensure_future(client.process(1))
        await until(lambda: model_of(owner).batches)
        waiting = [asyncio.ensure_future(client.process(i)) for i in range(2, 6)]  # 2 queued, 2 waiting for room
        await until(lambda: owner.stats.awaiting_room == 2)
        waiting[3].cancel()  # (leaves its place in line)
        with pytest.raises(TimeoutError):
            await client.process(99, timeout=0.1)  # (times out waiting for room)
        gate.set()
        assert await first == 2
        assert list(await asyncio.gather(*waiting[:3])) == [4, 6, 8]
        assert sorted(model_of(owner).items) == [1, 2, 3, 4]

    async def late() -> Model:
        return Model(max_queue_time=0, refuse_late=True)

    async with pair(address, late) as (_, client):
        with pytest.raises(ValueError, match="refuse_late=True, but this call has no deadline"):
            await client.process(1)
        assert await client.process(1, timeout=5) == 2


async def test_retries_and_isolation_of_the_owners_batcher_hold_for_a_client(address: str) -> None:
    from async_batcher.failures import Isolate, Retry, RetryPolicy

    poisoned: list[Any] = []

    class Flaky(AsyncBatcher[Any, Any]):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.seen: list[Any] = []

        async def process_batch(self, batch: list[Any]) -> list[Any]:
            self.seen.extend(batch)
            if "poison" in batch:
                raise ValueError("poisoned batch")
            return [Retry() if x == "again" and self.seen.count(x) < 2 else x for x in batch]

    async def make() -> Flaky:
        return Flaky(
            max_batch_size=8,
            max_queue_time=0.02,
            retry=RetryPolicy(attempts=3, backoff=0.01),
            on_batch_error=Isolate(on_poison=lambda item, error: poisoned.append(item)),
        )

    async with pair(address, make) as (owner, client):
        items = [1, "again", "poison", 2, 3]
        outcomes = await asyncio.gather(*(client.process(x) for x in items), return_exceptions=True)
        assert [outcomes[0], outcomes[1], *outcomes[3:]] == [1, "again", 2, 3]
        assert isinstance(outcomes[2], ValueError) and str(outcomes[2]) == "poisoned batch"
        assert poisoned == ["poison"]
        assert model_of(owner).seen.count("again") == 2


async def test_a_client_gone_while_the_owner_writes_it_large_answers_holds_nothing_up(
    address: str, loop_errors: list[dict[str, Any]]
) -> None:
    async with pair(address, Odd) as (owner, client):
        assert owner._seat is not None and owner._seat.owner is not None and client._seat is not None
        (served,) = owner._seat.owner.links
        calls = [asyncio.ensure_future(client.process("big")) for _ in range(20)]  # 40 MB of answers
        await until(lambda: served.backlog_size > 0 or served.closed)
        link = client._seat.client.link
        assert link is not None and link.transport is not None
        link.transport.abort()  # its end closes mid-answer, as when its process is killed
        await until(lambda: all(c.done() for c in calls) and served.closed, within=20)
        assert all(isinstance(c.exception(), OutcomeUnknownError) for c in calls)  # (they had gone)
        async with SharedBatcher(Odd, address=address, name="shared") as other:
            assert await other.process("x") == "x"
        assert await client.process("y") == "y"  # (it connected again)
    assert not loop_errors


def test_large_frames_are_written_whole_on_uvloop(address: str) -> None:
    # Frames over a megabyte are handed to the transport a slice at a time as its buffer drains. On uvloop (whose
    # writes wait for the loop's turn) a slice left the buffer at its high-water mark exactly: not over it, so the
    # transport never paused, nor resumed the rest: the frame's end was never written.
    np = pytest.importorskip("numpy")
    import uvloop

    class Echo(AsyncBatcher[Any, Any]):
        async def process_batch(self, batch: list[Any]) -> list[Any]:
            return batch

    async def run() -> None:
        async with pair(address, Echo) as (_, client):
            items = [
                np.arange(4_000_000, dtype=np.float64),
                np.arange(300_000, dtype=np.int32),
                np.zeros(100_000, dtype=[("a", "<i4"), ("b", "<f8")]),
            ]
            async with asyncio.timeout(20):
                answers = await asyncio.gather(*(client.process(x) for x in items))
            assert all(np.array_equal(x, y) for x, y in zip(items, answers, strict=True))

    uvloop.run(run())
