"""Every exception async-batcher raises on its own account.

The names of async-batcher 0.2.2 (``AsyncBatchException``, ``QueueFullException``) are kept so that code
written against it keeps catching what it caught.
"""

from __future__ import annotations

from async_batcher._checks import plural

__all__ = [
    "AsyncBatchException",
    "BatchSizeMismatchError",
    "BatcherStoppedError",
    "OutcomeUnknownError",
    "ProcessBatchCancelledError",
    "QueueFullException",
    "ReentrantCallError",
]


class AsyncBatchException(Exception):
    """Base class of every error raised by async-batcher itself."""


class QueueFullException(AsyncBatchException):
    """The batcher's queue holds ``max_queue_size`` items and the item was refused."""


class BatcherStoppedError(AsyncBatchException, RuntimeError):
    """The batcher is stopping or stopped: the item was refused, or was abandoned by a forced or timed-out stop."""


class OutcomeUnknownError(AsyncBatchException):
    """What ``process_batch`` did for this item, a write or a send, is unknown: it was cut off while the item was on
    its way (a forced stop, an expired ``stop(timeout=...)``, the event loop shutting down, a connection lost after
    the request may have left).

    Not a :class:`BatcherStoppedError`, which says the item was not processed: retrying this one may do it twice.
    Check first (read it back), or retry only what is idempotent. Raised by batchers that write or send (the SQL and
    AWS batchers, through :meth:`~async_batcher.AsyncBatcher.abandoned_error` for a stop); ``__cause__`` is what cut
    it off: the stop's :class:`BatcherStoppedError`, or the driver's error.
    """


class BatchSizeMismatchError(AsyncBatchException, ValueError):
    """``process_batch`` returned a number of results different from the number of items it was given."""

    def __init__(self, expected: int, got: int, *, at_least: bool = False) -> None:
        returned = f"more than {plural(expected, 'result')}" if at_least else plural(got, "result")
        super().__init__(f"process_batch returned {returned} for a batch of {plural(expected, 'item')}")
        self.expected = expected
        self.got = got  # with at_least: the number read before giving up (expected + 1)


class ProcessBatchCancelledError(AsyncBatchException):
    """``process_batch`` raised ``CancelledError`` of its own; the callers get this instead of being cancelled."""


class ReentrantCallError(AsyncBatchException, RuntimeError):
    """A call that would wait for itself (a deadlock) is refused: from inside ``process_batch``, one that would wait
    for its own batch; from inside ``on_start``, an item or a stop; from inside ``on_stop``, a stop."""
