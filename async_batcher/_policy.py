"""The dispatch policy: when a lane's next batch is due, which lane goes, how many items it takes, the hold, and
the adaptive size trigger (private).

Decisions only, over the settings and the state of a run: nothing here schedules, launches or awaits anything.
:mod:`~async_batcher._dispatch` applies them (the pump, the timer); :func:`due` is contract point 1 for one lane.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from async_batcher._run import State
from async_batcher._settings import UNLIMITED

if TYPE_CHECKING:
    from async_batcher._base import Base
    from async_batcher._lane import Lane
    from async_batcher._queue import Taken
    from async_batcher._run import Run

__all__: list[str] = []


def due(b: Base, run: Run, lane: Lane, now: float) -> float:
    """Contract point 1, for one lane whose items wait and a free slot: when its next batch goes out.

    - at once (``now``) while the batcher stops (a drain waits for no deadline), or when the lane holds a full
      batch: ``max_batch_size`` items (the smallest of ``preferred_batch_sizes``, or the adaptive wait's target
      size, when set), or ``max_batch_weight``;
    - during a hold (:func:`holds`: the callers the lane's last batch answered are coming back with their next
      items), when they are all back, or when the hold ends, ``max_hold_time`` after that batch ended;
    - else when its oldest waiting item has waited ``max_queue_time`` since it arrived (with ``max_latency``, the
      adaptive wait's deadline for it);
    - ``inf`` if nothing of it waits (its callers may all have left).
    """
    if not lane.count:
        return math.inf
    if run.state is State.STOPPING or lane.count >= b._size_trigger or lane.weight >= b._weight_limit:
        return now
    if lane.hold_until > now and holds(b, run, lane):
        return lane.hold_until
    oldest = run.queue.oldest(lane)  # (it drops the entries of callers who left: the count may fall to 0)
    if oldest == math.inf:
        return math.inf
    if b._adaptive is None:
        return oldest + b._max_queue_time
    return b._adaptive.send_by(oldest, max(lane.count, min(b._size_trigger, b._batch_limit)))


def choose(b: Base, run: Run, now: float) -> tuple[Lane | None, float]:
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


def cut(b: Base, waiting: int) -> int:
    """How many items a batch due now takes: ``max_batch_size``, or with preferred sizes the largest one
    available (a batch sent before any is reached, by its deadline or a stop, takes what there is)."""
    fits = [size for size in b._preferred if size <= waiting]  # (ascending)
    return fits[-1] if fits else b._batch_limit


def adapt(b: Base, run: Run, now: float) -> None:
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


# ---------------------------------------------------------------------- the hold

# The hold applies while the items of recent batches arrived, on average, within this fraction of their batch's time
# after the answer before them: a closed loop's callers that come back within a batch's time (waiting longer for
# them would cost more than the batch it saves); independent arrivals give one half.
FOLLOWS_ANSWERS = 0.25
# The weight of each batch in that average, once ten have counted: about the last ten batches count.
_FOLLOW_WEIGHT = 0.1


def answered(b: Base, run: Run, lane: Lane, callers: int, now: float) -> None:
    """A batch of ``lane`` ended, having answered ``callers`` (each call it resolved counts once: a ``process_many``
    whose items are still to go counts when its last batch ends). From now on, for at most ``max_hold_time``, a free
    slot may wait for them to come back with their next items (:func:`holds`)."""
    lane.ended_before, lane.ended = lane.ended, now
    if b._max_hold_time and callers:
        lane.hold_mark = lane.arrived + callers
        lane.hold_until = now + b._max_hold_time


def holds(b: Base, run: Run, lane: Lane) -> bool:
    """Whether a free slot waits for the callers the lane's last batch answered (until ``lane.hold_until``, which
    the caller checks): some have not come back yet; items arrive as answers go out (:attr:`Run.follows_answers`:
    a closed loop's callers, not independent arrivals); the batcher runs; and nobody waits for room in the queue
    (the batch the hold keeps back would make it)."""
    return (
        lane.arrived < lane.hold_mark
        and run.follows_answers < FOLLOWS_ANSWERS
        and run.state is State.RUNNING
        and not run.putters
    )


def holding(lane: Lane, now: float) -> bool:
    """Whether a hold may keep the lane's items back now (its callers' return not yet complete, its time not up)."""
    return lane.hold_until > now and lane.arrived < lane.hold_mark


def formed(run: Run, lane: Lane, taken: Taken, now: float) -> None:
    """A batch of ``lane`` goes: its hold is over; and how its items arrived counts in :attr:`Run.follows_answers`.

    The measure: how long after the lane's last answer before it each item arrived, on average (the mean of its
    oldest and newest items'), as a fraction of the time since the lane's previous batch was formed. The callers of
    a closed loop come back soon after their answer, then wait, for the batch in flight or for the others (a
    hold): a small fraction, below one quarter while they are back within a batch's time. Independent arrivals
    come at any time: one half on average.
    """
    lane.hold_until = -math.inf
    previous, lane.formed = lane.formed, now
    span = now - previous
    oldest = _since_answer(lane, taken.oldest)
    if span <= 0 or oldest < 0:
        return  # the lane's first batches, or items older than its last two answers: no measure
    run.follow_samples += 1
    # The mean of the first batches, then a moving average of the last ten or so: quick to learn, slow to waver.
    weight = max(_FOLLOW_WEIGHT, 1 / run.follow_samples)
    fraction = min(1.0, (oldest + _since_answer(lane, taken.newest)) / 2 / span)
    run.follows_answers += weight * (fraction - run.follows_answers)


def _since_answer(lane: Lane, arrival: float) -> float:
    """How long after the lane's last answer before it an item arrived; ``-1`` if before its last two."""
    if arrival >= lane.ended > -math.inf:
        return arrival - lane.ended
    if lane.ended > arrival >= lane.ended_before > -math.inf:
        return arrival - lane.ended_before
    return -1.0
