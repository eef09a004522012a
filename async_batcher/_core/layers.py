"""Policies that change another: :class:`PreferredSizes` (the batch sizes a model runs best at) over a wait, and the
base of both layers, :class:`Layer`, which hands every question to the policy it wraps unless it answers it itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from async_batcher import _checks
from async_batcher._core.policy import UNLIMITED, BatchFacts, DispatchPolicy, Reason, Signals
from async_batcher._core.waits import Deadline

if TYPE_CHECKING:
    from async_batcher._core.lane import Lane

__all__ = ["Layer", "PreferredSizes"]


class Layer(DispatchPolicy):
    """A policy over another, ``inner``: each question goes to ``inner`` unless the layer answers it."""

    def __init__(self, inner: DispatchPolicy | None) -> None:
        if inner is None:
            inner = Deadline()
        if not isinstance(inner, DispatchPolicy):
            raise TypeError(f"{type(self).__name__}: inner must be a DispatchPolicy, got {inner!r}")
        self.inner = inner
        self.turns = inner.turns
        self.hard_deadline = inner.hard_deadline

    def bind(self, signals: Signals) -> None:
        self.signals = signals
        self.inner.bind(signals)

    def due(self, lane: Lane, now: float) -> float:
        return self.inner.due(lane, now)

    def full_at(self, lane: Lane, now: float) -> int:
        return self.inner.full_at(lane, now)

    def size(self, lane: Lane) -> int:
        return self.inner.size(lane)

    def largest(self) -> int:
        return self.inner.largest()

    def reason(self, lane: Lane, now: float) -> Reason:
        return self.inner.reason(lane, now)

    def pumping(self, now: float) -> None:
        self.inner.pumping(now)

    def dispatched(self, lane: Lane, batch: BatchFacts, now: float) -> None:
        self.inner.dispatched(lane, batch, now)

    def ended(self, lane: Lane, batch: BatchFacts, callers: int, now: float) -> bool:
        return self.inner.ended(lane, batch, callers, now)

    def arrival(self, lane: Lane, now: float) -> int:
        return self.inner.arrival(lane, now)


class PreferredSizes(Layer):
    """The batch sizes the model runs best at (a compiled engine's profiles, padding buckets; Triton's
    ``preferred_batch_size``): a batch goes at the largest of them available; while none is reached it waits for
    one, at most until ``inner``'s deadline (a :class:`Deadline` by default), then sends what it has.

    Over a latency budget, a batch goes at once from the smallest preferred size that reaches the budget's target.
    """

    def __init__(self, sizes: Iterable[int], inner: DispatchPolicy | None = None) -> None:
        super().__init__(inner)
        if isinstance(sizes, str | bytes) or not isinstance(sizes, Iterable):
            raise TypeError(f"preferred_batch_sizes must be an iterable of ints, got {sizes!r}")
        given = list(sizes)
        name = f"each size of preferred_batch_sizes={given!r}"
        self.sizes = tuple(sorted({_checks.count(name, size, unlimited=False) for size in given}))
        if not self.sizes:
            raise ValueError("PreferredSizes needs at least one size")

    def full_at(self, lane: Lane, now: float) -> int:
        target = self.inner.full_at(lane, now)
        if target >= UNLIMITED:  # the wait below sends early only when full: any preferred size is worth it
            return self.sizes[0]
        return next((size for size in self.sizes if size >= target), self.sizes[-1])

    def size(self, lane: Lane) -> int:
        fits = [size for size in self.sizes if size <= lane.count]  # (ascending)
        return fits[-1] if fits else self.inner.size(lane)

    def largest(self) -> int:
        return min(self.sizes[-1], self.inner.largest())

    def __repr__(self) -> str:
        return f"PreferredSizes({list(self.sizes)!r}, {self.inner!r})"
