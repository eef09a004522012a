"""When a batch goes out: the dispatch rule, the choice of lane, the one timer, the adaptive size trigger (private).

The rule is :func:`due`, for one lane; :func:`pump` applies it to every lane while slots are free, and arms a
single timer for the earliest deadline of the lanes that are not due yet. Nothing runs while nothing waits: an
item's arrival schedules the pump (:func:`arrived`) only when a batch may have become due; a batch's end and a
timer schedule it too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from async_batcher import _admission, _execution, _lifecycle
from async_batcher._run import Run, State
from async_batcher._settings import UNLIMITED
from async_batcher.exceptions import AsyncBatchException

if TYPE_CHECKING:
    from async_batcher._queue import Lane
    from async_batcher.batcher import AsyncBatcher

__all__: list[str] = []

_DISPATCHING = (State.RUNNING, State.STOPPING)


def due(b: AsyncBatcher[Any, Any], run: Run, lane: Lane, now: float) -> float:
    """Contract point 1, for one lane whose items wait and a free slot: when its next batch goes out.

    - at once (``now``) while the batcher stops (a drain waits for no deadline), or when the lane holds a full
      batch: ``max_batch_size`` items (the smallest of ``preferred_batch_sizes``, or the adaptive wait's target
      size, when set), or ``max_batch_weight``;
    - during a hold (``max_hold_time``: the callers the last batch answered may come back with their next items),
      at once when they are all back or callers wait for room in the queue, else when the hold ends
      (:func:`look_again` extends it while they keep coming back);
    - else when its oldest waiting item has waited ``max_queue_time`` since it arrived (with ``max_latency``, the
      adaptive wait's deadline for it);
    - ``inf`` if nothing of it waits (its callers may all have left).
    """
    if not lane.count:
        return math.inf
    if run.state is State.STOPPING or lane.count >= b._size_trigger or lane.weight >= b._weight_limit:
        return now
    if run.hold_until > now:
        return now if not may_hold(b, run) else run.hold_until
    oldest = run.queue.oldest(lane)  # (it drops the entries of callers who left: the count may fall to 0)
    if oldest == math.inf:
        return math.inf
    if b._adaptive is None:
        return oldest + b._max_queue_time
    return b._adaptive.send_by(oldest, max(lane.count, min(b._size_trigger, b._batch_limit)))


def choose(b: AsyncBatcher[Any, Any], run: Run, now: float) -> tuple[Lane | None, float]:
    """The due lane served longest ago, so that keys take turns when slots are scarce; and, of the lanes it
    looked at that are not due, the earliest time one will be."""
    chosen: Lane | None = None
    next_at = math.inf
    for lane in run.queue.lanes.values():
        if chosen is not None and lane.served >= chosen.served:
            continue  # it cannot go before the one chosen
        at = due(b, run, lane, now)
        if at <= now:
            chosen = lane
            if not lane.served:
                break  # never served: nobody goes before it
        elif at < next_at:
            next_at = at
    return chosen, next_at


def pump(b: AsyncBatcher[Any, Any], run: Run) -> None:
    """Send every batch that is due while slots are free; else arm one timer for the next deadline."""
    if run.state not in _DISPATCHING:
        return
    queue = run.queue
    # A timer may fire a hair before its time by the loop's clock resolution: when it fired for a deadline, that
    # deadline is due.
    now = max(run.loop.time(), run.timer_when)
    if b._adaptive is not None:
        adapt(b, run, now)
    if b._max_hold_time and run.in_flight < b._slot_limit:
        if run.hold_mark != run.owed_mark:
            hold(b, run, now)
        elif -math.inf < run.hold_until <= now:
            look_again(b, run, now)
    next_at = math.inf
    while queue.waiting and run.in_flight < b._slot_limit:
        lane, next_at = choose(b, run, now)
        if lane is None:
            break
        run.dispatches += 1
        lane.served = run.dispatches
        limit = cut(b, lane.count)
        taken = queue.take(lane, limit, b._weight_limit, now=now, max_priority_wait=b._max_priority_wait)
        if taken is not None:
            _execution.launch(b, run, taken, now, lane)
            # A batch that goes ends the hold, and the next starts only once a batch has answered its callers.
            run.hold_until = -math.inf
            run.hold_mark = run.owed_mark
    run.trigger = (
        b._size_trigger if run.hold_until <= now else min(b._size_trigger, run.queue.lane0.count + owed(b, run))
    )
    queue.drop_empty_lanes()
    if run.putters:
        _admission.wake_putters(b, run)  # the batches just taken made room
    if not queue.waiting:
        cancel_timer(run)  # nothing waits: an idle batcher has no wake-ups
        _lifecycle.check_drained(b, run)
    elif run.in_flight < b._slot_limit and next_at < math.inf:
        arm_timer(b, run, next_at)


# ---------------------------------------------------------------------- the hold


def submitted(b: AsyncBatcher[Any, Any], run: Run) -> int:
    """Items submitted so far (what the statistics call ``submitted``), counted without a step per item."""
    return b._recorder.exited + run.queue.waiting + run.awaiting_room


def owed(b: AsyncBatcher[Any, Any], run: Run) -> int:
    """How many of the callers the last batch answered have not come back with an item yet."""
    return run.owed_mark - submitted(b, run)


def answered(b: AsyncBatcher[Any, Any], run: Run, callers: int) -> None:
    """A batch has answered ``callers``: from now, a free slot may wait (a hold) for them to come back."""
    if b._max_hold_time:
        run.owed_mark = submitted(b, run) + callers


def may_hold(b: AsyncBatcher[Any, Any], run: Run) -> bool:
    """Whether a free slot may wait: items wait, callers the last batch answered are still to come back, nobody
    waits for room in the queue (the batch that goes makes it), and the batcher is not stopping."""
    return bool(run.queue.waiting) and run.state is State.RUNNING and owed(b, run) > 0 and not run.putters


def hold(b: AsyncBatcher[Any, Any], run: Run, now: float) -> None:
    """A slot is free: hold it for the callers the last batch answered, ``max_hold_time`` for a start (once per
    batch that answered them; :func:`look_again` extends it)."""
    if may_hold(b, run):
        run.hold_mark = run.owed_mark
        run.hold_until = now + b._max_hold_time
        run.hold_seen = submitted(b, run)
        run.hold_graced = False


def look_again(b: AsyncBatcher[Any, Any], run: Run, now: float) -> None:
    """A hold's time is up and callers are still owed: extend it by ``max_hold_time`` if some came back since it
    last looked, or (once in a row) if the loop looked late by ``max_hold_time`` or more: busy, it could not
    have run their requests; else the hold ends. Each extension but a busy loop's takes a caller back, so a hold
    ends after at most about twice as many extensions as callers owed."""
    seen = submitted(b, run)
    came_back = seen > run.hold_seen
    busy = now - run.hold_until >= b._max_hold_time and not run.hold_graced
    if (came_back or busy) and may_hold(b, run):
        run.hold_seen = seen
        run.hold_graced = not came_back
        run.hold_until = now + b._max_hold_time
    else:
        run.hold_until = -math.inf


def holding(run: Run) -> bool:
    """Whether a hold is on (or has run out, and the dispatcher has not looked again yet)."""
    return run.hold_until != -math.inf


def room_wanted(b: AsyncBatcher[Any, Any], run: Run) -> None:
    """A caller waits for room in the queue: a hold never keeps it waiting (the batch the hold keeps back makes
    room, :func:`may_hold`), so let the dispatcher look again."""
    if holding(run):
        repump(b, run)


def cut(b: AsyncBatcher[Any, Any], waiting: int) -> int:
    """How many items a batch due now takes: ``max_batch_size``, or with preferred sizes the largest one
    available (a batch sent before any is reached, by its deadline or a stop, takes what there is)."""
    fits = [size for size in b._preferred if size <= waiting]  # (ascending)
    return fits[-1] if fits else b._batch_limit


def adapt(b: AsyncBatcher[Any, Any], run: Run, now: float) -> None:
    """The adaptive wait: learn the arrival rate, and set the size at which a batch goes at once."""
    adaptive = b._adaptive
    if adaptive is None:
        return
    adaptive.note_arrivals(b._recorder.exited + run.queue.waiting, now)
    target = adaptive.target_size(b._concurrency)
    trigger = max(1, min(b._batch_limit, math.ceil(target) if target < math.inf else UNLIMITED))
    if b._preferred:  # the smallest preferred size that reaches the target
        trigger = next((size for size in b._preferred if size >= trigger), b._preferred[-1])
    b._size_trigger = trigger


# ---------------------------------------------------------------------- waking the pump


def arrived(b: AsyncBatcher[Any, Any], run: Run, lane: Lane) -> None:
    """Items joined ``lane``: schedule the pump if a batch may now be due. :meth:`AsyncBatcher.process` inlines
    this test for the default lane, where the last three conditions are one, ``lane.count >= run.trigger``."""
    if run.pump_handle is not None or run.in_flight >= b._slot_limit:
        return  # the pump is coming already, or no batch can go before one ends (which pumps)
    if (
        run.timer is None  # nothing else would wake it
        or lane.count >= b._size_trigger
        or lane.weight >= b._weight_limit
        # A hold, and as many items back as callers it waits for (a process_many may bring more than one).
        or (holding(run) and owed(b, run) <= 0)
    ):
        run.pump_handle = run.loop.call_soon(scheduled_pump, b, run)


def repump(b: AsyncBatcher[Any, Any], run: Run) -> None:
    """A setting or the state changed: let the dispatcher look again (a no-op when the run does not dispatch)."""
    if run.state in _DISPATCHING and run.pump_handle is None and not run.loop.is_closed():
        run.pump_handle = run.loop.call_soon(scheduled_pump, b, run)


def scheduled_pump(b: AsyncBatcher[Any, Any], run: Run) -> None:
    run.pump_handle = None
    pump_safely(b, run)


def pump_safely(b: AsyncBatcher[Any, Any], run: Run) -> None:
    """:func:`pump`, such that even a bug in it cannot leave a caller waiting: it fails them, and serves on."""
    try:
        pump(b, run)
    except Exception as exc:
        run.loop.call_exception_handler(
            {"message": f"{b.name}: internal error while dispatching batches", "exception": exc}
        )
        _lifecycle.abort(b, run, AsyncBatchException(f"{b.name}: internal error while dispatching batches: {exc!r}"))


# ---------------------------------------------------------------------- the timer


def arm_timer(b: AsyncBatcher[Any, Any], run: Run, deadline: float) -> None:
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


def on_timer(b: AsyncBatcher[Any, Any], run: Run, when: float) -> None:
    run.timer = None
    run.timer_when = when
    pump_safely(b, run)
