"""The adaptive wait: how long a batch should wait, chosen from what the batcher measures.

A fixed ``max_queue_time`` is wrong at both ends of the load: at low load it adds latency for nothing, at high load
it can be too short to fill batches. Given a latency budget (``AsyncBatcher(max_latency=0.050)``), this policy
learns two things and decides from them:

- the cost of a batch as a function of its size, ``process_time ≈ a·n + b`` (exponentially weighted least squares
  over recent batches, as BentoML fits it);
- the arrival rate ``λ`` (items per second, exponentially weighted with a time constant of a quarter second).

**The rule.** With ``c`` batches allowed in flight, batches of ``n`` items keep up with arrivals when
``λ·(a·n + b) ≤ c·n``, that is from ``n* = λ·b / (c - λ·a)`` items on (``max_batch_size`` when even full batches fall
behind, ``λ·a ≥ c``). A free slot sends at once when ``n*`` items are waiting: more would not pay, batches of that
size already keep up. With fewer, it waits for more, but at most ``b``, the fixed cost of one batch: a smaller batch
sent now would hold the slot for ``b`` anyway, and waiting longer than that costs the waiting items more than the
batch it saves (measured: waiting up to the budget instead added tail latency, ``reports/adaptive.md``; on that
benchmark's single slot the rule does as well as never waiting, since batches fill while the slot is busy). And it
never waits past the budget: the oldest item goes by ``arrival + max_latency - (a·n + b)``, the time its batch is
predicted to take. At low load ``n* < 1``: items go at once. Before the first measurements ``n* = 0``: it sends
whatever is waiting, as ``max_queue_time=0`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from async_batcher._checks import seconds
from async_batcher._core.state import UNLIMITED

__all__ = ["AdaptiveWait", "AdaptiveWaitState"]


@dataclass(frozen=True, slots=True)
class AdaptiveWaitState:
    """What the policy believes now: the cost model, the arrival rate and the batch size it aims for."""

    max_latency: float
    #: Seconds per item of a batch (the slope ``a``).
    per_item: float
    #: Seconds per batch whatever its size (the intercept ``b``).
    per_batch: float
    #: Items per second arriving.
    arrival_rate: float
    #: ``n*``: the size batches settle at while slots are busy (``inf`` when none keeps up).
    keeps_up_size: float
    #: Items a free slot waits for (for at most ``per_batch`` seconds): ``keeps_up_size``.
    target_size: float
    #: Batches measured so far.
    observations: int


class AdaptiveWait:
    """The policy's state: one per batcher. Not thread-safe; used from the batcher's event loop only."""

    __slots__ = ("_last_submitted", "_last_time", "_n", "_nn", "_nt", "_t", "_w", "max_latency", "observations", "rate")

    #: The weight of the newest batch in the fit of ``a`` and ``b`` (an exponential decay): about the last 20
    #: batches count.
    fit_decay: ClassVar[float] = 0.05
    #: The time constant of the arrival rate's average, in seconds (an exponential decay in time).
    rate_time_constant: ClassVar[float] = 0.25

    def __init__(self, max_latency: float) -> None:
        self.max_latency = seconds("max_latency", max_latency, positive=True)
        self._w = self._n = self._t = self._nn = self._nt = 0.0
        self.observations = 0
        self.rate = 0.0
        self._last_time: float | None = None
        self._last_submitted = 0

    def observe(self, size: int, seconds: float) -> None:
        """Record that a batch of ``size`` items took ``seconds`` in ``process_batch``."""
        keep = 1.0 - self.fit_decay
        self._w = self._w * keep + 1.0
        self._n = self._n * keep + size
        self._t = self._t * keep + seconds
        self._nn = self._nn * keep + size * size
        self._nt = self._nt * keep + size * seconds
        self.observations += 1

    def note_arrivals(self, submitted: int, now: float) -> None:
        """Update the arrival rate from the batcher's running count of submitted items."""
        if self._last_time is None:
            self._last_time, self._last_submitted = now, submitted
            return
        elapsed = now - self._last_time
        if elapsed <= 0:
            return
        sample = (submitted - self._last_submitted) / elapsed
        self.rate += (1.0 - math.exp(-elapsed / self.rate_time_constant)) * (sample - self.rate)
        self._last_time, self._last_submitted = now, submitted

    def model(self) -> tuple[float, float]:
        """``(a, b)``: seconds per item and per batch, never negative."""
        if self._w == 0:
            return 0.0, 0.0
        mean_n = self._n / self._w
        mean_t = self._t / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n <= 1e-9:  # all batches of one size: the slope is unknown; charge it all per batch
            return 0.0, max(mean_t, 0.0)
        a = (self._nt / self._w - mean_n * mean_t) / var_n
        b = mean_t - a * mean_n
        if a < 0:
            return 0.0, max(mean_t, 0.0)
        if b < 0:
            return max(mean_t / mean_n, 0.0), 0.0
        return a, b

    def keeps_up_size(self, concurrency: int) -> float:
        """``n*``: the size that batches formed while slots are busy settle at (``inf`` if none keeps up);
        ``concurrency``: the most batches in flight, :data:`~async_batcher.policies.UNLIMITED` for no limit (as the
        batcher's settings give it; 0 or less, the spelling of earlier versions, is no limit too)."""
        a, b = self.model()
        lam = self.rate
        slots = concurrency if 0 < concurrency < UNLIMITED else math.inf
        if lam * a >= slots:
            return math.inf
        if slots == math.inf:
            return 0.0
        return lam * b / (slots - lam * a)

    def target_size(self, concurrency: int) -> float:
        """How many items a free slot waits for (at most ``b`` seconds): the size that keeps up."""
        return self.keeps_up_size(concurrency)

    def send_by(self, oldest_arrival: float, size: int) -> float:
        """When a batch of ``size`` whose oldest item arrived then goes if it has not filled: after waiting ``b``
        (what waiting can save), and in time to meet the budget."""
        a, b = self.model()
        return min(oldest_arrival + b, oldest_arrival + self.max_latency - (a * size + b))

    def state(self, concurrency: int) -> AdaptiveWaitState:
        a, b = self.model()
        return AdaptiveWaitState(
            self.max_latency,
            a,
            b,
            self.rate,
            self.keeps_up_size(concurrency),
            self.target_size(concurrency),
            self.observations,
        )
