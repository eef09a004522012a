"""Hand-over in one process: an owner that stops drains what it accepted while its clients hold what comes next for
the next owner, one of them (role "auto"), which takes over."""

from __future__ import annotations

import asyncio

import pytest

from async_batcher import OutcomeUnknownError
from async_batcher.shared import SharedBatcher, _board
from tests.loops import until
from tests.shared.models import Keyed, Model


async def test_an_owner_that_stops_drains_and_a_client_takes_over(address: str) -> None:
    gate = asyncio.Event()
    models: list[Model] = []

    async def make() -> Model:
        models.append(Model(gate=gate if not models else None, max_batch_size=5, max_queue_time=0, concurrency=1))
        return models[-1]

    first = SharedBatcher(make, address=address, name="m")
    second = SharedBatcher(make, address=address, name="m")
    await first.__aenter__()
    await second.__aenter__()
    try:
        assert (first.role, second.role) == ("owner", "client")
        accepted = [asyncio.ensure_future(second.process(i)) for i in range(5)]
        await until(lambda: len(models[0].items) == 5)
        leaving = asyncio.ensure_future(first.stop())
        await until(lambda: second._seat is not None and second._seat.client.leaving)
        held = [asyncio.ensure_future(second.process(i)) for i in range(5, 10)]
        await asyncio.sleep(0.05)
        assert len(models) == 1 and models[0].items == [0, 1, 2, 3, 4]  # held, not sent to the owner leaving
        gate.set()
        await leaving
        assert list(await asyncio.gather(*accepted, *held)) == [2 * i for i in range(10)]
        assert second.role == "owner"
        assert models[1].items == [5, 6, 7, 8, 9]
        assert await second.process(10) == 20  # its own callers now go straight to its batcher
    finally:
        await first.stop()
        await second.stop()


async def test_a_stopping_client_never_takes_over_and_stopping_all_at_once_does_not_hang(address: str) -> None:
    made: list[Model] = []

    async def make() -> Model:
        model = Model(max_batch_size=5, max_queue_time=0)
        made.append(model)
        return model

    batchers = [SharedBatcher(make, address=address, name="m", owner_wait=2) for _ in range(3)]
    for b in batchers:
        await b.__aenter__()
    assert [b.role for b in batchers] == ["owner", "client", "client"]
    assert list(await asyncio.gather(*(b.process(i) for i, b in enumerate(batchers)))) == [0, 2, 4]
    async with asyncio.timeout(10):
        await asyncio.gather(*(b.stop() for b in batchers))
    assert len(made) == 1  # nobody took over from an owner leaving while they stopped too


async def test_a_client_told_the_owner_leaves_lets_go_once_answered(address: str) -> None:
    # An owner that says it leaves but never closes (its loop stopped with the socket open, say) must not keep a
    # client waiting on it: the client closes its end once its calls are answered, and looks for the next owner.
    owner = SharedBatcher(Model, address=address, name="m")
    client = SharedBatcher(Model, address=address, name="m", owner_wait=5)
    async with owner, client:
        assert owner._seat is not None and owner._seat.owner is not None and client._seat is not None
        assert await client.process(1) == 2
        link = client._seat.client.link
        assert link is not None
        owner._seat.owner.leave()  # LEAVING, and nothing more
        await until(lambda: link.closed, within=10)


async def test_a_connection_still_in_its_handshake_is_closed_when_the_owner_leaves(address: str) -> None:
    async with SharedBatcher(Model, address=address, name="m") as owner:
        reader, writer = await asyncio.open_unix_connection(address)  # connected: the owner's hello comes
        await reader.readexactly(4)
        assert owner._seat is not None
    async with asyncio.timeout(10):
        rest = await reader.read()  # the end, not a connection left open after the owner is gone
    assert len(rest) < 1024
    writer.close()


async def _one_long_call_then_twenty(address: str, at_once: bool) -> None:
    """A board of 8 slots; a client's call stays in its batch while 20 others pass (one by one, or all at once: more
    unresolved calls than slots), then the connection drops, as when the owner dies: the long call's outcome is
    unknown, and it was processed once, never sent again."""
    models: list[Model] = []

    async def make() -> Model:
        models.append(Model(max_batch_size=1, max_queue_time=0, concurrency=2))
        return models[-1]

    owner = SharedBatcher(make, address=address, name="m")
    client = SharedBatcher(make, address=address, name="m")
    await owner.__aenter__()
    await client.__aenter__()
    try:
        assert (owner.role, client.role) == ("owner", "client")
        long = asyncio.ensure_future(client.process(["sleep", 30]))
        await until(lambda: len(models[0].batches) == 1)
        if at_once:
            assert await asyncio.gather(*(client.process(i) for i in range(20))) == [2 * i for i in range(20)]
        else:
            assert [await client.process(i) for i in range(20)] == [2 * i for i in range(20)]
        seat = client._seat
        assert seat is not None and seat.client.link is not None
        seat.client.link.abort()
        with pytest.raises(OutcomeUnknownError):
            await asyncio.wait_for(long, 10)
        assert models[0].items.count(["sleep", 30]) == 1
    finally:
        await client.stop(force=True)
        await owner.stop(force=True)


async def test_a_call_unresolved_while_many_pass_keeps_its_mark_on_the_gone_board(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The 20 items answered one by one while the first stays in its batch would reuse its slot twice, overwriting its
    # mark, were ids given without looking (it was then sent again after it had gone).
    monkeypatch.setattr(_board, "SLOTS", 8)
    await _one_long_call_then_twenty(address, at_once=False)


async def test_calls_crowded_past_the_boards_slots_are_taken_as_gone(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More unresolved calls than slots: ids share slots, and a call whose mark another overwrote is still reported as
    # an outcome unknown, never sent again.
    monkeypatch.setattr(_board, "SLOTS", 8)
    await _one_long_call_then_twenty(address, at_once=True)


async def test_an_item_that_joins_a_row_in_flight_is_marked_gone_with_it(address: str) -> None:
    # dedup_key: B's item joins the row of A's identical item, already in a batch. When the connections drop (as
    # when the owner dies), B's item went with that batch: "outcome unknown", never sent again (which would
    # process it a second time). Identical items still queued are sent again, and processed once.
    gate = asyncio.Event()

    async def make() -> Keyed:
        return Keyed(gate=gate, max_batch_size=4, max_queue_time=0, concurrency=1)

    owner = SharedBatcher(make, address=address, name="m")
    a, b = SharedBatcher(make, address=address, name="m"), SharedBatcher(make, address=address, name="m")
    for shared in (owner, a, b):
        await shared.__aenter__()
    try:
        seats = [a._seat, b._seat]
        await until(lambda: all(s is not None and s.client.link is not None for s in seats))
        model = owner.batcher
        assert isinstance(model, Keyed)
        first = asyncio.ensure_future(a.process(("k", 1)))
        await until(lambda: model.batches)
        joined = asyncio.ensure_future(b.process(("k", 1)))  # joins the row in flight
        queued = [asyncio.ensure_future(c.process(("k", 2))) for c in (a, b)]  # a row waiting, shared by both
        await until(lambda: owner.stats.submitted == 4)
        for seat in seats:
            assert seat is not None and seat.client.link is not None
            seat.client.link.abort()
        for call in (first, joined):
            with pytest.raises(OutcomeUnknownError):
                await asyncio.wait_for(call, 10)
        gate.set()
        async with asyncio.timeout(10):
            assert await asyncio.gather(*queued) == ["k:2", "k:2"]
        assert sorted(x for batch in model.batches for x in batch) == [("k", 1), ("k", 2)]  # each once
    finally:
        gate.set()
        for shared in (b, a, owner):
            await shared.stop()
