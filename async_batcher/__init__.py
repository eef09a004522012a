"""async-batcher: turn many concurrent awaits into few batched calls."""

from __future__ import annotations

from async_batcher._core.current import CurrentBatch, current_batch
from async_batcher._core.options import BatcherOptions
from async_batcher._core.settings import Limits, RefuseLate, ResultCache, Streaming
from async_batcher._core.sinks import END
from async_batcher._version import __version__
from async_batcher.adaptive import AdaptiveWaitState
from async_batcher.batcher import AsyncBatcher
from async_batcher.decorator import BatchDecorator, BatchedFunction, BatchedMethod, batch
from async_batcher.exceptions import (
    AsyncBatchException,
    BatcherStoppedError,
    BatchSizeMismatchError,
    LateRefusalError,
    MessageTooLargeError,
    NotPicklableError,
    OutcomeUnknownError,
    OversizedItemError,
    OwnerUnavailableError,
    ProcessBatchCancelledError,
    QueueFullException,
    ReentrantCallError,
    TransientError,
)
from async_batcher.failures import Isolate, Retry, RetryPolicy, SplitOn
from async_batcher.stats import BatcherStats, LatencySummary

__all__ = [
    "AdaptiveWaitState",
    "AsyncBatcher",
    "AsyncBatchException",
    "BatchDecorator",
    "BatcherOptions",
    "BatchedFunction",
    "BatchedMethod",
    "BatcherStats",
    "CurrentBatch",
    "Limits",
    "RefuseLate",
    "ResultCache",
    "Streaming",
    "LatencySummary",
    "BatchSizeMismatchError",
    "BatcherStoppedError",
    "END",
    "LateRefusalError",
    "MessageTooLargeError",
    "NotPicklableError",
    "OutcomeUnknownError",
    "OwnerUnavailableError",
    "OversizedItemError",
    "ProcessBatchCancelledError",
    "QueueFullException",
    "ReentrantCallError",
    "Isolate",
    "Retry",
    "RetryPolicy",
    "SplitOn",
    "TransientError",
    "batch",
    "current_batch",
    "__version__",
]
