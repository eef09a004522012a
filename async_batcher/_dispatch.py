"""Sending batches out: the pump that applies the policy while slots are free, the one timer, the wake-ups, the
launch of a batch on its path, and the abort that fails everything (private).

:func:`pump` asks :mod:`~async_batcher._policy` which lane is due and launches its batch on the path of its
``process_batch`` (:mod:`~async_batcher._execution`, :mod:`~async_batcher._streaming`), while slots are free;
else it arms a single timer for the earliest deadline of the lanes that are not due yet. Nothing runs while
nothing waits: an item's arrival schedules the pump (:func:`arrived`) only when a batch may have become due; a
batch's end (:func:`batch_ended`, which each run is given as its :attr:`~async_batcher._run.Run.batch_ended`) and
the timer schedule it too. A batch's end lets the loop turn before the next batch forms (:func:`_turn`), and so does
the first arrival after a batch that answered a cohort (:func:`wake`).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

from async_batcher import _execution, _forming, _policy, _room, _streaming
from async_batcher._run import Batch, Run, State
from async_batcher._sinks import fail_sinks
from async_batcher.exceptions import AsyncBatchException

if TYPE_CHECKING:
    from async_batcher._base import Base
    from async_batcher._forming import Taken
    from async_batcher._lane import Lane

__all__: list[str] = []

_DISPATCHING = (State.RUNNING, State.STOPPING)


def pump(b: Base, run: Run) -> None:
    """Send every batch that is due while slots are free; else arm one timer for the next deadline."""
    if run.state not in _DISPATCHING:
        return
    queue = run.queue
    # A timer may fire a hair before its time by the loop's clock resolution: when it fired for a deadline, that
    # deadline is due.
    now = max(run.loop.time(), run.timer_when)
    if b._adaptive is not None:
        _policy.adapt(b, run, now)
    next_at = math.inf
    while queue.waiting and run.in_flight < b._slot_limit:
        lane, next_at = _policy.choose(b, run, now)
        if lane is None:
            break
        run.dispatches += 1
        lane.served = run.dispatches
        limit = _policy.cut(b, lane.count)
        taken = _forming.take(queue, lane, limit, b._weight_limit, now=now, max_priority_wait=b._max_priority_wait)
        if taken is not None:
            launch(b, run, taken, now, lane)
            _policy.formed(b, lane, taken.oldest)
    lane0 = queue.lane0
    # process()'s short path wakes the dispatcher at this count: during a hold, the count at which the callers it
    # waits for are all back (or the largest batch is full).
    run.trigger = (
        min(_policy.largest(b), lane0.hold_mark - lane0.left) if _policy.holds(b, run, lane0, now) else b._size_trigger
    )
    queue.drop_empty_lanes(now - b._max_hold_time)
    if run.putters:
        _room.wake_putters(b, run)  # the batches just taken made room
    if not queue.waiting:
        cancel_timer(run)  # nothing waits: an idle batcher has no wake-ups
        run.check_drained()
    elif run.in_flight < b._slot_limit and next_at < math.inf:
        arm_timer(b, run, next_at)


def launch(b: Base, run: Run, taken: Taken, now: float, lane: Lane) -> None:
    """Send a batch just taken from the queue on its way, on its ``process_batch``'s path; it takes a slot until it
    ends (:func:`batch_ended`). Its task runs in the batch's own context (:attr:`Batch.context`), never in the one
    that happens to run the pump (a caller's, or the batch that just ended)."""
    batch = Batch(run, taken, now, lane)
    lane.regather_until = 0.0  # (a batch that goes some other way, by a deadline or full, ends the regather)
    # Formed by a probe of the hold if during its time (a later batch, after one that ended with nothing waiting,
    # is not: it would judge the probe by other callers).
    batch.probe = lane.probing and now <= _policy.hold_end(b, lane)
    run.batches[batch] = None
    run.in_flight += 1
    lane.in_flight += 1
    startup = run.startup
    if run.is_stream:
        batch.handle = run.loop.create_task(_streaming.run_stream_batch(b, batch), context=batch.context)
    elif run.is_coroutine or (startup is not None and (not _succeeded(startup) or run.start_line is not None)):
        batch.handle = run.loop.create_task(_execution.run_batch(b, batch), context=batch.context)
    else:
        _execution.to_executor(b, batch)


def _succeeded(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def batch_ended(b: Base, run: Run, batch: Batch, callers: int) -> None:
    """A batch has freed its slot, having answered ``callers``: the hold may wait for them (policy), and a free slot
    never idles while a batch is due.

    While items wait, the next batch forms ``b._turns`` (4) turns of the loop later, not at once: callers the loop
    already holds join it (requests read from their sockets, whose handlers have yet to run, and the callers this
    batch just answered, if they call again at once), where they would have followed alone, and the batches of a busy
    server stop splitting into ever more, ever smaller ones. Turns, not time: on an idle loop they pass at once, and
    a lone caller, or one after an idle batcher, never waits for them (an arrival into a free slot pumps as before);
    nor do as many items as the largest batch takes, a stop, or a caller waiting for room in the queue.

    If nothing of its lane waits, and the batch answered a cohort (two callers or more, and nothing arrived in its
    lane while it ran though the lane's rate would have brought an item: :func:`_policy.answered`), the lane's first
    item to arrive after it lets the same turns pass (:func:`wake`): a closed loop's cohort comes back one request
    at a time, and the first one back would otherwise go alone and split it in two for good (the others, coming
    while it runs, go next, and their batch's end finds the first one's callers waiting). Only within one cycle of
    the lane (the time since its batch before ended): a caller after an idle spell goes at once."""
    lane = batch.lane
    lane.in_flight -= 1
    now = run.loop.time()
    cycle = now - (lane.ended if lane.ended != -math.inf else batch.started)
    _policy.answered(b, run, batch, callers, now)
    waiting = run.queue.waiting
    if 0 < waiting < _policy.largest(b) and run.state is State.RUNNING and not run.putters:
        if run.pump_handle is not None:  # a pump to come (an arrival's, another end's turns) comes after these
            run.pump_handle.cancel()
        _turn(b, run, b._turns)
    else:
        pump_safely(b, run)
    if lane.cohort and b._regather and b._turns and not lane.count:
        lane.regather_until = now + cycle


def _turn(b: Base, run: Run, left: int) -> None:
    """Pump after ``left`` more turns of the loop: each a zero-delay timer, which the loop runs once it has polled
    its sockets and run what was ready. The pending turn is the run's ``pump_handle``: arrivals do not pump early, and
    a batch that ends meanwhile starts the count again (its callers join too: the slots' ends are few)."""
    if left > 0:
        run.pump_handle = run.loop.call_at(run.loop.time(), _turn, b, run, left - 1)
    else:
        scheduled_pump(b, run)


# ---------------------------------------------------------------------- waking the pump


def arrived(b: Base, run: Run, lane: Lane) -> None:
    """Items joined ``lane``: schedule the pump if a batch may now be due. :meth:`AsyncBatcher.process` inlines
    this test for the default lane, where the last three conditions are one, ``lane.count >= run.trigger``."""
    if run.pump_handle is not None or run.in_flight >= b._slot_limit:
        return  # the pump is coming already, or no batch can go before one ends (which pumps)
    if (
        run.timer is None  # nothing else would wake it
        or lane.count >= b._size_trigger
        or lane.weight >= b._weight_limit
        # A hold, and as many items back as callers it waits for (a process_many may bring more than one).
        or (lane.hold_from != -math.inf and lane.arrived >= lane.hold_mark)
    ):
        wake(b, run, lane)


def wake(b: Base, run: Run, lane: Lane) -> None:
    """Schedule the pump for an arrival into a free slot: at once, but for a lane's first arrival after its batch
    that answered a cohort and left nothing of it waiting (:func:`batch_ended`), after the loop's turns if it came
    within the lane's cycle and the lane does not hold a full batch (the regather ends with it, either way).
    :meth:`AsyncBatcher.process` calls it only for that first arrival, and schedules the pump inline otherwise. (An
    arrival is always into a running batcher; a stop or a caller waiting for room during the turns waits for them,
    four turns at most.)"""
    until, lane.regather_until = lane.regather_until, 0.0
    if until and until > run.clock() and lane.count < _policy.largest(b):
        _turn(b, run, b._turns)
    else:
        run.pump_handle = run.loop.call_soon(scheduled_pump, b, run)


def room_wanted(b: Base, run: Run) -> None:
    """A caller waits for room in the queue: a hold never keeps it waiting (the batch the hold keeps back makes
    room, :func:`_policy.holds`), so let the dispatcher look again if its timer may be a hold's."""
    if run.timer is not None:
        repump(b, run)


def repump(b: Base, run: Run) -> None:
    """A setting or the state changed: let the dispatcher look again (a no-op when the run does not dispatch)."""
    if run.state in _DISPATCHING and run.pump_handle is None and not run.loop.is_closed():
        run.pump_handle = run.loop.call_soon(scheduled_pump, b, run)


def scheduled_pump(b: Base, run: Run) -> None:
    run.pump_handle = None
    pump_safely(b, run)


def pump_safely(b: Base, run: Run) -> None:
    """:func:`pump`, such that even a bug in it cannot leave a caller waiting: it fails them, and serves on."""
    try:
        pump(b, run)
    except Exception as exc:
        run.loop.call_exception_handler(
            {"message": f"{b.name}: internal error while dispatching batches", "exception": exc}
        )
        abort(b, run, AsyncBatchException(f"{b.name}: internal error while dispatching batches: {exc!r}"))


# ---------------------------------------------------------------------- the timer


def arm_timer(b: Base, run: Run, deadline: float) -> None:
    """Make sure the pump runs at ``deadline``: one timer, for the earliest deadline."""
    if run.timer is not None:
        if run.timer_at <= deadline:
            return  # it fires first and will look again
        run.timer.cancel()
    run.timer = run.loop.call_at(deadline, on_timer, b, run, deadline)
    run.timer_at = deadline


def cancel_timer(run: Run) -> None:
    if run.timer is not None:
        run.timer.cancel()
        run.timer = None


def on_timer(b: Base, run: Run, when: float) -> None:
    run.timer = None
    run.timer_when = when
    pump_safely(b, run)


# ---------------------------------------------------------------------- failing everything


def abort(b: Base, run: Run, exc: AsyncBatchException) -> None:
    """Fail every queued, waiting and in-flight caller with ``exc``; cancel the batches in flight and free their
    slots. A batch running in a thread runs on to its end unheard; one still waiting for a thread never starts. The
    callers of a batch cut off inside ``process_batch`` get what ``abandoned_error()`` says."""
    rec = b._recorder
    fail_sinks(run.queue.clear(), exc, rec)
    _room.fail_putters(run, exc)
    for batch in run.batches:
        batch.abandoned = True
        batch.lane.in_flight -= 1
        fail_sinks(batch.sinks, _execution.stopped_error(b, batch, exc), rec)
        if isinstance(batch.handle, asyncio.Task):
            batch.handle.cancel()
    run.batches.clear()
    run.in_flight = 0
    cancel_timer(run)
    run.check_drained()
