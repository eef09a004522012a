"""Statistics of a batcher: a frozen snapshot, and the cheap recorder behind it.

Recording happens once per *batch* (a tuple appended to a bounded deque), never per item, so keeping statistics
costs next to nothing on the hot path; percentiles are computed only when someone reads ``batcher.stats``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

__all__ = ["BatchObserver", "BatcherStats", "LatencySummary"]

logger = logging.getLogger("async_batcher.stats")

#: Called once per batch that went through ``process_batch``, with ``(size, waited, elapsed)``: its items, how
#: long its oldest item waited (seconds) and how long ``process_batch`` took (seconds). Runs on the batcher's
#: event loop, inside its bookkeeping: it must be quick and must not block.
BatchObserver: TypeAlias = Callable[[int, float, float], None]

#: How many recent batches the percentiles are computed over.
WINDOW = 1024


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles, in seconds, over the batches of the recent window (``count`` of them); ``nan`` when empty."""

    p50: float
    p95: float
    p99: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> LatencySummary:
        if not values:
            return cls(math.nan, math.nan, math.nan, 0)
        ordered = sorted(values)
        return cls(_rank(ordered, 0.50), _rank(ordered, 0.95), _rank(ordered, 0.99), len(ordered))


def _rank(ordered: list[float], q: float) -> float:
    # Nearest-rank percentile: always a value that was observed.
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class BatcherStats:
    """A snapshot of a batcher's counters; it does not change after it is taken.

    Item counts are cumulative over the batcher's life (across restarts); ``queued`` and ``in_flight`` are the
    state at the moment of the snapshot. Every submitted item ends exactly once, counted in one of ``succeeded``,
    ``failed``, ``cancelled`` and ``timed_out`` when its caller's call resolves (a ``process_many`` call's items
    when the call resolves), so that::

        submitted == succeeded + failed + cancelled + timed_out + (items whose callers still wait)

    and once the batcher is stopped, with no caller left waiting, ``submitted == succeeded + failed + cancelled +
    timed_out``. ``rejected`` items were never submitted. ``queue_wait`` is, per batch, how long its *oldest* item
    waited between arrival and dispatch (the batch's worst case); ``process_time`` is how long ``process_batch``
    took.
    """

    name: str
    #: Calls of ``process_batch`` that have ended (returned, raised, or were cancelled by a forced stop).
    batches: int
    #: Items accepted: into the queue, or into the line for room in a full queue (``wait_when_full``).
    submitted: int
    #: Items that went through ``process_batch`` and whose callers got its outcome (not a stop's); a streaming
    #: batch's items all count, those that joined it as it ran included.
    processed: int
    #: Items whose caller got its result.
    succeeded: int
    #: Items whose caller got an exception: from ``process_batch`` (raised, or returned for that item), the
    #: failure of another item of the same ``process_many`` call, or a stop that abandoned the item.
    failed: int
    #: Items whose caller was cancelled before it had an outcome.
    cancelled: int
    #: Items whose ``timeout=`` expired before they had an outcome.
    timed_out: int
    #: Items refused at once, never submitted: queue full, the batcher stopping or stopped, or too heavy.
    rejected: int
    #: Items waiting in the queue now.
    queued: int
    #: Batches being processed now.
    in_flight: int
    #: The mean size of the batches counted in ``batches``, 0.0 before the first one. A streaming batch's size is
    #: the most items it held at once (at most ``max_batch_size``): with continuous batching, items join and leave
    #: it as it runs, and ``processed`` counts every one of them.
    mean_batch_size: float
    queue_wait: LatencySummary
    process_time: LatencySummary
    #: Batches that a hold (``max_hold_time``) kept back for the callers their lane's last batch answered: how
    #: often the hold delayed a batch. A cohort that comes back at once is not kept back; the hold acts when some
    #: of its callers are late, or gathers a closed loop that split. Under independent arrivals next to none: the
    #: hold stays off there, but for its probes.
    held: int = 0
    #: Of ``held``, the probes: holds tried while the hold is off (at most once a second, and half as often after
    #: each that did not gather its callers, down to once a minute).
    probes: int = 0
    #: Why the batches counted in ``batches`` went, a count per reason (:class:`~async_batcher.policies.Reason`:
    #: ``"full"``, ``"size"``, ``"deadline"``, ``"hold"``, ``"stop"``, ``"flush"``; ``"split"``: the calls of the parts
    #: of a failed batch): why batches are small, answered.
    reasons: Mapping[str, int] = field(default_factory=dict)
    #: Items of the callers waiting in line for room in a full queue now (``wait_when_full``).
    awaiting_room: int = 0
    #: What the dispatch policy counted (``Signals.count``): the hold's ``"held"`` and ``"probes"``, a policy's own.
    counts: Mapping[str, int] = field(default_factory=dict)
    #: Items handed back for another try after a transient failure (``retry=``), each time.
    retried: int = 0
    #: Items that failed transiently and were not tried again because the retry budget was spent.
    retries_refused: int = 0
    #: Items that failed alone, found at fault (``on_batch_error=Isolate(...)``).
    isolated: int = 0
    #: Calls of ``process_batch`` split because they ran out of memory (``split_on=``).
    splits: int = 0
    #: Calls of ``process_batch`` on parts of a batch whose call failed (a bisection, a split): the cost of the
    #: failure handling, beyond each batch's first call.
    extra_calls: int = 0
    #: The ceiling out-of-memory splits set now, per batch key (``None``: the key of a batcher without keys): the
    #: most items (weight, with ``item_weight``) its batches take. Keys without a ceiling are absent.
    ceilings: Mapping[Hashable, float] = field(default_factory=dict)
    #: Why the items counted in ``rejected`` were refused, a count per reason: ``"queue_full"`` (``max_queue_size``),
    #: ``"queue_weight"`` (``max_queue_weight``), ``"oversized"`` (heavier than a weight limit alone), ``"late"``
    #: (``refuse_late``: predicted past its deadline), ``"stopped"`` (the batcher stopping or stopped),
    #: ``"reentrant"`` (a call that would wait for itself).
    rejected_reasons: Mapping[str, int] = field(default_factory=dict)
    #: Weight admitted and not yet resolved now (kept while ``max_queue_weight`` is set; 0.0 otherwise).
    queue_weight: float = 0.0
    #: Calls that shared the row of an identical item waiting or in flight (``dedup_key``) instead of taking one.
    deduplicated: int = 0
    #: Calls answered from the result cache (``result_cache``), without a row.
    cache_hits: int = 0


#: The outcomes a call resolves with (:meth:`_Recorder.resolved`): their places in ``_Recorder.outcomes``.
SUCCEEDED, FAILED, CANCELLED, TIMED_OUT = range(4)


class _Recorder:
    """Mutable counters owned by one batcher; ``snapshot`` turns them into a :class:`BatcherStats`.

    Written through its methods only, each named for what happened: items :meth:`admitted` without waiting, items
    that :meth:`left` the queue (or the line for room) and those :meth:`returned` to it, calls :meth:`resolved` with an
    outcome, items :meth:`rejected` at once, items :meth:`processed` by ``process_batch``, a call of it that
    :meth:`batch_ended`, and what a dispatch policy counts (:meth:`count`).
    """

    __slots__ = (
        "batches",
        "counts",
        "exited",
        "observers",
        "outcomes",
        "processed_items",
        "reasons",
        "refusals",
        "sized",
        "window",
    )

    def __init__(self) -> None:
        self.batches = 0
        self.sized = 0  # the sizes of those batches, summed
        # Submitted items that are no longer waiting in the queue nor in the line for room (sent, withdrawn, or
        # given up); with those still waiting, every item submitted. Counted per batch, not per item, to keep the
        # hot path short.
        self.exited = 0
        self.processed_items = 0
        self.outcomes = [0, 0, 0, 0]  # calls' items by outcome: SUCCEEDED, FAILED, CANCELLED, TIMED_OUT
        # Counts a dispatch policy keeps (its Signals.count): "held", "probes" (BatcherStats.held, .probes).
        self.counts: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()  # why the batches went (BatcherStats.reasons)
        self.refusals: Counter[str] = Counter()  # why items were rejected (BatcherStats.rejected_reasons)
        # (queue wait of the oldest item, process_batch duration) per recent batch.
        self.window: deque[tuple[float, float]] = deque(maxlen=WINDOW)
        # Callables fed every batch (histograms, say); an empty tuple costs one test per batch. A tuple, replaced
        # whole on change, so that adding or removing one while the loop calls them is safe from any thread.
        self.observers: tuple[BatchObserver, ...] = ()

    def admitted(self, n: int) -> None:
        """``n`` items submitted that never wait in the queue (a caller that joins a shared row, a hit of the result
        cache): submitted, and already out of it."""
        self.exited += n

    def left(self, n: int) -> None:
        """``n`` submitted items left the queue (sent in a batch, or withdrawn) or the line for room (given up)."""
        self.exited += n

    def returned(self, n: int) -> None:
        """``n`` items that had left the queue are back in it (tried again), or were taken back as never submitted."""
        self.exited -= n

    def resolved(self, n: int, outcome: int) -> None:
        """``n`` items' calls resolved with ``outcome`` (:data:`SUCCEEDED`, :data:`FAILED`, :data:`CANCELLED` or
        :data:`TIMED_OUT`); a ``process_many`` call counts its items."""
        self.outcomes[outcome] += n

    def rejected(self, n: int, reason: str) -> None:
        """``n`` items refused at once, never submitted, for ``reason`` (``BatcherStats.rejected_reasons``)."""
        self.refusals[reason] += n

    def processed(self, n: int) -> None:
        """``n`` items went through ``process_batch`` and their callers got its outcome (``BatcherStats.processed``)."""
        self.processed_items += n

    def count(self, name: str, n: int = 1) -> None:
        """What a dispatch policy (or the failure handling) counts: ``stats.counts[name]``."""
        self.counts[name] += n

    def batch_ended(self, size: int, waited: float, elapsed: float, reason: str | None = None) -> None:
        """One call of ``process_batch`` ended: ``size`` items, its oldest item ``waited`` seconds for it, it took
        ``elapsed`` seconds, and it went for ``reason``. Feeds the observers; one that raises is logged, never
        propagated."""
        self.batches += 1
        if reason is not None:
            self.reasons[reason] += 1
        self.sized += size
        self.window.append((waited, elapsed))
        if self.observers:
            for observer in self.observers:
                try:
                    observer(size, waited, elapsed)
                except Exception:
                    logger.exception("a batch observer raised; the batcher goes on")

    def add_observer(self, observer: BatchObserver) -> None:
        """Feed ``observer`` every batch from now on; idempotent."""
        if not callable(observer):
            raise TypeError(f"a batch observer must be callable, got {observer!r}")
        if observer not in self.observers:
            self.observers = (*self.observers, observer)

    def remove_observer(self, observer: BatchObserver) -> None:
        """Stop feeding ``observer``; a no-op if it is not there."""
        self.observers = tuple(o for o in self.observers if o != observer)

    def snapshot(
        self,
        name: str,
        *,
        queued: int,
        awaiting_room: int,
        in_flight: int,
        ceilings: Mapping[Hashable, float] | None = None,
        queue_weight: float = 0.0,
    ) -> BatcherStats:
        window = list(self.window)
        return BatcherStats(
            name=name,
            batches=self.batches,
            submitted=self.exited + queued + awaiting_room,
            processed=self.processed_items,
            succeeded=self.outcomes[SUCCEEDED],
            failed=self.outcomes[FAILED],
            cancelled=self.outcomes[CANCELLED],
            timed_out=self.outcomes[TIMED_OUT],
            rejected=sum(self.refusals.values()),
            queued=queued,
            in_flight=in_flight,
            mean_batch_size=self.sized / self.batches if self.batches else 0.0,
            queue_wait=LatencySummary.of([w for w, _ in window]),
            process_time=LatencySummary.of([p for _, p in window]),
            held=self.counts["held"],
            probes=self.counts["probes"],
            reasons={str(reason): n for reason, n in self.reasons.items()},
            awaiting_room=awaiting_room,
            counts=dict(self.counts),
            retried=self.counts["retried"],
            retries_refused=self.counts["retries_refused"],
            isolated=self.counts["isolated"],
            splits=self.counts["splits"],
            extra_calls=self.counts["extra_calls"],
            ceilings=dict(ceilings or {}),
            rejected_reasons=dict(self.refusals),
            queue_weight=queue_weight,
            deduplicated=self.counts["deduplicated"],
            cache_hits=self.counts["cache_hits"],
        )
