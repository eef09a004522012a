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
    from async_batcher._core.policy import LaneView

__all__ = ["Layer", "PreferredSizes", "keeps", "preferred_sizes"]


class Layer(DispatchPolicy):
    """A policy over another, ``inner``: each question goes to ``inner`` unless the layer answers it."""

    def __init__(self, inner: DispatchPolicy | None) -> None:
        if inner is None:
            inner = Deadline()
        if not isinstance(inner, DispatchPolicy):
            raise TypeError(f"{type(self).__name__}: inner must be a DispatchPolicy, got {inner!r}")
        self.wrap(inner)

    def wrap(self, inner: DispatchPolicy) -> None:
        """Wrap ``inner`` (a layer's inner policy may be replaced: the batcher's keywords rebuild its policy); a
        layer already bound binds it to the same dispatcher. A layer that would wrap itself (``inner`` is it, or wraps
        it) is a ``ValueError``: each question would go round for ever."""
        if keeps(inner, self):
            raise ValueError(
                f"{type(self).__name__} cannot wrap {type(inner).__name__}: it is that policy or one it wraps, and "
                "each question would go round for ever"
            )
        self.inner = inner
        self.turns = inner.turns
        self.hard_deadline = inner.hard_deadline
        self.keep_idle = inner.keep_idle
        signals = getattr(self, "signals", None)
        if signals is not None:
            inner.bind(signals)

    def bind(self, signals: Signals) -> None:
        self.signals = signals
        self.inner.bind(signals)

    def due(self, lane: LaneView, now: float) -> float:
        return self.inner.due(lane, now)

    def full_at(self, lane: LaneView, now: float) -> int:
        return self.inner.full_at(lane, now)

    def size(self, lane: LaneView) -> int:
        return self.inner.size(lane)

    def largest(self) -> int:
        return self.inner.largest()

    def reason(self, lane: LaneView, now: float) -> Reason:
        return self.inner.reason(lane, now)

    def pumping(self, now: float) -> None:
        self.inner.pumping(now)

    def dispatched(self, lane: LaneView, batch: BatchFacts, now: float) -> None:
        self.inner.dispatched(lane, batch, now)

    def ended(self, lane: LaneView, batch: BatchFacts, callers: int, now: float) -> bool:
        return self.inner.ended(lane, batch, callers, now)

    def arrival(self, lane: LaneView, now: float) -> int:
        return self.inner.arrival(lane, now)

    def replaced(self, by: DispatchPolicy, lanes: Iterable[LaneView], now: float) -> None:
        if not keeps(by, self.inner):  # (a layer of the new policy goes on)
            self.inner.replaced(by, lanes, now)


def keeps(policy: DispatchPolicy, part: DispatchPolicy) -> bool:
    """Whether ``part`` is ``policy`` or one of the policies it wraps (it goes on serving when ``policy`` takes the
    place of a policy that wrapped it). (A chain of layers that comes back on itself ends the walk.)"""
    found: DispatchPolicy | None = policy
    seen: list[DispatchPolicy] = []
    while found is not None and not any(found is layer for layer in seen):
        if found is part:
            return True
        seen.append(found)
        found = found.inner if isinstance(found, Layer) else None
    return False


def preferred_sizes(value: object) -> tuple[int, ...]:
    """``preferred_batch_sizes`` as a sorted tuple of distinct ints >= 1 (empty: none), or a ``ValueError`` or
    ``TypeError`` naming the value."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"preferred_batch_sizes must be an iterable of ints, got {value!r}")
    given = list(value)
    name = f"each size of preferred_batch_sizes={given!r}"
    return tuple(sorted({_checks.count(name, size, unlimited=False) for size in given}))


class PreferredSizes(Layer):
    """The batch sizes the model runs best at (a compiled engine's profiles, padding buckets; Triton's
    ``preferred_batch_size``): a batch goes at the largest of them available; while none is reached it waits for
    one, at most until ``inner``'s deadline (a :class:`Deadline` by default), then sends what it has.

    Over a latency budget, a batch goes at once from the smallest preferred size that reaches the budget's target.
    """

    def __init__(self, sizes: Iterable[int], inner: DispatchPolicy | None = None) -> None:
        super().__init__(inner)
        self.sizes = sizes  # (any iterable, kept as a sorted tuple)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The preferred sizes, smallest first (set from any iterable of ints >= 1; at least one)."""
        return self._sizes

    @sizes.setter
    def sizes(self, value: Iterable[int]) -> None:
        sizes = preferred_sizes(value)
        if not sizes:
            raise ValueError("PreferredSizes needs at least one size")
        self._sizes = sizes
        self.changed()

    def full_at(self, lane: LaneView, now: float) -> int:
        target = self.inner.full_at(lane, now)
        if target >= UNLIMITED:  # the wait below sends early only when full: any preferred size is worth it
            return self.sizes[0]
        return next((size for size in self.sizes if size >= target), self.sizes[-1])

    def size(self, lane: LaneView) -> int:
        fits = [size for size in self.sizes if size <= lane.count]  # (ascending)
        return fits[-1] if fits else self.inner.size(lane)

    def largest(self) -> int:
        return min(self.sizes[-1], self.inner.largest())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.sizes)!r}, {self.inner!r})"
