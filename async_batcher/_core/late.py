"""Deadline-aware admission (``refuse_late=True``): the prediction of when an item would be answered, from the work
queued ahead of it and the cost of a batch as measured (private).

**The prediction.** With ``ahead`` items waiting, batches of at most ``N`` items (``max_batch_size``), ``c`` slots
(``concurrency``) and a batch of ``n`` items costing ``a·n + b`` seconds (the fit of
:class:`~async_batcher.adaptive.AdaptiveWait`, fed every batch that ends), an item that arrives now is answered
after

- the wait for a slot: none while one is free, else until the first batch in flight is predicted to end;
- the ``ahead // N`` full batches before its own, ``c`` at a time;
- its own batch: the ``ahead % N`` items ahead of it that the full batches leave (the *tail* batch), and itself.

**The tail.** Items that arrive after it may join its batch until the batch goes, and make it longer: an item
admitted "just in time" would then be late. So an item is admitted only if *its batch* (the tail it joins) is still
predicted to end before the earliest deadline of the items already in it, not only before its own: the items behind
it are held to the deadlines of those ahead, and the prediction of its own batch needs no guess of the arrivals to
come. (Past saturation that is what limits a batch: it closes, in effect, when the next item would make its first
one late, and the items after that are refused until it goes.)

**The margin.** A batch's time strays from the fit (jitter, a busy loop), the more the longer it is; the prediction
is a sum of a few batch times. The margin is ``margin`` standard deviations of the prediction, the batches' errors taken
as independent, each the measured relative spread of the batches' times about the fit, times that batch's time.

**Safeguards** (the pitfalls of BentoML's fitted dispatcher, which cancelled requests while doing no work): the fit
is never negative (:meth:`AdaptiveWait.model`) and is bounded by what was seen (its cost per batch by the longest of
the recent batches, its cost per item by the dearest of them per item: one stall does not make every prediction
wild), nothing is refused before ``warmup`` batches were measured, and an item that finds the batcher idle
(nothing queued, nothing in flight) is never refused: the head of the queue is always served, so batches keep going
and keep the fit true even if it went wild. (An item that finds the queue empty but a batch in flight is judged: it
waits for that batch.)

The queue is seen as one first-come-first-served line: with several keys (``batch_key``) or priorities the
prediction counts every queued item as ahead (pessimistic), and the tail is the last batch of the whole queue.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from async_batcher._core.policy import UNLIMITED
from async_batcher.adaptive import AdaptiveWait

if TYPE_CHECKING:
    from async_batcher._core.dispatcher import Dispatcher
    from async_batcher._core.values import RefuseLate

__all__: list[str] = []


class Prediction:
    """An item's predicted wait for its answer, from now, the margin of that prediction (seconds), the earliest
    deadline (on the loop's clock) of the items already in the batch it joins (``inf``: none), and when the same
    call, made again later with nothing else arriving meanwhile, would be in time (``retry``: seconds from now
    until the work ahead of it has drained enough: its batch would then be its own)."""

    __slots__ = ("alone", "drained", "goes", "margin", "seconds", "tail")

    def __init__(
        self, seconds: float, margin: float, tail: float, drained: float, alone: float, goes: float = 0.0
    ) -> None:
        self.seconds = seconds
        self.margin = margin
        self.tail = tail
        self.drained = drained  # seconds until the work ahead of it is done (its tail batch's items included)
        self.alone = alone  # seconds its items would take in a batch of their own
        self.goes = goes  # seconds until the batch it would join goes (0: a slot is free, the policy decides)

    def retry(self, budget: float, *, held: bool = False) -> float:
        """Seconds until the same call, with ``budget`` seconds, would be in time, if nothing else arrives; never 0.

        ``held``: it is refused for the deadline of the items ahead of it in its batch, not its own: it can be
        admitted only once that batch has gone (its own deadline may be far). When that time is not known (a slot is
        free: the policy decides when the batch goes), the time of a batch of its own: an immediate retry, which a
        0 would invite, would find the same batch and be refused again."""
        own = self.drained + self.alone + self.margin - budget
        retry = max(own, self.goes if held else 0.0)
        return retry if retry > 0 else self.alone

    def late_by(self, now: float, deadline: float) -> float:
        """How much too late an item due by ``deadline`` (or the items ahead of it in its batch) would be answered,
        margin included: a refusal if positive."""
        return now + self.seconds + self.margin - min(deadline, self.tail)


class Lateness:
    """What one batcher measures of its batches to predict when an item would be answered (module docstring)."""

    __slots__ = ("fit", "recent", "rule", "seen", "spread2", "tail_deadline")

    def __init__(self, rule: RefuseLate) -> None:
        self.rule = rule  # the constants of the prediction (its warm-up, margin, recent batches, spread's decay)
        self.fit = AdaptiveWait(1.0)  # (its fit only: the budget is not used)
        self.recent: deque[tuple[int, float]] = deque(maxlen=rule.recent)
        self.spread2 = 0.0  # the mean square of the batches' relative errors about the fit, as it stood before each
        self.tail_deadline = math.inf  # the earliest deadline of the items of the queue's last batch
        # What tail_deadline was computed for: the queue (a run's), its changes, the batch size (which items make the
        # last batch) and the latency budget. Arrivals keep it up to date; when items leave (cancelled, timed out,
        # sent: their batch taken, or cut to a preferred size), come back, or their deadlines move, or
        # max_batch_size is set live, it is computed again from the items of the last batch (at most
        # max_batch_size of them). When the last batch is the whole queue, the queue keeps its earliest deadline.
        self.seen: tuple[object, int, int, float] | None = None

    def use(self, rule: RefuseLate) -> None:
        """The setting's constants as they are now (what was measured is kept)."""
        if rule is not self.rule:
            self.rule = rule
            if self.recent.maxlen != rule.recent:
                self.recent = deque(self.recent, maxlen=rule.recent)

    def observe(self, size: int, waited: float, elapsed: float) -> None:
        """A batch of ``size`` items ended, ``elapsed`` seconds after it went (a batch observer of the recorder)."""
        if size <= 0 or not 0 <= elapsed < math.inf:
            return
        if self.fit.observations >= 2:
            a, b = self.model()
            predicted = b + a * size
            error = (elapsed - predicted) / predicted if predicted > 0 else 0.0
            decay = self.rule.spread_decay
            self.spread2 += decay * (min(error * error, 100.0) - self.spread2)  # (one stall counts, boundedly)
        self.fit.observe(size, elapsed)
        self.recent.append((size, elapsed))

    def model(self) -> tuple[float, float]:
        """``(a, b)``, seconds per item and per batch: the fit, bounded by the recent batches."""
        a, b = self.fit.model()
        if not self.recent:
            return a, b
        longest = max(t for _, t in self.recent)
        dearest = max(t / n for n, t in self.recent)
        return min(a, dearest), min(b, longest)

    def tail(self, dispatcher: Dispatcher, latency: float) -> float:
        """The earliest deadline of the items of the queue's last batch (``latency``: the latency budget, ``inf``
        if none): the whole queue's, which the queue keeps as items come and go, when the last batch is all of it;
        else computed again from its items if the queue changed otherwise than by arrivals, or the batch size
        changed, since it was last."""
        queue = dispatcher.queue
        size = dispatcher.batch_limit
        rest = queue.waiting % size
        if rest == queue.waiting:
            return queue.earliest_due_of_all(latency) if rest else math.inf
        seen = (queue, queue.changes, size, latency)
        if self.seen != seen:
            self.tail_deadline = queue.earliest_due(rest, latency)
            self.seen = seen
        return self.tail_deadline

    def predict(
        self, dispatcher: Dispatcher, now: float, count: int = 1, latency: float = math.inf
    ) -> Prediction | None:
        """When the last of ``count`` items (a call's) that arrive now would be answered, and by when their batch
        must be, for the items already in it (``latency``: the latency budget, ``inf`` if none); ``None``: admit
        them without asking (the warm-up, or an idle batcher: the head of the queue is always served)."""
        waiting = dispatcher.queue.waiting
        if (not waiting and not dispatcher.in_flight) or self.fit.observations < self.rule.warmup:
            return None
        a, b = self.model()
        size = dispatcher.batch_limit  # (UNLIMITED: one batch takes them all)
        slots = dispatcher.slot_limit
        wait = 0.0  # until its batch goes
        squares = 0.0  # the squares of the batch times it adds up (for the margin)
        if dispatcher.in_flight >= slots and dispatcher.batches:
            first = min(dispatcher.batches, key=lambda batch: batch.started + b + a * batch.size)
            took = b + a * first.size
            wait = max(0.0, first.started + took - now)
            squares += took * took
        total = waiting + count  # the items up to its last, in order
        ahead = (total - 1) // size  # full batches before its last one's
        own = total - ahead * size
        if ahead:
            rounds = 0.0 if slots == UNLIMITED else ahead / slots  # (with no limit they run beside its own)
            took = b + a * size
            wait += rounds * took
            squares += math.ceil(rounds) * took * took
        took = b + a * own
        tail = self.tail(dispatcher, latency) if waiting % size else math.inf  # (a tail batch of items already queued)
        margin = self.rule.margin * math.sqrt(self.spread2 * (squares + took * took))
        others = own - min(own, count)  # the items of its batch ahead of its own
        drained = wait + (b + a * others if others else 0.0)
        return Prediction(wait + took, margin, tail, drained, b + a * min(own, count), wait)

    def admitted(self, dispatcher: Dispatcher, count: int, deadline: float) -> None:
        """``count`` items (a call's) are admitted, to be answered by ``deadline`` (``inf``: whenever): the earliest
        deadline of the tail batch, as it will be with them."""
        queue = dispatcher.queue
        if self.seen is None or self.seen[:3] != (queue, queue.changes, dispatcher.batch_limit):
            return  # (the queue or the batch size changed since the last prediction: the next computes it again)
        size = dispatcher.batch_limit
        rest = queue.waiting % size
        if not rest or rest + count > size:  # they start a tail batch of their own
            self.tail_deadline = deadline
        elif deadline < self.tail_deadline:
            self.tail_deadline = deadline
