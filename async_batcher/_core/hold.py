"""The closed-loop hold (:class:`ClosedLoopHold`, ``max_hold_time``): a freed slot waits for the callers its batch
answered to come back, while they are a closed loop.

A closed loop's callers (clients that send their next request once they have their answer) come back after each
batch; without a hold the first one back goes alone and they split into cohorts that alternate. The hold keeps a
freed slot for the callers a batch answered, but only while the lane's traffic shows it is such a loop: its last
batch held all its callers (*alone*: far fewer items arrived in the lane while it ran than the lane's rate would
have brought). Independent arrivals keep coming while a batch runs: the hold stays off for them, and a slot goes
the moment it is free. While it is off, it is tried (a *probe*), for a cohort of ``cohort`` callers or more, at most
once every ``probe_every`` seconds, and ``probe_backoff`` times less often after each probe that did not gather its
lane's callers (up to ``probe_at_most``): a closed loop that is split shows itself only once gathered. A hold ends
when its callers are all back, after ``max_hold_time``, or once the lane has had no arrival for ``quiet`` of the time
the batch it follows took: callers that come back together come back close together.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, ClassVar

from async_batcher import _checks
from async_batcher._core.layers import Layer
from async_batcher._core.policy import BatchFacts, DispatchPolicy, Reason, rate_since_end

if TYPE_CHECKING:
    from collections.abc import Iterable

    from async_batcher._core.policy import LaneView

__all__ = ["ClosedLoopHold"]


class _Hold:
    """A lane's hold: since when (``since``: it ends ``max_hold_time`` later), at which count of arrivals its callers
    are all back (``mark``), how long it waits for an arrival (``quiet``), whether it is a probe, until when it kept
    the lane's items back (``kept``), whether its last batch held all its callers (``alone``), and the probes'
    schedule (``probe_at``, ``probe_wait``)."""

    __slots__ = ("alone", "kept", "mark", "probe_at", "probe_wait", "probing", "quiet", "since", "timed")

    def __init__(self, probe_every: float) -> None:
        self.since = self.kept = self.probe_at = -math.inf
        self.mark = 0
        self.quiet = 0.0
        self.probing = self.alone = self.timed = False
        self.probe_wait = probe_every


class ClosedLoopHold(Layer):
    """A freed slot waits up to ``max_hold_time`` for the callers its batch answered to come back, while the
    lane's traffic is a closed loop (see the module's docstring); over ``inner``'s rule (a
    :class:`~async_batcher.policies.Deadline` by default), which applies whenever no hold does."""

    #: A lane's last batch held all its callers (*alone*) if items arrived in the lane while it ran at this share of
    #: the lane's rate or less...
    alone_share: ClassVar[float] = 0.25
    #: ... the lane's rate bringing this many items or more while it ran (fewer tell nothing).
    alone_least: ClassVar[float] = 2.0
    #: A probe that did not gather its lane's callers multiplies the wait for the next by this (up to
    #: ``probe_at_most``); one that did brings it back to ``probe_every``.
    probe_backoff: ClassVar[float] = 2.0

    def __init__(
        self,
        max_hold_time: float,
        inner: DispatchPolicy | None = None,
        *,
        quiet: float = 0.5,
        cohort: int = 4,
        probe_every: float = 1.0,
        probe_at_most: float = 64.0,
    ) -> None:
        super().__init__(inner)
        self.max_hold_time = _checks.seconds("max_hold_time", max_hold_time)
        self.quiet = _checks.seconds("quiet", quiet)
        self.cohort = _checks.count("cohort", cohort, unlimited=False)
        self.probe_every = _checks.seconds("probe_every", probe_every, positive=True)
        self.probe_at_most = _checks.seconds("probe_at_most", probe_at_most, positive=True)
        self._new_hold = partial(_Hold, self.probe_every)

    @property
    def max_hold_time(self) -> float:
        """The most seconds, from a batch's end, that a free slot waits for its callers; ``0``: never."""
        return self._max_hold_time

    @max_hold_time.setter
    def max_hold_time(self, value: float) -> None:
        self._max_hold_time = _checks.seconds("max_hold_time", value)
        self.changed()

    def _hold(self, lane: LaneView) -> _Hold:
        hold: _Hold = self.memo(lane, self._new_hold)
        return hold

    def _end(self, hold: _Hold) -> float:
        return hold.since + self.max_hold_time

    def _holding(self, lane: LaneView, hold: _Hold, now: float) -> bool:
        """A hold may keep the lane's items back: its callers' return not complete, its time not up."""
        return self._end(hold) > now and lane.arrived < hold.mark

    def _holds(self, lane: LaneView, now: float) -> _Hold | None:
        """The lane's hold, if a free slot waits for its callers now (never while callers wait for room)."""
        hold = self._hold(lane)
        if self._holding(lane, hold, now) and (hold.alone or hold.probing) and not self.signals.room_wanted:
            return hold
        return None

    def full_at(self, lane: LaneView, now: float) -> int:
        hold = self._holds(lane, now)
        if hold is None:
            return self.inner.full_at(lane, now)
        return min(self.inner.largest(), hold.mark - lane.left)  # all back, or the largest batch

    def due(self, lane: LaneView, now: float) -> float:
        hold = self._holds(lane, now)
        at = self.inner.due(lane, now) if hold is None or self.inner.hard_deadline else math.inf
        if hold is None or at <= now:
            return at
        # Until it ends, or until the lane has had no arrival for `quiet` of the batch's time since the batch it
        # follows ended or its latest item arrived.
        hold.kept = min(self._end(hold), max(hold.since, lane.newest()) + hold.quiet)
        hold.timed = hold.kept < at
        return min(at, hold.kept)

    def reason(self, lane: LaneView, now: float) -> Reason:
        hold = self._hold(lane)
        if hold.timed and now >= hold.kept:
            return Reason.HOLD
        return self.inner.reason(lane, now)

    def dispatched(self, lane: LaneView, batch: BatchFacts, now: float) -> None:
        hold = self._hold(lane)
        # A probe's batch if it goes during the probe's time (a later batch, after one that ended with nothing
        # waiting, is not: it would judge the probe by other callers).
        batch.tag = hold.probing and now <= self._end(hold)
        if batch.oldest < hold.kept:  # the hold kept one of its items back
            self.signals.count("held")
            if hold.probing:
                self.signals.count("probes")
        hold.kept = hold.since = -math.inf
        hold.probing = hold.timed = False
        self.inner.dispatched(lane, batch, now)

    def ended(self, lane: LaneView, batch: BatchFacts, callers: int, now: float) -> bool:
        watch = self.inner.ended(lane, batch, callers, now)
        hold = self._hold(lane)
        ran, rate, during = rate_since_end(lane, batch, now)
        # It held them all if items arrived in the lane while it ran at a share of the lane's rate or less, that rate
        # bringing a few or more (fewer tell nothing).
        expected = rate * ran
        hold.alone = expected >= self.alone_least and during <= self.alone_share * expected
        if batch.tag:  # a probe that gathered them: the next may come soon; one that did not waits longer
            if hold.alone:
                hold.probe_wait = self.probe_every
                hold.probe_at = min(hold.probe_at, now + self.probe_every)
            else:
                hold.probe_wait = min(self.probe_backoff * hold.probe_wait, self.probe_at_most)
        if not self.max_hold_time or not callers:
            return watch
        if self._holding(lane, hold, now):
            hold.mark += callers  # another batch of the lane ended during its hold: it waits for them too
            return watch
        hold.mark = lane.arrived + callers
        hold.since = now
        hold.quiet = self.quiet * ran  # (a batch that ends during the hold adds its callers, and moves neither)
        hold.kept = -math.inf
        hold.probing = not hold.alone and callers >= self.cohort and now >= hold.probe_at
        if hold.probing:
            hold.probe_at = now + hold.probe_wait
        return watch

    def replaced(self, by: DispatchPolicy, lanes: Iterable[LaneView], now: float) -> None:
        # The batches it kept an item back for go as the new policy says, unseen by this one: each counts now.
        for lane in lanes:
            memos = lane.memo
            hold: _Hold | None = None if memos is None else memos.get(self)
            if hold is not None and lane.count and lane.oldest() < hold.kept:
                self.signals.count("held")
                if hold.probing:
                    self.signals.count("probes")
                hold.kept = -math.inf
        super().replaced(by, lanes, now)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_hold_time={self.max_hold_time!r}, {self.inner!r})"
