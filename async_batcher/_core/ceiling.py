"""The batch size that fits, per batch key, as out-of-memory splits teach it (private; state: the engine owns the
lanes, and changes a lane's ceiling only as the runner reports a call's end through the engine's methods).

A call of ``n`` items that runs out of memory lowers its lane's ceiling to ``n // 2`` (multiplicative decrease);
``grow_after`` calls in a row that succeed at the ceiling raise it by a step (additive increase), and once it
reaches the size that failed it is lifted. With ``item_weight``, the same in weight units. What the ceiling is
compared with, as a batch forms: :meth:`~async_batcher._core.decision.Decision.capacity`. A lane let go while idle
leaves its ceiling in the queue's :class:`Kept`, where its key finds it again.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING

from async_batcher._core.state import UNLIMITED

if TYPE_CHECKING:
    from async_batcher._core.lane import Lane

__all__: list[str] = []


class Capacity:
    """What a lane's out-of-memory splits taught: the largest size (or weight) that failed, the step of the ceiling's
    increase, and the successes in a row at the ceiling."""

    __slots__ = ("peak", "step", "successes")

    def __init__(self) -> None:
        self.peak = 0.0
        self.step = 1.0
        self.successes = 0


def lower(lane: Lane, size: int, weight: float, *, weighted: bool, grow_by: float | None) -> float:
    """A call of ``size`` items (``weight``) ran out of memory: its lane's ceiling is half that, if lower. Returns
    the ceiling (in weight units when ``weighted``)."""
    capacity = lane.capacity
    if capacity is None:
        capacity = lane.capacity = Capacity()
    measure = weight if weighted else float(size)
    capacity.peak = max(capacity.peak, measure)
    capacity.step = grow_by if grow_by is not None else max(1.0, capacity.peak / 16)
    capacity.successes = 0
    if weighted:
        lane.weight_ceiling = min(lane.weight_ceiling, weight / 2)
        return lane.weight_ceiling
    lane.ceiling = min(lane.ceiling, max(1, size // 2))
    return float(lane.ceiling)


def held(lane: Lane, size: int, weight: float, *, weighted: bool, grow_after: int, full_share: float) -> None:
    """A call of ``size`` items (``weight``) succeeded: after ``grow_after`` in a row at the ceiling (or, weighted,
    at ``full_share`` of it), raise it a step; lift it at the size that failed."""
    capacity = lane.capacity
    if capacity is None:
        return
    ceiling = lane.weight_ceiling if weighted else float(lane.ceiling)
    if ceiling == math.inf or ceiling >= UNLIMITED:
        return
    if (weight if weighted else size) < (ceiling * full_share if weighted else ceiling):
        return  # a smaller batch says nothing of the ceiling
    capacity.successes += 1
    if capacity.successes < grow_after:
        return
    capacity.successes = 0
    raised = ceiling + capacity.step
    if weighted:
        lane.weight_ceiling = math.inf if raised >= capacity.peak else raised
    else:
        lane.ceiling = UNLIMITED if raised >= capacity.peak else max(lane.ceiling + 1, int(raised))


def settle(lane: Lane, size: int, weight: float, *, weighted: bool) -> None:
    """A batch's splits are over, the largest of its parts that succeeded being ``size`` items (``weight``): the
    ceiling is at least that (a part that failed alone, too big on its own, must not keep it lower)."""
    if weighted:
        if weight > 0 and lane.weight_ceiling < weight:
            lane.weight_ceiling = weight
    elif size > 0 and lane.ceiling < size:
        lane.ceiling = size


def ceiling_of(lane: Lane, *, weighted: bool) -> float | None:
    """The lane's ceiling now (weight units when ``weighted``), or ``None`` if it has none."""
    if weighted:
        return None if lane.weight_ceiling == math.inf else lane.weight_ceiling
    return None if lane.ceiling >= UNLIMITED else float(lane.ceiling)


class Kept:
    """The ceilings of keys whose lanes were let go while idle, by key (at most ``limit``, ``SplitOn.keys_kept``, the
    key idle longest forgotten first): a key that comes back finds its ceiling, and what taught it, in its new
    lane."""

    __slots__ = ("by_key", "limit")

    def __init__(self) -> None:
        self.by_key: OrderedDict[Hashable, tuple[int, float, Capacity]] = OrderedDict()
        self.limit = 0  # (set with split_on: SplitOn.keys_kept)

    def park(self, lane: Lane) -> None:
        """``lane`` is let go: keep its ceiling, if it has one."""
        if lane.capacity is None or (lane.ceiling >= UNLIMITED and lane.weight_ceiling == math.inf):
            return
        self.by_key[lane.key] = (lane.ceiling, lane.weight_ceiling, lane.capacity)
        if len(self.by_key) > self.limit:
            self.by_key.popitem(last=False)

    def restore(self, lane: Lane) -> None:
        """A new lane for a key: the ceiling kept for it, if any, is its."""
        found = self.by_key.pop(lane.key, None)
        if found is not None:
            lane.ceiling, lane.weight_ceiling, lane.capacity = found

    def clear(self) -> None:
        self.by_key.clear()

    def ceilings(self, *, weighted: bool) -> Iterator[tuple[Hashable, float]]:
        """The ceilings kept, by key (weight units when ``weighted``)."""
        for key, (size, weight, _) in self.by_key.items():
            at = weight if weighted else size
            if at < UNLIMITED and at != math.inf:
                yield key, float(at)
