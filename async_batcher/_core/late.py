"""Deadline-aware admission (``refuse_late=True``): the prediction of when an item would be answered, from the work
queued ahead of it and the cost of a batch as measured (private).

**The prediction.** With ``ahead`` items waiting, batches of at most ``N`` items (``max_batch_size``), ``c`` slots
(``concurrency``) and a batch of ``n`` items costing ``a·n + b`` seconds (the fit of
:class:`~async_batcher.adaptive.AdaptiveWait`, fed every batch that ends), an item that arrives now is answered
after

- the wait for a slot: none while one is free, else until the first batch in flight is predicted to end;
- the ``ahead // N`` full batches before its own, ``c`` at a time;
- its own batch: the ``ahead % N + 1`` items up to it, and those that arrive until it goes, up to ``N``: at the rate
  items are *offered* (refused ones included), not the rate admitted, which comes in bursts past saturation (all
  admitted until the queue is long enough, then all refused): the rate admitted over the last quarter second would
  say too few, and admit items whose batch fills behind them.

**The margin.** A batch's time strays from the fit (jitter, a busy loop), the more the longer it is; the
prediction is a sum of a few batch times, and its own batch's size depends on what arrives until it goes. The
margin is ``Z`` standard deviations of the prediction, those errors taken as independent: each batch time's, the
measured relative spread of the batches' times about the fit times that batch's time, and the arrivals' (Poisson: as
many items as the square root of those expected) times the cost of an item.

**Safeguards** (the pitfalls of BentoML's fitted dispatcher, which cancelled requests while doing no work): the fit
is never negative (:meth:`AdaptiveWait.model`) and is bounded by what was seen (a batch is never predicted to cost
more than the longest of the recent batches, nor an item more than the dearest per item), nothing is refused
before :data:`WARMUP` batches were measured, and an item that finds the batcher idle (nothing queued, nothing in
flight) is never refused: the head of the queue is always served, so batches keep going and keep the fit true even
if it went wild. (An item that finds the queue empty but a batch in flight is judged: it may have to wait for that
batch, and its own batch fills behind it.)
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from async_batcher._core.policy import UNLIMITED
from async_batcher.adaptive import AdaptiveWait

if TYPE_CHECKING:
    from async_batcher._core.engine import Engine

__all__: list[str] = []

#: Batches measured before anything is refused.
WARMUP = 8
#: The margin, in standard deviations of the prediction. Three: errors come in groups (a batch that runs long makes
#: every item admitted behind it late together), so that 2.33 (1 % of a normal error) let 1 % through on the
#: virtual-clock runs of a model with 20 % jitter past saturation; 3 let 0.3 % through, for 4 % less goodput.
Z = 3.0
#: The recent batches that bound the fit.
RECENT = 64
#: Weight of the newest batch in the relative spread (as in the fit: about the last 20 batches count).
_DECAY = 0.05


class Prediction:
    """An item's predicted wait for its answer, from now, and the margin of that prediction (seconds)."""

    __slots__ = ("margin", "seconds")

    def __init__(self, seconds: float, margin: float) -> None:
        self.seconds = seconds
        self.margin = margin

    def misses(self, budget: float) -> bool:
        """Whether an item with ``budget`` seconds left is predicted to be answered too late."""
        return self.seconds + self.margin > budget


class Lateness:
    """What one batcher measures of its batches to predict when an item would be answered (module docstring)."""

    __slots__ = ("fit", "recent", "spread2")

    def __init__(self) -> None:
        self.fit = AdaptiveWait(1.0)  # (its fit only: the budget is not used)
        self.recent: deque[tuple[int, float]] = deque(maxlen=RECENT)
        self.spread2 = 0.0  # the mean square of the batches' relative errors about the fit, as it stood before each

    def observe(self, size: int, waited: float, elapsed: float) -> None:
        """A batch of ``size`` items ended, ``elapsed`` seconds after it went (a batch observer of the recorder)."""
        if size <= 0 or not 0 <= elapsed < math.inf:
            return
        if self.fit.observations >= 2:
            a, b = self.model()
            predicted = b + a * size
            error = (elapsed - predicted) / predicted if predicted > 0 else 0.0
            self.spread2 += _DECAY * (min(error * error, 100.0) - self.spread2)  # (one stall counts, boundedly)
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

    def predict(self, engine: Engine, now: float, offered: int, behind: int = 0) -> Prediction | None:
        """When an item that arrives now would be answered (the last of a call's, ``behind`` the others);
        ``None``: admit it without asking (the warm-up, or an idle batcher: the head of the queue is always
        served). ``offered``: the items offered so far, refused ones included (the rate that fills its batch)."""
        fit = self.fit
        fit.note_arrivals(offered, now)
        if (not engine.queue.waiting and not engine.in_flight) or fit.observations < WARMUP:
            return None
        ahead = engine.queue.waiting + behind
        a, b = self.model()
        size = math.inf if engine.batch_limit == UNLIMITED else engine.batch_limit
        slots = math.inf if engine.slot_limit == UNLIMITED else engine.slot_limit
        wait = 0.0  # until its batch goes
        squares = 0.0  # the squares of the batch times it adds up (for the margin)
        if engine.in_flight >= slots and engine.batches:
            first = min(engine.batches, key=lambda batch: batch.started + b + a * batch.size)
            took = b + a * first.size
            wait = max(0.0, first.started + took - now)
            squares += took * took
        rest = ahead
        if size < math.inf:
            full, rest = divmod(ahead, int(size))
            if full:
                rounds = full / slots
                took = b + a * size
                wait += rounds * took
                squares += math.ceil(rounds) * took * took
        # Its batch: the items ahead of it that the full batches leave, itself, and those that arrive until it goes
        # (as many as the rate says on average, give or take the square root of that: Poisson's spread). While it
        # is not full, a wait longer than predicted makes it larger too: each second more brings rate·a seconds.
        rate = fit.rate
        arriving = rate * wait
        own = min(size, rest + 1 + arriving)
        took = b + a * own
        variance = self.spread2 * (took * took + squares)
        if own < size:
            grows = 1.0 + a * rate
            variance = self.spread2 * (took * took + grows * grows * squares) + a * a * arriving
        return Prediction(wait + took, Z * math.sqrt(variance))
