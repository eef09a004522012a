"""The waits: how long a lane's oldest item waits for its batch to fill. :class:`Deadline` (``max_queue_time``) and
:class:`LatencyBudget` (``max_latency``, the adaptive wait), with the loop's turns and the regather they share.

**Turns.** After a batch's end, while fewer items wait than the largest batch, the next batch forms ``turns`` turns
of the event loop later, not at once: the requests the loop has read but whose handlers have not run yet, and the
callers the batch just answered if they call again at once, join it, where they would have followed alone; a busy
server's batches stop splitting into ever more, ever smaller ones. Turns, not time: on an idle loop they pass at
once, and a lone caller never waits for them.

**Regather.** After a batch that answered a *cohort* (two callers or more, and nothing arrived in its lane while it
ran though the lane's rate would have brought an item) and left nothing of its lane waiting, the lane's first
arrival within the lane's cycle (the time since its batch before ended) lets the same turns pass: a closed loop's
cohort comes back one request at a time, and the first one back would otherwise go alone and split it in two for
good. A caller after an idle spell goes at once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from async_batcher import _checks
from async_batcher._core.policy import UNLIMITED, BatchFacts, DispatchPolicy, cycle, rate_since_end
from async_batcher.adaptive import AdaptiveWait

if TYPE_CHECKING:
    from async_batcher._core.policy import LaneView

__all__ = ["Deadline", "LatencyBudget"]

#: ``max_queue_time`` by default (:class:`Deadline`'s): the most seconds the oldest item waits for its batch to fill.
MAX_QUEUE_TIME: Final = 0.01
#: The loop's turns after a batch's end by default (:class:`Deadline`'s and :class:`LatencyBudget`'s).
TURNS: Final = 4


class _Regather:
    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until = 0.0  # until when the lane's next arrival lets the turns pass (0: it does not)


class _Waiting(DispatchPolicy):
    """A wait with the turns and the regather (see the module's docstring)."""

    def __init__(self, *, turns: int, regather: bool) -> None:
        self.turns = _checks.count("turns", turns, unlimited=False) if turns else 0
        self.regather = _checks.flag("regather", regather)

    def dispatched(self, lane: LaneView, batch: BatchFacts, now: float) -> None:
        if lane.memo is not None and self in lane.memo:
            lane.memo[self].until = 0.0  # (a batch that goes some other way ends the regather)

    def ended(self, lane: LaneView, batch: BatchFacts, callers: int, now: float) -> bool:
        if not (self.regather and self.turns) or lane.count or callers < 2:
            return False
        ran, rate, during = rate_since_end(lane, batch, now)
        if during or rate * ran < 1:  # not a cohort: something arrived while it ran, or little was expected to
            return False
        self.memo(lane, _Regather).until = now + cycle(lane, batch, now)
        return True

    def arrival(self, lane: LaneView, now: float) -> int:
        record = self.memo(lane, _Regather)
        until, record.until = record.until, 0.0
        return self.turns if until > now and lane.count < self.largest() else 0


class Deadline(_Waiting):
    """A batch goes when it is full, or when its oldest item has waited ``max_queue_time`` since it arrived.

    ``max_queue_time=0`` sends what waits as soon as a slot is free (items that arrive in the same loop iteration, or
    during the ``turns`` after a batch's end, share it); more waits for fuller batches at the price of latency.
    """

    def __init__(self, max_queue_time: float = MAX_QUEUE_TIME, *, turns: int = TURNS, regather: bool = True) -> None:
        super().__init__(turns=turns, regather=regather)
        self.max_queue_time = max_queue_time

    @property
    def max_queue_time(self) -> float:
        """The most seconds the oldest waiting item waits for its batch to fill, once a slot is free."""
        return self._max_queue_time

    @max_queue_time.setter
    def max_queue_time(self, value: float) -> None:
        self._max_queue_time = _checks.seconds("max_queue_time", value)
        self.changed()

    def due(self, lane: LaneView, now: float) -> float:
        return lane.oldest() + self._max_queue_time

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(max_queue_time={self.max_queue_time!r}, turns={self.turns}, regather={self.regather})"


class LatencyBudget(_Waiting):
    """The adaptive wait: the batcher chooses how long a batch waits from what it measures, to keep each item's
    latency within ``max_latency`` (see :mod:`async_batcher.adaptive` for the rule).

    It learns the cost of a batch as a function of its size and the arrival rate; a batch goes at once when the
    size that keeps up with arrivals is waiting, else its oldest item waits at most the fixed cost of one batch, and
    never past the budget. What it learned survives restarts and live changes of the budget.
    """

    hard_deadline = True

    def __init__(self, max_latency: float, *, turns: int = TURNS, regather: bool = True) -> None:
        super().__init__(turns=turns, regather=regather)
        self.adaptive = AdaptiveWait(_checks.seconds("max_latency", max_latency, positive=True))
        self._trigger = 1

    @property
    def max_latency(self) -> float:
        return self.adaptive.max_latency

    @max_latency.setter
    def max_latency(self, value: float) -> None:
        self.adaptive.max_latency = _checks.seconds("max_latency", value, positive=True)
        self.changed()

    def pumping(self, now: float) -> None:
        signals = self.signals
        self.adaptive.note_arrivals(signals.arrivals, now)
        target = self.adaptive.target_size(signals.concurrency)
        limit = signals.batch_limit
        self._trigger = max(1, min(limit, math.ceil(target) if target < math.inf else UNLIMITED))

    def full_at(self, lane: LaneView, now: float) -> int:
        return self._trigger

    def due(self, lane: LaneView, now: float) -> float:
        oldest = lane.oldest()
        if oldest == math.inf:
            return math.inf
        return self.adaptive.send_by(oldest, max(lane.count, min(self._trigger, self.signals.batch_limit)))

    def ended(self, lane: LaneView, batch: BatchFacts, callers: int, now: float) -> bool:
        if batch.entered:
            self.adaptive.observe(batch.size, now - batch.started)
        return super().ended(lane, batch, callers, now)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_latency={self.max_latency!r}, turns={self.turns}, regather={self.regather})"
