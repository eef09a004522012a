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
    from async_batcher._run import Batch, Run

__all__: list[str] = []


def due(b: Base, run: Run, lane: Lane, now: float) -> float:
    """Contract point 1, for one lane whose items wait and a free slot: when its next batch goes out.

    - at once (``now``) while the batcher stops (a drain waits for no deadline), or when the lane holds a full
      batch: ``max_batch_size`` items (the smallest of ``preferred_batch_sizes``, or the adaptive wait's target
      size, when set), or ``max_batch_weight``;
    - during a hold (:func:`holds`: the callers the lane's last batch answered are coming back with their next
      items), when they are all back, at the largest batch (``max_batch_size``, or the largest preferred size),
      once the lane has had no arrival for half the time that batch took (:func:`hold_until`), or when the hold
      ends, ``max_hold_time`` after that batch ended (or, with ``max_latency``, by the adaptive wait's deadline for
      its oldest item, if sooner: the budget holds);
    - else when its oldest waiting item has waited ``max_queue_time`` since it arrived (with ``max_latency``, the
      adaptive wait's deadline for it);
    - ``inf`` if nothing of it waits (its callers may all have left).
    """
    if not lane.count:
        return math.inf
    if run.state is State.STOPPING or lane.weight >= b._weight_limit:
        return now
    held = holds(b, run, lane, now)
    if lane.count >= (largest(b) if held else b._size_trigger):
        return now
    if held and b._adaptive is None:
        lane.kept = hold_until(b, run, lane)
        return lane.kept
    oldest = run.queue.oldest(lane)  # (it drops the entries of callers who left: the count may fall to 0)
    if oldest == math.inf:
        return math.inf
    if b._adaptive is None:
        return oldest + b._max_queue_time
    send_by = b._adaptive.send_by(oldest, max(lane.count, min(b._size_trigger, b._batch_limit)))
    if not held or send_by <= now:
        return send_by
    lane.kept = hold_until(b, run, lane)
    return min(send_by, lane.kept)


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


def largest(b: Base) -> int:
    """The largest batch: ``max_batch_size``, or the largest of ``preferred_batch_sizes``."""
    return b._preferred[-1] if b._preferred else b._batch_limit


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
#
# A closed loop's callers (clients that send their next request once they have their answer) come back after each
# batch; without a hold the first one back goes alone and they split into cohorts that alternate. The hold keeps a
# freed slot for the callers a batch answered, but only while the lane's traffic shows it is such a loop: its last
# batch held all its callers, since far fewer items arrived in the lane while it ran than the lane's rate would
# have brought. Independent arrivals keep coming while a batch runs: the hold stays off for them, and a slot goes
# the moment it is free. While it is off, it is tried (a probe), for a cohort of COHORT callers or more, at most
# once every PROBE_EVERY seconds, and half as often after each probe that did not gather its lane's callers (up to
# PROBE_AT_MOST): a closed loop that is split shows itself only once gathered, and independent arrivals pay for a
# probe about once a minute. A hold ends when its callers are all back, after max_hold_time, or once the lane has had
# no arrival for QUIET of the time the batch it follows took: callers that come back together come back close
# together, and beside independent arrivals a batch's callers are not all coming back.

COHORT = 4
# A hold ends once its lane has had no arrival for this share of the time the batch it follows took.
QUIET = 0.5
# A probe's wait after a probe that gathered its lane's callers; it doubles after each that did not, up to the last.
PROBE_EVERY = 1.0
PROBE_AT_MOST = 64.0


def answered(b: Base, run: Run, batch: Batch, callers: int, now: float) -> None:
    """A batch ended, having answered ``callers`` (each call it resolved counts once: a ``process_many`` whose items
    are still to go counts when its last batch ends; a caller who had left is not one): whether it held all its
    lane's callers, whether they are a cohort that may come back together, and, for at most ``max_hold_time`` from
    now, the hold for them (:func:`holds`)."""
    lane = batch.lane
    # It held them all if items arrived in the lane while it ran at a quarter of the lane's rate since its previous
    # answer or less, that rate bringing two or more (fewer tell nothing).
    # (The rate over at least the batch's own time: with several slots, another batch may have ended just before.)
    during = lane.arrived - batch.arrived_before
    ran = now - batch.started
    since = max(now - lane.ended, ran)
    rate = (lane.arrived - lane.arrived_at_end) / since if since > 0 else 0.0
    lane.alone = rate * ran >= 2 and during * 4 <= rate * ran and not run.is_stream
    # A cohort, for the turns before its first caller back (_dispatch.wake), on weaker evidence than the hold's (the
    # turns cost no time): two callers or more, and nothing arrived while it ran though the rate would have brought
    # one. Independent arrivals at a rate that brings one in a batch's time leave a batch without one about a third
    # of the time; at lower rates the rate since the batch before rarely reaches one (a burst).
    lane.cohort = callers >= 2 and not during and rate * ran >= 1
    if batch.probe:  # a probe that gathered them: the next may come soon; one that did not waits twice as long
        if lane.alone:
            run.probe_wait = PROBE_EVERY
            run.probe_at = min(run.probe_at, now + PROBE_EVERY)
        else:
            run.probe_wait = min(2 * run.probe_wait, PROBE_AT_MOST)
    lane.ended, lane.arrived_at_end = now, lane.arrived
    if not b._max_hold_time or not callers:
        return
    if holding(b, lane, now):
        lane.hold_mark += callers  # another batch of the lane ended during its hold: the hold waits for them too
        return
    lane.hold_mark = lane.arrived + callers
    lane.hold_from = now
    lane.quiet = QUIET * ran  # (a batch that ends during the hold adds its callers, and moves neither)
    lane.kept = -math.inf  # (what an earlier hold kept back has left: it was withdrawn, or its batch went)
    lane.probing = not lane.alone and callers >= COHORT and now >= run.probe_at
    if lane.probing:
        run.probe_at = now + run.probe_wait


def holds(b: Base, run: Run, lane: Lane, now: float) -> bool:
    """Whether a free slot waits for the callers the lane's last batch answered: some have not come back yet and
    ``max_hold_time`` has not passed since it ended (the setting as it is now); the lane's last batch held all its
    callers, or this hold is a probe; the batcher runs; and nobody waits for room in the queue (the batch the hold
    keeps back would make it)."""
    return holding(b, lane, now) and (lane.alone or lane.probing) and run.state is State.RUNNING and not run.putters


def holding(b: Base, lane: Lane, now: float) -> bool:
    """Whether a hold may keep the lane's items back now (its callers' return not yet complete, its time not up)."""
    return hold_end(b, lane) > now and lane.arrived < lane.hold_mark


def hold_until(b: Base, run: Run, lane: Lane) -> float:
    """When the lane's hold lets its waiting items go if its callers are not all back: when it ends
    (:func:`hold_end`), or once the lane has had no arrival, since the batch the hold follows ended or its latest
    item arrived, for half the time that batch took (:data:`QUIET`): callers that come back together come back
    close together, and a slot kept free longer for a late one costs more than the batch it would save."""
    return min(hold_end(b, lane), max(lane.hold_from, run.queue.newest(lane)) + lane.quiet)


def hold_end(b: Base, lane: Lane) -> float:
    """When the lane's hold ends: ``max_hold_time``, as set now, after the batch it follows ended."""
    return lane.hold_from + b._max_hold_time


def formed(b: Base, lane: Lane, oldest: float) -> None:
    """A batch of ``lane`` goes, its oldest item having arrived at ``oldest``: its hold, if any, is over. It counts
    in the statistics if the hold kept the lane back while one of its items waited (not if those the hold kept back
    were all withdrawn, and the batch is of later arrivals)."""
    if oldest < lane.kept:
        b._recorder.held += 1
        b._recorder.probes += lane.probing
    lane.kept = -math.inf
    lane.hold_from = -math.inf
    lane.probing = False
