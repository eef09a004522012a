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
    from async_batcher._run import Run

__all__: list[str] = []


def due(b: Base, run: Run, lane: Lane, now: float) -> float:
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


def submitted(b: Base, run: Run) -> int:
    """Items submitted so far (what the statistics call ``submitted``), counted without a step per item."""
    return b._recorder.exited + run.queue.waiting + run.awaiting_room


def owed(b: Base, run: Run) -> int:
    """How many of the callers the last batch answered have not come back with an item yet."""
    return run.owed_mark - submitted(b, run)


def answered(b: Base, run: Run, callers: int) -> None:
    """A batch has answered ``callers``: from now, a free slot may wait (a hold) for them to come back."""
    if b._max_hold_time:
        run.owed_mark = submitted(b, run) + callers


def may_hold(b: Base, run: Run) -> bool:
    """Whether a free slot may wait: items wait, callers the last batch answered are still to come back, nobody
    waits for room in the queue (the batch that goes makes it), and the batcher is not stopping."""
    return bool(run.queue.waiting) and run.state is State.RUNNING and owed(b, run) > 0 and not run.putters


def hold(b: Base, run: Run, now: float) -> None:
    """A slot is free: hold it for the callers the last batch answered, ``max_hold_time`` for a start (once per
    batch that answered them; :func:`look_again` extends it)."""
    if may_hold(b, run):
        run.hold_mark = run.owed_mark
        run.hold_until = now + b._max_hold_time
        run.hold_seen = submitted(b, run)
        run.hold_graced = False


def look_again(b: Base, run: Run, now: float) -> None:
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
