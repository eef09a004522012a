"""The dispatch policy's interface: when a lane's next batch goes, how many items it takes, and what the policy
remembers as batches go and end (public through :mod:`async_batcher.policies`).

The dispatcher (:mod:`~async_batcher._core.dispatcher`) owns the slots and the timer; it asks its policy, while a
slot is free and items of a lane wait, when that lane's batch is due. Two things never ask: a full batch
(``max_batch_size`` items or ``max_batch_weight``) and a stop (the drain) go at once. The words of the rule are in
the glossary of the documentation (docs/glossary.md).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Any, Protocol

from async_batcher._core.state import UNLIMITED

__all__ = ["UNLIMITED", "BatchFacts", "DispatchPolicy", "LaneView", "Reason", "Signals"]


class Reason(enum.StrEnum):
    """Why a batch went: on :func:`~async_batcher.current_batch`, counted in ``stats.reasons`` and in the metrics
    (``async_batcher_batches_total{reason}``), and on each record of :func:`async_batcher.testing.record_batches`."""

    #: ``max_batch_size`` items, or ``max_batch_weight``, were waiting.
    FULL = "full"
    #: The policy's size was reached before its deadline: a preferred size, the latency budget's target size, or all
    #: the callers a hold waited for were back.
    SIZE = "size"
    #: The oldest item had waited as long as the policy lets it (``max_queue_time``, the latency budget).
    DEADLINE = "deadline"
    #: A hold ended (its time, or no arrival for a while) before all the callers it waited for were back.
    HOLD = "hold"
    #: The batcher was stopping: what waits goes without waiting for a deadline.
    STOP = "stop"
    #: :func:`async_batcher.testing.flush` sent it.
    FLUSH = "flush"
    #: A part of a batch whose call failed, called on its own: isolating a bad item (``on_batch_error``), or a
    #: batch split on out-of-memory (``split_on``).
    SPLIT = "split"


class Signals(Protocol):
    """What a policy may read of the dispatcher that asks it (a run's): its limits as they are now, and its pressure."""

    @property
    def batch_limit(self) -> int:
        """``max_batch_size``, or :data:`UNLIMITED`."""

    @property
    def concurrency(self) -> int:
        """The most batches in flight, or :data:`UNLIMITED`."""

    @property
    def room_wanted(self) -> bool:
        """Callers wait for room in a full queue: a batch kept back would keep them waiting."""

    @property
    def arrivals(self) -> int:
        """Items submitted to this run so far (of every lane)."""

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to a counter of the batcher's statistics (``stats.counts[name]``; ``stats.held`` and
        ``stats.probes`` are two of them)."""

    def repump(self) -> None:
        """Look at the lanes again now (a parameter of the policy changed)."""


class LaneView(Protocol):
    """A lane (the items of one batch key waiting for a batch) as a policy sees it."""

    @property
    def key(self) -> Any:
        """The lane's batch key."""

    @property
    def count(self) -> int:
        """Items waiting in it."""

    @property
    def weight(self) -> float:
        """Their total weight (while weights are kept: ``item_weight`` or ``max_batch_weight``)."""

    @property
    def arrived(self) -> int:
        """Items that ever arrived in it."""

    @property
    def left(self) -> int:
        """Items that have left it (sent or withdrawn): ``arrived - left`` is ``count``."""

    @property
    def in_flight(self) -> int:
        """Its batches in flight."""

    @property
    def ended(self) -> float:
        """When its last batch ended (``-inf``: none has)."""

    @property
    def arrived_at_end(self) -> int:
        """``arrived`` when its last batch ended."""

    #: The policy's own records of this lane, a dict keyed by policy (:meth:`DispatchPolicy.memo`); ``None`` at first.
    memo: Any

    def oldest(self) -> float:
        """The arrival of its oldest waiting item (``inf`` if its callers all left), on the loop's clock."""

    def newest(self) -> float:
        """The arrival of its newest waiting item (``-inf`` if none)."""


class BatchFacts(Protocol):
    """What a policy is told of a batch as it goes and as it ends."""

    @property
    def started(self) -> float:
        """When it was formed, on the loop's clock."""

    @property
    def oldest(self) -> float:
        """The arrival of its oldest item."""

    @property
    def arrived_before(self) -> int:
        """Its lane's arrivals before it went: those after are what arrived while it ran."""

    @property
    def size(self) -> int:
        """Its items (a stream's: the most it held at once)."""

    @property
    def entered(self) -> bool:
        """It reached ``process_batch`` (a batch whose callers had all left, or that ``on_start()`` failed, did not)."""

    #: Free for the policy: set as the batch goes (:meth:`DispatchPolicy.dispatched`), read as it ends.
    tag: Any


class DispatchPolicy:
    """When a lane's next batch goes, and how many items it takes.

    Subclass it and implement :meth:`due`; the other methods have defaults. One object serves one batcher: it may
    learn (the latency budget does), and it keeps what it remembers of each lane in that lane's ``memo``, a dict of
    its own keyed by the policy. A lane, as a policy sees it: ``key``, ``count`` (items waiting), ``weight``,
    ``arrived`` (items so far), ``left``, ``in_flight`` (its batches in flight), ``ended`` (when its last batch ended),
    ``arrived_at_end`` (its arrivals then), ``oldest()`` and ``newest()`` (arrival times of its waiting items).
    """

    #: The loop's turns a batch's end lets pass before the next batch forms, while fewer items than the largest
    #: batch wait: the requests the loop has read but whose handlers have not run yet join it. 0: at once.
    turns: int = 0
    #: A deadline of this policy bounds a hold too (a latency budget does; ``max_queue_time`` does not).
    hard_deadline: bool = False
    #: The idle lanes (batch keys with nothing queued and no batch in flight) kept for their history, those whose
    #: last batch ended last: when their last batch ended, their arrivals then, this policy's memo of them. A key
    #: used again finds its lane's history; a stream of new keys (one a user) keeps no more than this many.
    keep_idle: int = 16

    signals: Signals

    def bind(self, signals: Signals) -> None:
        """A run begins (the batcher starts): the dispatcher that will ask this policy."""
        self.signals = signals

    def changed(self) -> None:
        """A parameter of this policy changed: the batcher looks again now (the setters of the built-in policies
        call it; call it from yours)."""
        signals: Signals | None = getattr(self, "signals", None)
        if signals is not None:
            signals.repump()

    def due(self, lane: LaneView, now: float) -> float:
        """When the lane's next batch goes: ``now`` or earlier for at once, ``inf`` for not until something changes.

        Asked while a slot is free and the lane holds fewer items than :meth:`full_at` (and than a full batch)."""
        raise NotImplementedError

    def full_at(self, lane: LaneView, now: float) -> int:
        """How many items make the lane's batch go at once, before :meth:`due` (the dispatcher also wakes for the
        arrival that reaches it); :data:`UNLIMITED`: only a full batch."""
        return UNLIMITED

    def size(self, lane: LaneView) -> int:
        """How many items a batch due now takes at most (never more than ``max_batch_size``)."""
        return self.signals.batch_limit

    def largest(self) -> int:
        """The largest batch it sends: after a batch's end, the turns pass only while fewer items wait."""
        return self.signals.batch_limit

    def reason(self, lane: LaneView, now: float) -> Reason:
        """Why a batch that :meth:`due` made due goes."""
        return Reason.DEADLINE

    def pumping(self, now: float) -> None:
        """The dispatcher is about to look at the lanes (once per pass, however many lanes)."""

    def dispatched(self, lane: LaneView, batch: BatchFacts, now: float) -> None:
        """A batch of ``lane`` goes."""

    def ended(self, lane: LaneView, batch: BatchFacts, callers: int, now: float) -> bool:
        """A batch of ``lane`` ended, having answered ``callers`` (0 for a stream). True: show me the lane's next
        arrival (:meth:`arrival`), if it comes before another batch of the lane goes."""
        return False

    def arrival(self, lane: LaneView, now: float) -> int:
        """The arrival :meth:`ended` asked to see, into a free slot: the loop's turns to let pass before its batch
        forms (0: at once)."""
        return 0

    def replaced(self, by: DispatchPolicy, lanes: Iterable[LaneView], now: float) -> None:
        """The batcher took ``by`` in this policy's place (``batcher.policy = ...``, or a dispatch keyword that
        removed a layer); ``lanes``: its lanes as they are now. This policy is asked nothing more: what it kept back
        goes as ``by`` says, and what it would have counted must be counted now (the hold counts the batch it kept
        an item back for). A :class:`~async_batcher.policies.Layer` tells the policy it wraps, unless ``by`` keeps
        it."""

    def memo(self, lane: LaneView, factory: Any) -> Any:
        """This policy's record of ``lane``, made by ``factory()`` the first time."""
        memos: dict[Any, Any] | None = lane.memo
        if memos is None:
            memos = lane.memo = {}
        record = memos.get(self)
        if record is None:
            record = memos[self] = factory()
        return record


def rate_since_end(lane: LaneView, batch: BatchFacts, now: float) -> tuple[float, float, int]:
    """How a lane's items arrived around a batch that just ended: its time (``ran``), the lane's arrival rate since
    its previous batch ended (over the batch's own time at least: with several slots, another batch may have ended
    just before), and how many arrived while it ran."""
    ran = now - batch.started
    since = max(now - lane.ended, ran)
    rate = (lane.arrived - lane.arrived_at_end) / since if since > 0 else 0.0
    return ran, rate, lane.arrived - batch.arrived_before


def cycle(lane: LaneView, batch: BatchFacts, now: float) -> float:
    """The time since the lane's previous batch ended (or since this one went, if it is the first)."""
    return now - (lane.ended if lane.ended != -math.inf else batch.started)
