"""Deadline-aware admission (``refuse_late=True``): the prediction of when an item would be answered, from the work
queued ahead of it and the cost of a batch as measured (private).

**The prediction.** With ``ahead`` items waiting, batches of at most ``N`` items (``max_batch_size``), ``c`` slots
(``concurrency``) and a batch of ``n`` items costing ``a·n + b`` seconds (the fit of
:class:`~async_batcher.adaptive.AdaptiveWait`, fed every batch that ends), an item that arrives now is answered
after

- the wait for a slot: none while one is free, else until the first batch in flight is predicted to end;
- the ``ahead // N`` full batches before its own, ``c`` at a time;
- its own batch: the ``ahead % N + 1`` items up to it.

**The margin.** A batch's time strays from the fit (jitter, a busy loop); the prediction is a sum of a few of
them. The margin is ``Z`` times the batches' measured spread about the fit, times the square root of the number of
batch times the prediction adds up (as independent errors add): about a 1 % chance that an item admitted as "just
in time" is late because of the spread alone.

**Safeguards** (the pitfalls of BentoML's fitted dispatcher, which cancelled requests while doing no work): the fit
is never negative (:meth:`AdaptiveWait.model`) and is bounded by what was seen (a batch is never predicted to cost
more than the longest of the recent batches, nor an item more than the dearest per item), nothing is refused
before :data:`WARMUP` batches were measured, and an item that finds the queue empty is never refused: the head of
the queue is always served, so batches keep going and keep the fit true even if it went wild.
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
#: The margin, in standard deviations of the batches' spread about the fit (one-sided: about 1 % late).
Z = 2.33
#: The recent batches that bound the fit.
RECENT = 64


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

    __slots__ = ("fit", "recent")

    def __init__(self) -> None:
        self.fit = AdaptiveWait(1.0)  # (its fit only: the budget is not used)
        self.recent: deque[tuple[int, float]] = deque(maxlen=RECENT)

    def observe(self, size: int, waited: float, elapsed: float) -> None:
        """A batch of ``size`` items ended, ``elapsed`` seconds after it went (a batch observer of the recorder)."""
        if size > 0 and elapsed >= 0 and math.isfinite(elapsed):
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

    def predict(self, engine: Engine, now: float, behind: int = 0) -> Prediction | None:
        """When an item that arrives now would be answered (the last of a call's, ``behind`` the others);
        ``None``: admit it without asking (the warm-up, or an empty queue: the head of the queue is always
        served)."""
        if not engine.queue.waiting or self.fit.observations < WARMUP:
            return None
        ahead = engine.queue.waiting + behind
        a, b = self.model()
        size = math.inf if engine.batch_limit == UNLIMITED else engine.batch_limit
        slots = math.inf if engine.slot_limit == UNLIMITED else engine.slot_limit
        seconds = 0.0
        terms = 1  # the batch times added up (for the margin): its own batch's
        if engine.in_flight >= slots and engine.batches:
            first_end = min(batch.started + b + a * batch.size for batch in engine.batches)
            seconds = max(0.0, first_end - now)
            terms += 1
        if size == math.inf:
            own = ahead + 1
        else:
            full, rest = divmod(ahead, int(size))
            own = rest + 1
            if full:
                rounds = full / slots
                seconds += rounds * (b + a * size)
                terms += math.ceil(rounds)
        seconds += b + a * own
        return Prediction(seconds, Z * self.fit.spread() * math.sqrt(terms))
