"""Dispatch policies: when a lane's next batch goes and how many items it takes.

A batcher's ``policy=`` is one of these, or a class of your own (subclass :class:`DispatchPolicy` and implement
:meth:`~DispatchPolicy.due`). The keywords of earlier versions build them: ``max_queue_time=`` a :class:`Deadline`,
``max_latency=`` a :class:`LatencyBudget`, ``preferred_batch_sizes=`` a :class:`PreferredSizes` over it, and
``max_hold_time=`` a :class:`ClosedLoopHold` over that.
"""

from __future__ import annotations

from async_batcher._core.hold import ClosedLoopHold
from async_batcher._core.layers import Layer, PreferredSizes
from async_batcher._core.policy import UNLIMITED, BatchFacts, DispatchPolicy, LaneView, Reason, Signals
from async_batcher._core.waits import Deadline, LatencyBudget

__all__ = [
    "UNLIMITED",
    "BatchFacts",
    "ClosedLoopHold",
    "Deadline",
    "DispatchPolicy",
    "LaneView",
    "LatencyBudget",
    "Layer",
    "PreferredSizes",
    "Reason",
    "Signals",
]
