"""What is left of a batch once a call of it has failed (private; state of the execution layer): its items one by one
in a :class:`Tree`, and the :class:`Part` of them to call next. :mod:`~async_batcher._core.recovery` decides what they
become.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from async_batcher._core.batch import Batch
    from async_batcher._core.recovery import Recovery

__all__ = ["Part", "Tree"]


class Part:
    """Items of a batch to call ``process_batch`` on (``index``: their places in the :class:`Tree`).

    ``error``: the error of the failed call it comes from, which its items get if it is never called.
    ``isolating``: a part of a bisection (its call counts in the extra calls). ``sibling``: the other half of the
    same bisected part, which this one's success presumes at fault (``presumed``: split without being called).
    ``whole``: the whole batch (its first call, or a call again of ``retry_first``).
    """

    __slots__ = ("error", "index", "isolating", "presumed", "sibling", "whole")

    def __init__(
        self, index: list[int], error: BaseException | None = None, *, isolating: bool = False, whole: bool = False
    ) -> None:
        self.index = index
        self.error = error
        self.isolating = isolating
        self.whole = whole  # the whole batch (its first call, or one of isolate's retry_first)
        self.presumed = False
        self.sibling: Part | None = None


class Tree:
    """What is left of a batch once a call of it has failed or answered items with ``Retry``: its items one by one
    (a ``process_many`` call's run of items split into single ones), the part being called, those left to call,
    and the isolation's extra calls left."""

    __slots__ = (
        "answered",
        "arrivals",
        "attempts",
        "contexts",
        "deadlines",
        "extra_left",
        "first_left",
        "futures_only",
        "items",
        "ok_size",
        "ok_weight",
        "part",
        "pending",
        "recovery",
        "sinks",
        "tries",
        "weights",
    )

    def __init__(self, recovery: Recovery, batch: Batch) -> None:
        self.recovery = recovery
        self.items: list[Any] = batch.kept if batch.kept is not None else list(batch.items)
        n = len(self.items)
        if batch.futures_only:
            self.sinks: list[Any] = list(batch.sinks)
            self.contexts: list[Any] = list(batch.contexts)
        else:
            self.sinks, self.contexts = [], []
            for sink, context in zip(batch.sinks, batch.contexts, strict=True):
                if sink.__class__ is tuple:
                    bulk, start, count = sink
                    self.sinks.extend((bulk, start + j, 1) for j in range(count))
                    self.contexts.extend([context] * count)
                else:
                    self.sinks.append(sink)
                    self.contexts.append(context)
        self.futures_only = batch.futures_only
        self.weights = batch.weights
        self.deadlines: list[float] = batch.deadlines if batch.deadlines is not None else [math.inf] * n
        self.attempts: list[int] = batch.attempts if batch.attempts is not None else [0] * n
        self.tries: list[int] = batch.tries if batch.tries is not None else [0] * n
        self.arrivals = batch.arrivals  # each item's arrival, if the engine's watchers asked for them
        self.part = Part(list(range(n)), whole=True)
        self.pending: deque[Part] = deque()
        isolate = recovery.isolate
        self.extra_left = 0 if isolate is None else isolate.budget(n)
        self.first_left = 0 if isolate is None else isolate.retry_first
        self.answered = 0
        self.ok_size = 0  # the largest part that succeeded (a split's)
        self.ok_weight = 0.0

    def weight(self, index: list[int]) -> float:
        weights = self.weights
        return float(len(index)) if weights is None else sum(weights[i] for i in index)

    def pending_sinks(self) -> list[Any]:
        """The sinks of the items of the parts left to call (a forced stop fails them)."""
        return [self.sinks[i] for part in self.pending for i in part.index]
