"""Taking over from an owner that left, when it goes wrong (the lock file cannot be opened, the factory fails, a
client connects as the owner leaves, the client stops while it takes over) and when it goes right: process_many
calls, streams and timeouts across the hand-over."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from async_batcher import OutcomeUnknownError, OwnerUnavailableError
from async_batcher.shared import SharedBatcher
from tests.loops import until
from tests.shared.models import Model
from tests.shared.test_socket import exists


async def test_a_lock_file_that_cannot_be_opened_does_not_end_the_search_for_an_owner(
    address: str, loop_errors: list[dict[str, Any]]
) -> None:
    # The client races for the lock when the owner leaves; opening the lock file fails (a directory there: EISDIR,
    # as EMFILE would). It must look again, not end its search (its items then waited for nobody).
    owner = SharedBatcher(Model, address=address, name="m")
    client = SharedBatcher(Model, address=address, name="m", owner_wait=10)
    await owner.__aenter__()
    await client.__aenter__()
    seat = client._seat
    assert seat is not None and seat.supervisor is not None
    supervisor = seat.supervisor
    try:
        await until(lambda: seat.client.link is not None)  # (connected: the owner's leaving reaches it)
        lock = address + ".lock"
        os.rename(lock, lock + ".old")
        os.mkdir(lock)
        await owner.stop()
        pending = asyncio.ensure_future(client.process(1))
        await until(lambda: supervisor.done() or isinstance(seat.client.takeover_error, IsADirectoryError))
        assert not supervisor.done()
        os.rmdir(lock)
        async with asyncio.timeout(10):
            assert await pending == 2
        assert client.role == "owner"
    finally:
        await client.stop(force=True)
        await owner.stop()
    assert not loop_errors


async def test_an_item_held_while_the_factory_fails_to_take_over_says_why(address: str) -> None:
    made: list[Model] = []

    async def make() -> Model:
        if made:
            raise ValueError("no model file at /models/m.keras")
        made.append(Model(max_queue_time=0))
        return made[-1]

    owner = SharedBatcher(make, address=address, name="m")
    client = SharedBatcher(make, address=address, name="m", owner_wait=1.5)
    await owner.__aenter__()
    await client.__aenter__()
    try:
        seat = client._seat
        assert seat is not None
        await until(lambda: seat.client.link is not None)
        await owner.stop()
        with pytest.raises(OwnerUnavailableError, match=r"no model file at /models/m\.keras") as raised:
            await client.process(1)
        assert isinstance(raised.value.__cause__, ValueError)
    finally:
        await client.stop()


async def test_a_client_connecting_as_the_owner_leaves_is_not_left_hanging_in_its_handshake(address: str) -> None:
    # The client connects as the owner stops: its connection is in the socket's queue, not yet accepted, as the
    # owner closes the socket. It must be closed (the client then takes over at once), not left open with nobody
    # behind it until the handshake's timeout (10 s: longer than an item may wait for an owner).
    owner = SharedBatcher(Model, address=address, name="m")
    client = SharedBatcher(Model, address=address, name="m", owner_wait=5)
    await owner.__aenter__()
    await client.__aenter__()  # (connecting)
    try:
        await owner.stop()
        async with asyncio.timeout(3):
            assert await client.process(1) == 2
        assert client.role == "owner"
    finally:
        await client.stop()
        await owner.stop()


async def test_a_client_that_stops_while_its_factory_takes_over_leaves_no_owner_behind(address: str) -> None:
    # The client won the lock and its factory loads when its stop() comes: once the stop returns, nothing of an
    # owner may be left (a batcher running, the lock held, the socket bound, clients served by a stopped batcher).
    gate = asyncio.Event()
    made: list[Model] = []

    async def make() -> Model:
        if made:
            await gate.wait()
        made.append(Model(max_queue_time=0))
        return made[-1]

    owner = SharedBatcher(make, address=address, name="m")
    client = SharedBatcher(make, address=address, name="m")
    await owner.__aenter__()
    await client.__aenter__()
    seat = client._seat
    assert seat is not None
    try:
        await until(lambda: seat.client.link is not None)
        await owner.stop()
        held = asyncio.ensure_future(client.process(5))  # (held: its stop waits for it)
        await until(lambda: seat.election.held)  # its factory waits
        stopping = asyncio.ensure_future(client.stop())
        await asyncio.sleep(0)
        gate.set()
        async with asyncio.timeout(10):
            await stopping
            assert await held == 10
        assert len(made) == 2
        assert not await made[1].is_running()
        assert not seat.election.held and not exists(address)
        async with SharedBatcher(make, address=address, name="m", role="owner") as again:  # the address is free
            assert await again.process(1) == 2
    finally:
        gate.set()
        await client.stop()
        await owner.stop()


async def test_process_many_and_streams_cross_a_hand_over(address: str) -> None:
    # Calls sent to the owner before it leaves are answered by it (it drains); those made while it leaves are held,
    # then answered by the client that takes over.
    gate = asyncio.Event()
    made: list[Model] = []

    async def make() -> Model:
        made.append(Model(gate=None if made else gate, max_batch_size=4, max_queue_time=0))
        return made[-1]

    owner = SharedBatcher(make, address=address, name="m")
    client = SharedBatcher(make, address=address, name="m")
    await owner.__aenter__()
    await client.__aenter__()
    seat = client._seat
    assert seat is not None
    try:
        await until(lambda: seat.client.link is not None)
        sent = asyncio.ensure_future(client.process_many([1, 2, 3]))
        sent_stream = asyncio.ensure_future(_parts(client, 4))
        await until(lambda: owner.stats.submitted == 4)
        leaving = asyncio.ensure_future(owner.stop())
        await until(lambda: seat.client.leaving)
        held = asyncio.ensure_future(client.process_many([5, 6]))
        held_stream = asyncio.ensure_future(_parts(client, 7))
        held_late = asyncio.ensure_future(client.process(8, timeout=0.05))  # (its deadline passes while held)
        with pytest.raises(TimeoutError):
            await held_late
        gate.set()
        async with asyncio.timeout(10):
            await leaving
            assert await sent == [2, 4, 6] and await sent_stream == [8]
            assert await held == [10, 12] and await held_stream == [14]
        assert sorted(made[0].items) == [1, 2, 3, 4] and sorted(made[1].items) == [5, 6, 7]  # (8 never sent)
    finally:
        gate.set()
        await client.stop()
        await owner.stop()


async def _parts(shared: SharedBatcher[Any, Any], item: Any) -> list[Any]:
    return [part async for part in shared.stream(item)]


async def test_a_process_many_call_still_queued_when_the_connection_drops_is_sent_again(address: str) -> None:
    # The connection drops (as when the owner dies): the item in a batch is "outcome unknown"; the process_many call
    # still queued is withdrawn by the owner, sent again by the client, and answered once.
    gate = asyncio.Event()

    async def make() -> Model:
        return Model(gate=gate, max_batch_size=4, max_queue_time=0, concurrency=1)

    owner = SharedBatcher(make, address=address, name="m")
    client = SharedBatcher(make, address=address, name="m")
    await owner.__aenter__()
    await client.__aenter__()
    seat = client._seat
    assert seat is not None and owner.batcher is not None
    model = owner.batcher
    assert isinstance(model, Model)
    try:
        await until(lambda: seat.client.link is not None)
        first = asyncio.ensure_future(client.process(0))  # (in the batch the gate holds)
        await until(lambda: model.batches)
        queued = asyncio.ensure_future(client.process_many([1, 2, 3]))
        await until(lambda: owner.stats.submitted == 4)
        link = seat.client.link
        assert link is not None
        link.abort()
        await until(lambda: seat.client.link is not None and seat.client.link is not link)  # (connected again)
        with pytest.raises(OutcomeUnknownError):
            await first  # (it had gone)
        gate.set()
        async with asyncio.timeout(10):
            assert await queued == [2, 4, 6]
        assert sorted(model.items) == [0, 1, 2, 3]  # each once
    finally:
        gate.set()
        await client.stop()
        await owner.stop()
