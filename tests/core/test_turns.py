"""Contract point 1, a batch's end: while items wait, the next batch forms four turns of the event loop later, so
that the callers the loop already holds join it (a request read from its socket whose handler has yet to run; here,
tasks that the batch's end made ready). Turns, not time: the clock does not move for them. A full batch, a stop and
a caller waiting for room go at once; ``turns=0`` (``Deadline(0, turns=0)``: plain greedy) forms the batch at
once.

The callers "the loop holds" are tasks waiting on an event that ``process_batch`` sets as it returns: they are ready
to run when the batch ends, as the handlers of requests the loop read in the same turn are. Every wait is bounded.

The rule (the dispatcher's ``batch_ended`` and ``_turn``, async_batcher/_core/dispatcher.py): when a batch ends while
items wait, the next batch forms the policy's ``turns`` (``Deadline().turns``: 4, ``TURNS`` below) turns of the
event loop later, each a zero-delay timer, so that callers the loop already holds join it; the pending turn is the
dispatcher's ``pump_handle`` (``engine_of(b).dispatcher``), so arrivals do not pump meanwhile. No turns when the
waiting items fill the largest batch, when the run is not running (a drain goes at once), or while a caller waits for
room; ``turns=0`` forms the batch at once. The tests read the public API, the testing kit (``testing.idle``), the
policies, and, where a rule is about the pending turn itself, the dispatcher's ``pump_handle``. The rules the tests
below the first few check:

- turns, not time: the clock does not move for them, and they pass in exactly ``turns`` iterations, whatever
  arrives meanwhile (a stream of arrivals, one every turn, never re-arms them: no starvation);
- every accepted item resolves exactly once (its result, an exception or its caller's cancellation), and an item
  whose caller left or timed out before its batch formed never reaches ``process_batch``: callers cancelled or
  timing out during the turns, ``process_many`` calls that span batches, a stop (drain, forced, timed out) at each
  moment around the turns, a restart right after a stop that cut the turns short;
- settings changed live during the turns (``max_batch_size``, ``concurrency``, ``max_queue_time``,
  ``max_hold_time``, ``max_queue_size`` with callers waiting for room) apply to the batch the turns form;
- re-entrant calls: ``process()`` from inside ``process_batch`` (with a free slot, and the refusal when every slot
  is taken), hooks that submit or stop, callbacks that stop the batcher inside the turns;
- several slots, several lanes, priorities, the adaptive wait, preferred sizes, a plain ``def process_batch`` (the
  executor path) and a streaming one;
- an idle batcher keeps no timer and no pending turn.

Two defects were found by these tests, and fixed: a re-entrant ``process()`` from inside batches that took every
slot while a turn was pending was not refused (``process()``'s short path looked only while no pump was pending: the
batches waited for themselves forever); and with several slots, a batch that ended while a turn was pending pumped
at once, leaving out the callers the loop held (a batch's end now starts the count again).

Each of those tests' first comment names the rule it checks. Every wait is bounded (``asyncio.timeout`` on the
loop's clock, ``until``), so that a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

import pytest

from async_batcher import (
    END,
    AsyncBatcher,
    AsyncBatchException,
    BatcherStoppedError,
    QueueFullException,
    ReentrantCallError,
    testing,
)
from async_batcher.policies import ClosedLoopHold, Deadline, DispatchPolicy, LatencyBudget, PreferredSizes
from tests.batchers import Recording, SyncRecording, engine_of, idle_and_clean, until
from tests.loops import VirtualClockLoop

pytestmark = pytest.mark.virtual_time

#: The turns a batch's end lets pass by default (a wait's ``turns=``).
TURNS = Deadline().turns


class EndsWithCallers(Recording):
    """Each batch takes ``delay`` seconds; as its first batch returns, ``callers`` tasks become ready to call
    :meth:`process` (each notes the batches in flight as it runs)."""

    def __init__(self, callers: range, **kwargs: Any) -> None:
        super().__init__(delay=1.0, answer=self._answer, **kwargs)
        self.ready = asyncio.Event()
        self.in_flight_seen: list[int] = []
        self.waiters = [asyncio.ensure_future(self._caller(x)) for x in callers]

    def _answer(self, batch: list[int]) -> list[int]:
        self.ready.set()
        return [x * 2 for x in batch]

    async def _caller(self, x: int) -> int:
        await self.ready.wait()
        self.in_flight_seen.append(self.stats.in_flight)
        return await self.process(x)


async def _later(b: Recording, delay: float, items: range) -> list[int]:
    await asyncio.sleep(delay)
    return list(await asyncio.gather(*(b.process(x) for x in items)))


@pytest.mark.parametrize(
    ("turns", "batches", "started_at"),
    [
        (2, [[0], [1, 10, 11, 12, 13]], [0.0, 1.0]),  # they join the batch, which starts when the first ended
        (0, [[0], [1], [10, 11, 12, 13]], [0.0, 1.0, 2.0]),  # plain greedy: [1] goes alone, they follow
    ],
)
async def test_callers_the_loop_holds_at_a_batchs_end_join_the_next_batch(
    turns: int, batches: list[list[int]], started_at: list[float]
) -> None:
    loop = asyncio.get_running_loop()
    b = EndsWithCallers(range(10, 14), policy=Deadline(0, turns=turns))
    async with asyncio.timeout(10):
        assert await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 2))) == [0, [2]]
        assert await asyncio.gather(*b.waiters) == [20, 22, 24, 26]
    assert b.batches == batches
    assert b.started_at == started_at
    assert loop.time() == started_at[-1] + 1.0
    assert testing.idle(b) == []  # nothing left scheduled
    await b.stop()


async def test_the_turns_wait_for_the_callers_behind_a_hold_too() -> None:
    # With the hold on (its default), the turns come first and the hold's own rules after them: here a single
    # caller was answered (fewer than a probe's four), so the hold does not act, and the turns alone merge them.
    b = EndsWithCallers(range(10, 14), max_queue_time=0, max_hold_time=0.02)
    async with asyncio.timeout(10):
        await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 2)), *b.waiters)
    assert b.batches == [[0], [1, 10, 11, 12, 13]]
    assert b.started_at == [0.0, 1.0]
    await b.stop()


@pytest.mark.parametrize("why", ["full", "room"])
async def test_a_full_batch_or_a_caller_waiting_for_room_goes_at_once(why: str) -> None:
    # The next batch is already full, or a caller waits for the room it makes: it is launched before the callers
    # the loop holds run (they see it in flight), and they form the batch after it.
    size, room = (2, 100) if why == "full" else (100, 2)
    b = EndsWithCallers(
        range(10, 12), max_queue_time=0, max_hold_time=0, max_batch_size=size, max_queue_size=room, wait_when_full=True
    )
    async with asyncio.timeout(10):
        await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 3 if why == "full" else 4)), *b.waiters)
    assert b.in_flight_seen == [1, 1]
    assert b.batches[:2] == [[0], [1, 2]]
    b2 = EndsWithCallers(range(10, 12), max_queue_time=0, max_hold_time=0)  # the same, with neither: they join
    async with asyncio.timeout(10):
        await asyncio.gather(b2.process(0), _later(b2, 0.5, range(1, 3)), *b2.waiters)
    assert b2.in_flight_seen == [0, 0]
    assert b2.batches == [[0], [1, 2, 10, 11]]
    await b.stop()
    await b2.stop()


@pytest.mark.parametrize("force", [False, True])
async def test_a_stop_during_the_turns_resolves_every_caller_once(force: bool) -> None:
    # The stop comes in the turn after the batch's end (from a task the end made ready), while the next batch waits
    # for its turns: a drain sends it (no turn is waited for once stopping), a forced stop fails it; nothing hangs.
    b = EndsWithCallers(range(0), max_queue_time=0, max_hold_time=0)

    async def stopper() -> None:
        await b.ready.wait()
        await b.stop(force=force)

    async with asyncio.timeout(10):
        stopping = asyncio.ensure_future(stopper())
        outcomes = await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 4)), return_exceptions=True)
        await stopping
    assert outcomes[0] == 0
    if force:
        assert isinstance(outcomes[1], BatcherStoppedError)
        assert b.batches == [[0]]
    else:
        assert outcomes[1] == [2, 4, 6]
        assert b.batches == [[0], [1, 2, 3]]
    stats = b.stats
    assert stats.in_flight == 0 and stats.queued == 0
    assert testing.idle(b) == []


async def test_a_batch_that_ends_while_the_batcher_stops_sends_the_rest_at_once() -> None:
    # A drain waits for no turn: the batch of what is left is in flight before the tasks the end made ready run
    # (the caller among them is refused: the batcher stops).
    b = EndsWithCallers(range(10, 11), max_queue_time=0, max_hold_time=0)

    async def stopper() -> None:
        await asyncio.sleep(0.75)  # the first batch runs, the next items wait
        await b.stop()

    async with asyncio.timeout(10):
        stopping = asyncio.ensure_future(stopper())
        assert await asyncio.gather(b.process(0), _later(b, 0.5, range(1, 4))) == [0, [2, 4, 6]]
        (refused,) = await asyncio.gather(*b.waiters, return_exceptions=True)
        await stopping
    assert isinstance(refused, BatcherStoppedError)
    assert b.in_flight_seen == [1]
    assert b.batches == [[0], [1, 2, 3]]


# ====================================================================== every rule of the turns, on every path

# ---------------------------------------------------------------------- helpers


def after(loop: asyncio.AbstractEventLoop, hops: int, fn: Callable[[], object]) -> None:
    """Call ``fn`` ``hops`` iterations of the loop from now (0: now), each hop a ``call_soon``."""
    if hops <= 0:
        fn()
    else:
        loop.call_soon(after, loop, hops - 1, fn)


class Iterations:
    """Counts the loop's iterations (each polls its selector once): where a batch formed, in turns."""

    def __init__(self, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        selector: Any = loop._selector  # type: ignore[attr-defined]
        select = selector.select

        def counting(timeout: float | None = None) -> Any:
            self.n += 1
            return select(timeout)

        monkeypatch.setattr(selector, "select", counting)


class Scripted(AsyncBatcher[int, int]):
    """Doubles its items. The first batch waits for ``gate`` (when given), the others sleep ``delay``; as each batch
    returns (the iteration it ends in), ``on_end(index, batch)`` is called. Records each batch, its start on the
    loop's clock and in iterations (``ticks``, when given)."""

    def __init__(
        self,
        *,
        gate: asyncio.Event | None = None,
        delay: float = 0.0,
        on_end: Callable[[int, list[int]], object] | None = None,
        ticks: Iterations | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gate = gate
        self.delay = delay
        self.on_end = on_end
        self.ticks = ticks
        self.batches: list[list[int]] = []
        self.started_at: list[float] = []
        self.started_tick: list[int] = []
        self.ended_tick: list[int] = []
        self.in_flight = self.max_in_flight = 0

    async def process_batch(self, batch: list[int]) -> list[int]:
        index = len(self.batches)
        self.batches.append(list(batch))
        self.started_at.append(asyncio.get_running_loop().time())
        self.started_tick.append(self.ticks.n if self.ticks else 0)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if index == 0 and self.gate is not None:
                await self.gate.wait()
            elif self.delay:
                await asyncio.sleep(self.delay)
            if self.on_end is not None:
                self.on_end(index, batch)
            self.ended_tick.append(self.ticks.n if self.ticks else 0)
            return [x * 2 for x in batch]
        finally:
            self.in_flight -= 1

    @property
    def sent(self) -> list[int]:
        return [x for b in self.batches for x in b]


class KeyedScripted(Scripted):
    """Items 0-99 are key 0, 100-199 key 1, ..."""

    def batch_key(self, item: int) -> Hashable:
        return item // 100


class Count:
    n = 0


def count_turns(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> Count:
    """Count the turns the loop was asked to let pass (at a batch's end, or for a regathered arrival): the zero-delay
    timers (``call_at`` now), which is what each turn is (nothing else here schedules a timer for the present: the
    deadlines, timeouts and sleeps are later)."""
    count = Count()
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        count.n += when <= loop.time()
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting)
    return count


def no_item_twice(b: Scripted) -> None:
    sent = b.sent
    assert len(sent) == len(set(sent)), f"an item reached process_batch twice: {b.batches}"


async def settle(b: AsyncBatcher[Any, Any]) -> None:
    """Wait, on the loop's clock, until nothing is queued, in flight or scheduled (at most 100 s of it)."""
    for _ in range(100_000):
        if not testing.idle(b):
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"not idle after 100 s: {testing.idle(b)}")


async def first_batch_then_waiting(
    b: Scripted, waiting: list[int]
) -> tuple[asyncio.Task[int], list[asyncio.Task[int]]]:
    """Item 0 goes alone; once its batch is in flight, ``waiting`` items queue behind it."""
    first = asyncio.ensure_future(b.process(0))
    await until(lambda: b.batches == [[0]])
    rest = [asyncio.ensure_future(b.process(x)) for x in waiting]
    await until(lambda: b.stats.queued == len(waiting))
    return first, rest


# ---------------------------------------------------------------------- turns, not time; no starvation


@pytest.mark.parametrize("turns", [0, 1, 2, 5])
async def test_the_turns_pass_in_exactly_turns_iterations_without_moving_the_clock(
    turns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rule: turns, not time. The batch after a batch's end forms exactly turns iterations after it (its task's first
    # step one more), on the same clock reading, with no jump of the virtual clock; a caller the end woke, that calls
    # again at once, joins it when there is a turn to wait, and follows alone when there is not.
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    ticks = Iterations(loop, monkeypatch)
    gate = asyncio.Event()
    b = Scripted(gate=gate, ticks=ticks, policy=Deadline(0, turns=turns))

    async def client() -> list[int]:
        return [await b.process(0), await b.process(10)]

    async with asyncio.timeout(10):
        first = asyncio.ensure_future(client())
        await until(lambda: b.batches == [[0]])
        rest = [asyncio.ensure_future(b.process(x)) for x in (1, 2)]
        await until(lambda: b.stats.queued == 2)
        loop.call_later(3.0, gate.set)
        jumps = loop.jumps
        assert await first == [0, 20]
        assert await asyncio.gather(*rest) == [2, 4]
    assert loop.jumps == jumps + 1  # the one jump to the gate: none for the turns
    assert b.started_at[1:] == [3.0] * (len(b.batches) - 1)
    assert b.started_tick[1] - b.ended_tick[0] == turns + 1
    assert b.batches == ([[0], [1, 2, 10]] if turns else [[0], [1, 2], [10]])
    await settle(b)
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("turns", [0, 2])
async def test_an_arrival_every_turn_never_starves_the_pump(turns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rule: the turns are bounded whatever arrives: arrivals do not pump early, nor re-arm the turns. A producer
    # submits an item every iteration of the loop while batches that take no time end one after another: each batch
    # forms exactly turns + 1 iterations after the one before it started (its end, then the turns), so the batches
    # keep going and each takes what arrived meanwhile, and every item resolves.
    loop = asyncio.get_running_loop()
    ticks = Iterations(loop, monkeypatch)
    b = Scripted(ticks=ticks, policy=Deadline(0, turns=turns))
    calls: list[asyncio.Task[int]] = []

    async def producer() -> None:
        for i in range(300):
            calls.append(asyncio.ensure_future(b.process(i)))
            await asyncio.sleep(0)

    async with asyncio.timeout(10):
        await producer()
        results = await asyncio.gather(*calls)
    assert results == [2 * i for i in range(300)]
    assert b.sent == list(range(300))
    starts = b.started_tick[1:-1]
    gaps = {later - earlier for earlier, later in itertools.pairwise(starts)}
    assert gaps == {turns + 1}, gaps  # (the first and last batches start and end the stream)
    assert len(b.batches) >= 300 // (turns + 1) - 2
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- stops and restarts around the turns

STOPS: dict[str, dict[str, Any]] = {
    "drain": {},
    "force": {"force": True},
    "timeout-0": {"timeout": 0},
    "timeout-0.5": {"timeout": 0.5},
}


@pytest.mark.parametrize("how", list(STOPS))
@pytest.mark.parametrize("moment", [-1, *range(TURNS + 3)], ids=lambda m: "during-batch" if m < 0 else f"end+{m}")
async def test_a_stop_at_each_moment_around_the_turns_resolves_every_caller_once(
    how: str, moment: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rule: every accepted item resolves exactly once, whatever the moment of a stop: during the first batch, in the
    # iteration it ends in (end+0), in each turn (end+1 to end+turns: the stop task's first step runs one iteration
    # after it is created), or once the next batch has formed. Item 0's caller calls again as soon as it has its answer
    # (item 10, during the turns). A drain answers every accepted item; a forced or timed-out stop fails what has
    # not been answered with BatcherStoppedError, and an item never sent is never sent later. A batch that ends
    # while the batcher stops takes no turns (the drain goes at once). Then a restart: the new run serves at once,
    # and no turn of the old run fires into it.
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    stopping: list[asyncio.Task[None]] = []
    turn_pending: list[bool] = []  # whether a turn was pending as the stop began

    async def stopper() -> None:
        handle = engine_of(b).dispatcher.pump_handle
        turn_pending.append(handle is not None and not handle.cancelled())
        await b.stop(**STOPS[how])

    def stop() -> None:
        stopping.append(asyncio.ensure_future(stopper()))

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0 and moment >= 0:
            after(loop, moment, stop)

    ticks = Iterations(loop, monkeypatch)
    b = Scripted(gate=gate, delay=1.0, on_end=on_end, ticks=ticks, max_queue_time=0, max_hold_time=0)

    async def client() -> list[Any]:
        got: list[Any] = [await b.process(0)]
        try:
            got.append(await b.process(10))
        except BatcherStoppedError as exc:
            got.append(exc)
        return got

    async with asyncio.timeout(30):
        first = asyncio.ensure_future(client())
        await until(lambda: b.batches == [[0]])
        rest = {x: asyncio.ensure_future(b.process(x)) for x in (1, 2, 3)}
        await until(lambda: b.stats.queued == 3)
        if moment < 0:
            stop()
            await asyncio.sleep(0)
        gate.set()
        outcomes = await asyncio.gather(first, *rest.values(), return_exceptions=True)
        await asyncio.gather(*stopping)
    if moment >= 0:  # the stop began inside the turns at end+0 to end+turns-1 (its task runs an iteration later)
        assert turn_pending == [moment < TURNS]
    elif how == "drain":  # a batch that ends while the batcher stops takes no turns: the drain goes at once
        assert b.started_tick[1] - b.ended_tick[0] == 1
    no_item_twice(b)
    answered = {}
    if isinstance(outcomes[0], list):
        answered[0], tenth = outcomes[0]
        if not isinstance(tenth, BatcherStoppedError):
            answered[10] = tenth
        elif how == "drain":  # refused as the stop began, never sent (a forced stop may cut its batch off)
            assert 10 not in b.sent, b.batches
    else:
        assert isinstance(outcomes[0], BatcherStoppedError), outcomes[0]
    for x, outcome in zip((1, 2, 3), outcomes[1:], strict=True):
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, BatcherStoppedError), outcome
        else:
            answered[x] = outcome
    for x, result in answered.items():
        assert result == 2 * x and x in b.sent
    if how == "drain":
        assert {0, 1, 2, 3} <= answered.keys()
    elif how != "timeout-0.5":  # (half a second drains the first batch; not the next, which takes a second)
        assert not {1, 2, 3} & answered.keys()
    assert not await b.is_running()
    idle_and_clean(b)
    old = engine_of(b)
    batches = len(b.batches)
    b.start()
    async with asyncio.timeout(10):
        assert await asyncio.gather(b.process(5), b.process(6)) == [10, 12]
    assert b.batches[batches:] == [[5, 6]]
    assert old.dispatcher.in_flight == 0 and not old.queue.waiting  # (the old run's engine: nothing of it left)
    assert old.dispatcher.pump_handle is None or old.dispatcher.pump_handle.cancelled()
    await b.stop()
    idle_and_clean(b)


# ---------------------------------------------------------------------- callers who leave during the turns


@pytest.mark.parametrize("turns", [0, 2])
@pytest.mark.parametrize("moment", [0, 1, 2, 3, 4], ids=lambda m: f"end+{m}")
async def test_a_caller_cancelled_during_the_turns_withdraws_its_item(moment: int, turns: int) -> None:
    # Rule: a caller cancelled before its item reaches process_batch withdraws it (its batch's task drops an item
    # whose caller left since the batch formed); cancelled after, its result is dropped and nobody else is
    # affected. The batch forms turns iterations after the end (end+2), and its task reaches process_batch one
    # later (end+3): a cancellation up to then withdraws item 2; one at end+4 comes after process_batch took it.
    # With turns=0, everything is two iterations earlier. The others are answered once; nothing stays scheduled.
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    calls: dict[int, asyncio.Task[int]] = {}

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0:
            after(loop, moment, calls[2].cancel)

    b = Scripted(gate=gate, on_end=on_end, policy=Deadline(0, turns=turns))
    async with asyncio.timeout(10):
        first, rest = await first_batch_then_waiting(b, [1, 2, 3])
        calls.update(zip((1, 2, 3), rest, strict=True))
        gate.set()
        outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
        await settle(b)
    assert outcomes[0] == 0 and outcomes[1] == 2 and outcomes[3] == 6
    sent = moment >= turns + 2
    assert b.batches[1] == ([1, 2, 3] if sent else [1, 3])
    # Withdrawn: cancelled. Sent: cancelled (its result dropped), or answered before the cancellation came.
    assert isinstance(outcomes[2], asyncio.CancelledError) or (sent and outcomes[2] == 4), outcomes[2]
    assert b.stats.cancelled == (not sent)  # (one sent counts as processed)
    no_item_twice(b)
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("timeout", [0, 1.0])
@pytest.mark.parametrize("moment", range(TURNS + 2), ids=lambda m: f"end+{m}")
async def test_a_timeout_around_the_turns_is_atomic(moment: int, timeout: float) -> None:
    # Rule: timeout= is atomic with respect to the batch: an item is sent with its caller still waiting, or never;
    # and the turns, which move no clock, make no deadline pass. A caller comes at end+moment (its task queues the
    # item an iteration later). With timeout=1, the item joins the batch the turns form (end+turns) when it queues
    # by the last turn (up to end+turns-1), else it follows in a batch of its own; answered either way. With
    # timeout=0 its deadline is its arrival, passed as any batch forms (even in the same clock reading, in the
    # turns): it times out and is never sent, whatever the moment, and nothing is left scheduled. (Before deadlines
    # reached the batch, issue 45, a timeout=0 item that queued in the last turn joined the batch and was
    # answered: its timer had not fired yet.)
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    late: list[asyncio.Task[int]] = []

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0:
            after(loop, moment, lambda: late.append(asyncio.ensure_future(b.process(20, timeout=timeout))))

    b = Scripted(gate=gate, on_end=on_end, max_queue_time=0, max_hold_time=0)
    async with asyncio.timeout(10):
        first, rest = await first_batch_then_waiting(b, [1, 2, 3])
        gate.set()
        assert await asyncio.gather(first, *rest) == [0, 2, 4, 6]
        await until(lambda: bool(late))
        (outcome,) = await asyncio.gather(*late, return_exceptions=True)
        await settle(b)
    no_item_twice(b)
    if timeout:
        assert outcome == 40 and b.stats.timed_out == 0
        assert b.batches == ([[0], [1, 2, 3, 20]] if moment < TURNS else [[0], [1, 2, 3], [20]]), b.batches
    else:
        assert isinstance(outcome, TimeoutError) and b.batches == [[0], [1, 2, 3]], (outcome, b.batches)
        assert b.stats.timed_out == 1
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("turns", [0, 2])
@pytest.mark.parametrize("leave", [None, "cancel", "timeout"])
async def test_a_process_many_around_the_turns(leave: str | None, turns: int) -> None:
    # Rule: a process_many is answered once, in order, whatever batches its items go in; what is left of it when
    # its caller leaves is withdrawn and never sent. max_batch_size=3: [0, 1, 2] of a bulk call goes first; [3, 4]
    # waits (less than a full batch: turns). A bulk call that the end woke, [50, 51], joins them after the turns
    # (with turns=0, [3, 4] goes at once). "cancel": the first bulk call is cancelled as its first batch ends:
    # [3, 4] is never sent. "timeout": the woken call has timeout=0: its deadline has passed as any batch forms
    # (the turns' or, with turns=0, its own): it times out, never sent, [3, 4] unharmed. (Before deadlines reached
    # the batch, issue 45, with turns=0 it went in a batch of its own before its timer fired, and was answered.)
    gate = asyncio.Event()
    late: list[asyncio.Task[list[int]]] = []
    many: list[asyncio.Task[list[int]]] = []

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0:
            late.append(asyncio.ensure_future(b.process_many([50, 51], timeout=0 if leave == "timeout" else None)))
            if leave == "cancel":
                many[0].cancel()

    b = Scripted(gate=gate, on_end=on_end, policy=Deadline(0, turns=turns), max_batch_size=3)
    async with asyncio.timeout(10):
        many.append(asyncio.ensure_future(b.process_many(range(5))))
        await until(lambda: b.batches == [[0, 1, 2]])
        gate.set()
        await until(lambda: bool(late))
        outcomes = await asyncio.gather(*many, *late, return_exceptions=True)
        await settle(b)
    no_item_twice(b)
    if leave is None:
        assert outcomes == [[0, 2, 4, 6, 8], [100, 102]]
        assert b.batches == ([[0, 1, 2], [3, 4, 50], [51]] if turns else [[0, 1, 2], [3, 4], [50, 51]])
    elif leave == "cancel":
        assert isinstance(outcomes[0], asyncio.CancelledError) and outcomes[1] == [100, 102], outcomes
        assert b.batches == [[0, 1, 2], [50, 51]]
    else:
        assert outcomes[0] == [0, 2, 4, 6, 8] and isinstance(outcomes[1], TimeoutError), outcomes
        assert b.batches == [[0, 1, 2], [3, 4]] and b.stats.timed_out == 2
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- settings changed during the turns


@pytest.mark.parametrize("change", ["max_batch_size", "concurrency", "max_queue_time", "max_queue_size"])
async def test_a_setting_changed_during_the_turns_applies_to_the_batch_they_form(change: str) -> None:
    # Rule: a setting changed live applies from the next batch; changed inside the turns (end+1: the turn pending,
    # so the change's own repump is a no-op), it applies to the batch the turns form, and nothing is lost or sent
    # twice. Items 1, 2, 3 wait behind [0], whose end (the gate, at 3 s) starts the turns; the next batches take
    # 1 s each.
    # - max_batch_size 10 -> 1: [1], [2], [3] one after another (no turns between them: each waits a full batch);
    # - concurrency 1 -> 3 with max_batch_size -> 1: [1], [2], [3] at once, at 3 s;
    # - max_queue_time 0 -> 5: the batch waits for its oldest item's new deadline, 5 s (it arrived at 0);
    # - max_queue_size 10 -> 3, callers waiting for room meanwhile: a bulk call of 2 is refused once the queue
    #   shrinks to 1 under it (it could never fit); item 4 gets room when the turns' batch takes [1, 2, 3].
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    waiting_for_room: list[asyncio.Task[Any]] = []

    def change_it() -> None:
        assert engine_of(b).dispatcher.pump_handle is not None, "no turn pending"
        if change == "max_batch_size":
            b.max_batch_size = 1
        elif change == "concurrency":
            b.concurrency = 3
            b.max_batch_size = 1
        elif change == "max_queue_time":
            b.max_queue_time = 5
        else:
            b.max_queue_size = 3  # full: the next callers wait for room
            waiting_for_room.append(asyncio.ensure_future(b.process_many([7, 8])))
            waiting_for_room.append(asyncio.ensure_future(b.process(4)))
            after(loop, 1, shrink)

    def shrink() -> None:
        assert b.stats.awaiting_room, "nobody waits for room"
        b.max_queue_size = 1

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0:
            after(loop, 1, change_it)

    b = Scripted(
        gate=gate, delay=1.0, on_end=on_end, max_queue_time=0, max_hold_time=0, max_batch_size=10, max_queue_size=10
    )
    b.wait_when_full = True
    async with asyncio.timeout(30):
        first, rest = await first_batch_then_waiting(b, [1, 2, 3])
        loop.call_later(3.0, gate.set)
        assert await asyncio.gather(first, *rest) == [0, 2, 4, 6]
        room = await asyncio.gather(*waiting_for_room, return_exceptions=True)
        await settle(b)
    no_item_twice(b)
    if change == "max_batch_size":
        assert b.batches == [[0], [1], [2], [3]] and b.started_at == [0.0, 3.0, 4.0, 5.0]
    elif change == "concurrency":
        assert b.batches == [[0], [1], [2], [3]] and b.started_at == [0.0, 3.0, 3.0, 3.0]
        assert b.max_in_flight == 3
    elif change == "max_queue_time":
        assert b.batches == [[0], [1, 2, 3]] and b.started_at == [0.0, 5.0]
    else:
        assert isinstance(room[0], QueueFullException) and room[1] == 8, room
        assert b.batches == [[0], [1, 2, 3], [4]]
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("hold", ["set", "unset", "kept"])
async def test_max_hold_time_changed_during_the_turns(hold: str) -> None:
    # Rule: the hold is judged by max_hold_time as set now, after the turns. The first batch answers four callers
    # (a probe of the hold: it waits for them to come back); item 4 waits. They never come back: with the hold kept
    # at 0.05 s the batch of [4] goes when the hold ends; unset inside the turns, it goes as the turns end; set
    # inside the turns (it was 0 as the batch ended, so no hold began), it goes as the turns end too.
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0 and hold != "kept":
            after(loop, 1, lambda: setattr(b, "max_hold_time", 0.05 if hold == "set" else 0))

    b = Scripted(gate=gate, on_end=on_end, max_queue_time=0, max_hold_time=0 if hold == "set" else 0.05)
    async with asyncio.timeout(10):
        first = asyncio.gather(*(b.process(x) for x in range(4)))  # four callers: a cohort, which a probe holds for
        await until(lambda: bool(b.batches))
        fourth = asyncio.ensure_future(b.process(4))
        loop.call_later(3.0, gate.set)
        await first
        assert await fourth == 8
        await settle(b)
    assert b.batches == [[0, 1, 2, 3], [4]]
    assert b.started_at == [0.0, 3.05 if hold == "kept" else 3.0]
    idle_and_clean(b)
    await b.stop()


# ---------------------------------------------------------------------- re-entrant calls


class Reentrant(AsyncBatcher[int, int]):
    """Items below 100 wait for ``gate``, and as they return open ``inner_gate`` (when given); items 100-999 wait
    for ``inner_gate`` (when given), then call ``process(item + 1000)`` from inside their batch and return twice its
    result; items from 1000 are doubled."""

    def __init__(self, *, inner_gate: asyncio.Event | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = asyncio.Event()
        self.inner_gate = inner_gate
        self.batches: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.batches.append(list(batch))
        if batch[0] < 100:
            await self.gate.wait()
            if self.inner_gate is not None:
                self.inner_gate.set()
            return [x * 2 for x in batch]
        if batch[0] < 1000:
            if self.inner_gate is not None:
                await self.inner_gate.wait()
            return [2 * await self.process(x + 1000) for x in batch]
        return [x * 2 for x in batch]


@pytest.mark.parametrize("turns", [0, 2])
async def test_process_from_inside_a_batch_during_the_turns_with_a_free_slot_is_served(turns: int) -> None:
    # Rule: a re-entrant process() with a slot free is served. Two slots: [0] and [100] run; [0]'s end frees a slot
    # and starts the turns (item 1 waits); [100], woken by that end, calls process(1100) inside the turns (the pump
    # is pending: it queues without a pump of its own), and the turns' batch takes it with item 1. With turns=0,
    # [1] takes the free slot at once, and the call, from inside a batch with every slot taken, is refused.
    b = Reentrant(inner_gate=asyncio.Event(), concurrency=2, policy=Deadline(0, turns=turns))
    async with asyncio.timeout(10):
        calls = [asyncio.ensure_future(b.process(0))]
        await until(lambda: len(b.batches) == 1)
        calls.append(asyncio.ensure_future(b.process(100)))
        await until(lambda: len(b.batches) == 2)
        calls.append(asyncio.ensure_future(b.process(1)))
        await until(lambda: b.stats.queued == 1)
        b.gate.set()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        await settle(b)
    if turns:
        assert outcomes == [0, 4400, 2] and b.batches == [[0], [100], [1, 1100]]
    else:
        assert outcomes[0] == 0 and isinstance(outcomes[1], ReentrantCallError) and outcomes[2] == 2, outcomes
        assert b.batches == [[0], [100], [1]]
    idle_and_clean(b)
    await b.stop()


async def test_process_from_inside_batches_that_took_every_slot_during_the_turns_is_refused() -> None:
    # Rule: contract point 4, a call that would wait for itself raises ReentrantCallError at once: process() from
    # inside process_batch while every slot is taken, even with a turn pending. Two slots, batches of 3 at most: [0]
    # and [1] run, 100 waits. In one iteration [0] ends (the turns begin: one item waits), 101 to 103 arrive (no
    # pump: the turn is pending), and [1] ends with four waiting, a full batch: it pumps at once, and [100, 101, 102]
    # and [103] take both slots while the turn is still pending. Each calls process() from inside its batch, on
    # process()'s short path: the first is refused at once (before the fix, the short path looked only when no pump
    # was pending, and both batches waited for slots they held themselves, forever).
    gates = {0: asyncio.Event(), 1: asyncio.Event()}

    class Inner(Recording):
        async def process_batch(self, batch: list[int]) -> Any:
            self.batches.append(list(batch))
            if batch[0] in gates:
                await gates[batch[0]].wait()
            if batch[0] in gates or batch[0] >= 1000:
                return [x * 2 for x in batch]
            return [2 * await self.process(x + 1000) for x in batch]

    b = Inner(concurrency=2, max_batch_size=3, max_queue_time=0, max_hold_time=0)
    calls = [asyncio.ensure_future(b.process(0))]
    await until(lambda: len(b.batches) == 1)
    calls.append(asyncio.ensure_future(b.process(1)))
    await until(lambda: len(b.batches) == 2)
    calls.append(asyncio.ensure_future(b.process(100)))
    await until(lambda: b.stats.queued == 1)
    gates[0].set()
    calls += [asyncio.ensure_future(b.process(x)) for x in (101, 102, 103)]
    gates[1].set()
    try:
        async with asyncio.timeout(10):
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
    except TimeoutError:
        stats = b.stats
        stuck = f"in flight {stats.in_flight} of 2 slots, {stats.queued} items queued: {b.batches}"
        await b.stop(force=True)
        await asyncio.gather(*calls, return_exceptions=True)
        pytest.fail(f"re-entrant calls were not refused and wait for their own batches: {stuck}")
    # [100, 101, 102]'s call is refused, its batch fails and frees its slot; then [103]'s call finds that slot.
    assert b.batches == [[0], [1], [100, 101, 102], [103], [1103]]
    assert outcomes[:2] == [0, 2] and outcomes[-1] == 4 * 1103
    assert all(isinstance(x, ReentrantCallError) for x in outcomes[2:-1]), outcomes
    await settle(b)
    idle_and_clean(b)
    await b.stop()


async def test_the_refusal_of_process_from_inside_batches_that_took_every_slot_without_turns() -> None:
    # Rule: contract point 4, with turns=0 (no turn ever pending). Two slots, preferred sizes (1, 3): [0] and [1]
    # end together, [100] and [101] take both slots and call process() from inside their batches with every slot
    # taken; the first is refused at once (its batch fails with ReentrantCallError and frees its slot, where the
    # second's inner item then goes).
    b = Reentrant(concurrency=2, policy=PreferredSizes((1, 3), Deadline(0, turns=0)))
    async with asyncio.timeout(10):
        calls = [asyncio.ensure_future(b.process(x)) for x in (0, 1)]
        await until(lambda: len(b.batches) == 2)
        calls += [asyncio.ensure_future(b.process(x)) for x in (100, 101)]
        await until(lambda: b.stats.queued == 2)
        b.gate.set()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        await settle(b)
    assert outcomes[:2] == [0, 2]
    assert isinstance(outcomes[2], ReentrantCallError) and outcomes[3] == 4404, outcomes
    idle_and_clean(b)
    await b.stop()


class Hooked(Scripted):
    """Hooks that call back into the batcher for item 7: ``batch_key`` submits item 8, or stops the batcher;
    ``item_weight`` lowers ``max_batch_size`` to 1."""

    def __init__(self, *, act: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.act = act
        self.spawned: list[asyncio.Task[Any]] = []

    def batch_key(self, item: int) -> Hashable:
        if item == 7 and self.act == "submit":
            self.spawned.append(asyncio.ensure_future(self.process(8)))
        elif item == 7 and self.act == "stop":
            self.spawned.append(asyncio.ensure_future(self.stop()))
        return item // 100

    def item_weight(self, item: int) -> float:
        if item == 7 and self.act == "weight":
            self.max_batch_size = 1
        return 1.0


@pytest.mark.parametrize("act", ["submit", "stop", "weight"])
async def test_hooks_that_call_back_during_the_turns(act: str) -> None:
    # Rule: every accepted item resolves exactly once when the hooks call back into the batcher inside the turns.
    # Items 1, 2, 3 wait behind [0]; a caller its end woke submits item 7 in the first turn, whose hooks: submit item
    # 8 (it queues in the last turn and joins the batch); stop the batcher (the stop begins in the last turn, while
    # the turn is pending: the drain still sends everything accepted, item 7 included); lower max_batch_size to 1
    # (the turns' pump sends the four items one by one).
    gate = asyncio.Event()
    late: list[asyncio.Task[int]] = []

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0:
            late.append(asyncio.ensure_future(b.process(7)))

    b = Hooked(act=act, gate=gate, on_end=on_end, max_queue_time=0, max_hold_time=0)
    async with asyncio.timeout(10):
        first, rest = await first_batch_then_waiting(b, [1, 2, 3])
        gate.set()
        assert await asyncio.gather(first, *rest) == [0, 2, 4, 6]
        await until(lambda: bool(late))
        assert await asyncio.gather(*late) == [14]
        spawned = await asyncio.gather(*b.spawned)
        await settle(b)
    no_item_twice(b)
    if act == "submit":
        assert spawned == [16] and b.batches == [[0], [1, 2, 3, 7, 8]]
    elif act == "stop":
        assert not await b.is_running() and b.batches == [[0], [1, 2, 3, 7]]
    else:
        assert b.batches == [[0], [1], [2], [3], [7]]
    idle_and_clean(b)
    await b.stop()


@pytest.mark.parametrize("force", [False, True])
async def test_a_timer_callback_that_stops_the_batcher_between_the_turns(force: bool) -> None:
    # Rule: a stop from a callback that runs between the two turns (a zero-delay timer scheduled right after the
    # first turn fired: it runs after the second turn is scheduled) leaves no caller waiting, and no turn fires
    # into the stopped run: a drain sends what waits, a forced stop fails it and never sends it.
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()
    stopping: list[asyncio.Task[None]] = []

    def between() -> None:
        assert engine_of(b).dispatcher.pump_handle is not None and not engine_of(b).dispatcher.pump_handle.cancelled()
        stopping.append(asyncio.ensure_future(b.stop(force=force)))

    def on_end(index: int, batch: list[int]) -> None:
        if index == 0:
            after(loop, 1, lambda: loop.call_at(loop.time(), between))

    b = Scripted(gate=gate, on_end=on_end, max_queue_time=0, max_hold_time=0)
    async with asyncio.timeout(10):
        first, rest = await first_batch_then_waiting(b, [1, 2, 3])
        gate.set()
        outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
        await until(lambda: bool(stopping))
        await asyncio.gather(*stopping)
    assert outcomes[0] == 0
    if force:
        assert all(isinstance(x, BatcherStoppedError) for x in outcomes[1:]), outcomes
        assert b.batches == [[0]]
    else:
        assert outcomes[1:] == [2, 4, 6] and b.batches == [[0], [1, 2, 3]]
    assert not await b.is_running()
    idle_and_clean(b)


# ---------------------------------------------------------------------- slots, lanes, priorities, policies


class ByThousands(Scripted):
    """Items 0-999 are key 0, 1000-1999 key 1, ..."""

    def batch_key(self, item: int) -> Hashable:
        return item // 1000


CONFIGS: dict[str, dict[str, Any]] = {
    "3-slots": {"concurrency": 3, "max_batch_size": 4, "max_queue_time": 0},
    "unlimited-slots": {"concurrency": None, "max_queue_time": 0.002},
    "lanes": {"concurrency": 2, "max_batch_size": 4, "max_queue_time": 0.001},
    "priorities": {"max_batch_size": 8, "max_queue_time": 0, "max_priority_wait": 0.01},
    "adaptive": {"max_latency": 0.05, "concurrency": 2},
    "preferred": {"preferred_batch_sizes": (2, 4), "max_batch_size": 8, "max_queue_time": 0.003},
    "hold": {"max_hold_time": 0.004, "max_queue_time": 0, "max_batch_size": 6},
}


def with_turns(settings: dict[str, Any], turns: int) -> DispatchPolicy:
    """The policy the dispatch keywords of ``settings`` describe (taken out of it), its wait letting ``turns`` pass."""
    latency = settings.pop("max_latency", None)
    wait: DispatchPolicy
    if latency is None:
        wait = Deadline(settings.pop("max_queue_time", 0.01), turns=turns)
    else:
        wait = LatencyBudget(latency, turns=turns)
    sizes = settings.pop("preferred_batch_sizes", ())
    if sizes:
        wait = PreferredSizes(sizes, wait)
    hold = settings.pop("max_hold_time", 0)
    return ClosedLoopHold(hold, wait) if hold else wait


@pytest.mark.parametrize("turns", [0, 2])
@pytest.mark.parametrize("config", list(CONFIGS))
async def test_clients_that_call_again_at_once_under_each_policy(
    config: str, turns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rule: every accepted item resolves exactly once, and is sent at most once, under several slots, lanes,
    # priorities, the adaptive wait, preferred sizes and the hold, with the turns on and off: twelve closed-loop
    # clients (each calls again as soon as it has its answer, or after a turn, or a sleep), a fifth of the calls
    # with a short timeout, some cancelled. No more batches in flight than slots; no batch over max_batch_size;
    # keys never mixed in a batch; the idle batcher keeps nothing scheduled.
    settings = dict(CONFIGS[config])
    policy = with_turns(settings, turns)
    cls = ByThousands if config == "lanes" else Scripted
    b = cls(delay=0.01, policy=policy, **settings)
    outcomes: dict[int, Any] = {}
    began = count_turns(asyncio.get_running_loop(), monkeypatch)

    async def client(c: int) -> None:
        for r in range(15):
            item = (c % 3) * 1000 + c * 20 + r
            kind = (c * 7 + r * 3) % 10
            call = b.process(
                item, timeout=0.004 if kind < 2 else None, priority=(r % 3) if config == "priorities" else 0
            )
            task = asyncio.ensure_future(call)
            if kind == 9:
                asyncio.get_running_loop().call_soon(task.cancel)
            try:
                outcomes[item] = await task
            except (TimeoutError, asyncio.CancelledError) as exc:
                outcomes[item] = exc
            if kind % 3 == 1:
                await asyncio.sleep(0)
            elif kind % 3 == 2:
                await asyncio.sleep(0.001 * (c % 4))

    async with asyncio.timeout(60):
        await asyncio.gather(*(client(c) for c in range(12)))
        await settle(b)
    no_item_twice(b)
    sent = set(b.sent)
    assert len(outcomes) == 180
    for item, outcome in outcomes.items():
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, TimeoutError | asyncio.CancelledError), outcome
        else:
            assert outcome == 2 * item and item in sent
    assert b.max_in_flight <= (math.inf if b.concurrency is None else b.concurrency)
    assert all(len(x) <= (180 if b.max_batch_size is None else b.max_batch_size) for x in b.batches)
    if config == "lanes":
        assert all(len({x // 1000 for x in batch}) == 1 for batch in b.batches)
    if config == "preferred":  # (sizes other than 2 and 4 only by a deadline)
        assert any(len(x) in (2, 4) for x in b.batches)
    kinds = {type(x) for x in outcomes.values()}
    assert TimeoutError in kinds and asyncio.CancelledError in kinds and int in kinds
    assert (began.n > 0) == (turns > 0), began.n  # the turns were taken, and only when on
    idle_and_clean(b)
    await b.stop()
    idle_and_clean(b)


class SeveralEnds(Scripted):
    """Batches of items 0, 100 and 200 wait for ``gate``; the others return at once."""

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.batches.append(list(batch))
        if batch[0] in (0, 100, 200):
            assert self.gate is not None
            await self.gate.wait()
        return [x * 2 for x in batch]


async def _three_ends(b: SeveralEnds) -> tuple[list[Any], list[list[int]]]:
    """Three clients, each in a batch of its own ([0], [100], [200]: three slots), calling again (x + 10) once
    answered; items 1 and 2 wait behind them; the three batches end in the same iteration."""

    async def client(x: int) -> list[int]:
        return [await b.process(x), await b.process(x + 10)]

    calls: list[asyncio.Future[Any]] = []
    async with asyncio.timeout(10):
        for x in (0, 100, 200):
            calls.append(asyncio.ensure_future(client(x)))
            await until(lambda: len(b.batches) == len(calls))
        calls += [asyncio.ensure_future(b.process(x)) for x in (1, 2)]
        await until(lambda: b.stats.queued == 2)
        assert b.gate is not None
        b.gate.set()
        outcomes = await asyncio.gather(*calls)
        await settle(b)
    return outcomes, b.batches


@pytest.mark.parametrize("turns", [0, 2])
async def test_several_slots_ending_together_answer_everyone_once(turns: int) -> None:
    # Rule: every accepted item resolves exactly once with several slots whose batches end in the same iteration:
    # the first end begins the turns, the others end while a turn is pending (each pumps at once); no more batches
    # in flight than slots, nothing left scheduled.
    b = SeveralEnds(gate=asyncio.Event(), concurrency=3, policy=Deadline(0, turns=turns))
    outcomes, batches = await _three_ends(b)
    assert outcomes == [[0, 20], [200, 220], [400, 420], 2, 4]
    assert sorted(x for batch in batches for x in batch) == [0, 1, 2, 10, 100, 110, 200, 210]
    no_item_twice(b)
    idle_and_clean(b)
    await b.stop()


async def test_callers_woken_by_several_ends_join_one_batch_after_the_turns() -> None:
    # Rule: callers the loop already holds at a batch's end join the next batch, which forms after the turns. Three
    # slots, three batches ending in the same iteration, each waking its client, who calls again at once (10, 110,
    # 210). The first end begins the turns; the second and third find the turn pending and pump at once ([1, 2]
    # goes without them); then [1, 2], ending at once, pumps at once again, while the turn is still pending, and
    # takes the clients that had run by then: 10 and 110 go in one batch, 210 in the next.
    b = SeveralEnds(gate=asyncio.Event(), concurrency=3, max_queue_time=0, max_hold_time=0)
    _, batches = await _three_ends(b)
    try:
        assert any({10, 110, 210} <= set(batch) for batch in batches), batches
    finally:
        await b.stop()


# ---------------------------------------------------------------------- the executor path, streams, internal errors


@pytest.mark.parametrize("turns", [0, 2])
async def test_a_plain_def_process_batch_in_a_thread_takes_the_turns_too(turns: int) -> None:
    # Rule: the turns apply to a batch that ends on the executor path (its end comes back to the loop from the
    # thread): the caller it answered, calling again at once, joins the items waiting (with turns=0 they go
    # without it). The thread blocks until the items wait.
    import threading

    block = threading.Event()
    b = SyncRecording(block=block, policy=Deadline(0, turns=turns))

    async def client() -> list[int]:
        return [await b.process(0), await b.process(10)]

    async with asyncio.timeout(30):
        first = asyncio.ensure_future(client())
        await until(lambda: b.stats.in_flight == 1 and not b.stats.queued)
        rest = [asyncio.ensure_future(b.process(x)) for x in (1, 2)]
        await until(lambda: b.stats.queued == 2)
        await until(lambda: len(b.batches) == 1)  # (the thread has started on [0])
        block.set()
        assert await asyncio.gather(first, *rest) == [[0, 20], 2, 4]
        await settle(b)
    assert b.batches == ([[0], [1, 2, 10]] if turns else [[0], [1, 2], [10]])
    idle_and_clean(b)
    await b.stop()


class Streams(AsyncBatcher[int, int]):
    """Streams two parts per item: its double, then its triple; the first batch waits for ``gate``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = asyncio.Event()
        self.batches: list[list[int]] = []

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
        first = not self.batches
        self.batches.append(list(batch))
        if first:
            await self.gate.wait()
        yield [x * 2 for x in batch]
        yield [x * 3 for x in batch]
        yield [END] * len(batch)


@pytest.mark.parametrize("turns", [0, 2])
async def test_a_streaming_batch_takes_the_turns_too(turns: int) -> None:
    # Rule: the turns apply to a streaming batch's end: a consumer whose stream the batch just completed, starting
    # its next stream at once, joins the streams waiting (with turns=0 they go without it); every stream gets all
    # its parts, once.
    b = Streams(policy=Deadline(0, turns=turns))

    async def consume(x: int) -> list[int]:
        return [part async for part in b.stream(x)]

    async def client() -> list[list[int]]:
        return [await consume(0), await consume(10)]

    async with asyncio.timeout(10):
        first = asyncio.ensure_future(client())
        await until(lambda: b.batches == [[0]])
        rest = [asyncio.ensure_future(consume(x)) for x in (1, 2)]
        await until(lambda: b.stats.queued == 2)
        b.gate.set()
        assert await asyncio.gather(first, *rest) == [[[0, 0], [20, 30]], [2, 3], [4, 6]]
        await settle(b)
    assert b.batches == ([[0], [1, 2, 10]] if turns else [[0], [1, 2], [10]])
    idle_and_clean(b)
    await b.stop()


class SecondSizeFails(Deadline):
    """``Deadline(0)`` whose second :meth:`size` (the second batch's forming) raises: a bug in the pump."""

    def __init__(self) -> None:
        super().__init__(0)
        self.asked = 0
        self.pending_then: list[bool] = []  # whether a turn was pending as it raised

    def size(self, lane: Any) -> int:
        self.asked += 1
        if self.asked == 2:
            handle = self.signals.pump_handle  # type: ignore[attr-defined]  # (the dispatcher that asks it)
            self.pending_then.append(handle is not None and not handle.cancelled())
            raise RuntimeError("bug")
        return super().size(lane)


async def test_an_internal_error_in_the_turns_pump_fails_each_waiting_caller_once(
    loop_errors: list[dict[str, Any]],
) -> None:
    # Rule: even a bug in the pump the turns run cannot leave a caller waiting: each waiting caller fails once
    # (AsyncBatchException), the error goes to the loop's exception handler, nothing stays scheduled, and the
    # batcher serves on. The bug is the policy's (the public way to put one in the pump): its size() raises as the
    # turns' pump forms the second batch (the last turn cleared the pending turn as it pumped).
    gate = asyncio.Event()
    policy = SecondSizeFails()
    b = Scripted(gate=gate, policy=policy)
    async with asyncio.timeout(10):
        first, rest = await first_batch_then_waiting(b, [1, 2, 3])
        gate.set()
        outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
        assert outcomes[0] == 0
        assert all(isinstance(x, AsyncBatchException) for x in outcomes[1:]), outcomes
        idle_and_clean(b)
        assert await b.process(5) == 10
    assert [c["message"] for c in loop_errors] == ["Scripted: SecondSizeFails.size() raised"]
    assert policy.pending_then == [False]
    assert b.batches == [[0], [5]]
    await b.stop()
