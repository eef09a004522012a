"""When a lane's next batch goes: the one decision, ``(when, reason)``, and what it reads (private; the dispatch layer's
lowest part, below the :class:`~async_batcher._core.dispatcher.Dispatcher` that applies it, which is a
:class:`Decision`).

:meth:`Decision.decide` runs once per lane and pass: at once when the lane is full (``max_batch_size``,
``max_batch_weight``, or an out-of-memory split's ceiling: :meth:`Decision.capacity`), drains, is flushed, or
reaches the policy's size; else when the policy says. It leaves on the lane what an arrival compares with
(``Lane.trigger``, ``Lane.trigger_weight``), so that the dispatcher is woken by an arrival only when a batch may be
due. :meth:`Decision.due_lanes` makes it for every lane of a pass and orders the due ones, the one served longest ago
first. Nothing here sends, schedules or waits: that is the dispatcher's.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import TYPE_CHECKING

from async_batcher._core import answers
from async_batcher._core.policy import Reason
from async_batcher._core.state import UNLIMITED, State

if TYPE_CHECKING:
    from async_batcher._core.lane import Lane
    from async_batcher._core.policy import DispatchPolicy
    from async_batcher._core.queue import Queue

__all__: list[str] = []

_served = itemgetter(0)
# Not due until something changes (an arrival, a batch's end, a setting).
_NEVER: tuple[float, Reason | None] = (math.inf, None)
# The enum members the decision compares with, read once (an enum class's attribute is a Python-level lookup).
_STOPPING = State.STOPPING
_FULL, _STOP, _FLUSH, _SIZE = Reason.FULL, Reason.STOP, Reason.FLUSH, Reason.SIZE


class Decision:
    """The decision of a run's dispatcher (see the module's docstring), and what it reads: the run's batch limits
    (``batch_limit``, ``weight_limit``: set by the engine), its state (stopping: everything goes), its flush
    (``flushing``: so many items of these lanes go whatever the policy says), its queue and its policy."""

    __slots__ = ("batch_limit", "flushing", "policy", "queue", "state", "weight_limit")

    def __init__(self, queue: Queue, policy: DispatchPolicy) -> None:
        self.queue = queue
        self.policy = policy
        self.state = State.RUNNING
        self.batch_limit = UNLIMITED
        self.weight_limit = math.inf
        self.flushing: dict[Lane, int] = {}

    def capacity(self, lane: Lane) -> tuple[int, float]:
        """What a full batch of ``lane`` holds: items and weight (``max_batch_size``, ``max_batch_weight``, or lower:
        the ceiling an out-of-memory split set)."""
        # (min() written out: a builtin's call costs more than the test on the hot path)
        items, ceiling = self.batch_limit, lane.ceiling
        weight, weight_ceiling = self.weight_limit, lane.weight_ceiling
        return ceiling if ceiling < items else items, weight_ceiling if weight_ceiling < weight else weight

    def decide(self, lane: Lane, now: float) -> tuple[float, Reason | None]:
        """The one decision: when the lane's next batch goes (``now`` or earlier: at once; ``inf``: not until
        something changes) and, if it is due, why. It leaves on the lane what makes an arrival look again
        (:meth:`~async_batcher._core.dispatcher.Dispatcher.arrived`)."""
        if not lane.count:
            lane.trigger = 1  # an arrival into an empty lane is looked at
            return _NEVER
        items, weight = self.capacity(lane)
        lane.trigger_weight = weight
        if lane.count >= items or lane.weight >= weight:
            return now, _FULL
        if self.state is _STOPPING:
            return now, _STOP
        if self.flushing and lane in self.flushing:
            return now, _FLUSH
        policy = self.policy
        full = policy.full_at(lane, now)
        try:
            trigger = lane.trigger = items if items < full else full  # (min(full, items), NaN and all)
        except TypeError:  # (None, a string: compared with a count, or left to fail further on)
            raise answers.wrong(policy, "full_at", full, "a number of items") from None
        if lane.count >= trigger:
            return now, _SIZE
        at = policy.due(lane, now)
        if at.__class__ is not float or at != at:  # (the policy's answers are checked off the common case's way)
            at = answers.due(policy, at)
        if at > now:
            return at, None
        reason = policy.reason(lane, now)
        return at, reason if reason.__class__ is Reason else answers.reason(policy, reason)

    def due_lanes(self, now: float) -> tuple[list[tuple[float, Lane, Reason]], float]:
        """The lanes due now with why, the one served longest ago first (a lane never served, or back after an idle
        spell, counts from when it came), so that keys take turns when slots are scarce; and, of the others, the
        earliest time one will be. One decision per lane, however many are due."""
        due: list[tuple[float, Lane, Reason]] = []
        next_at = math.inf
        for lane in self.queue.lanes.values():
            at, reason = self.decide(lane, now)
            if reason is not None:
                due.append((lane.served, lane, reason))
            elif at < next_at:
                next_at = at
        if len(due) > 1:
            due.sort(key=_served)
        return due, next_at
