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
    "LateRefusalError",
    "MessageTooLargeError",
    "NotPicklableError",
    "OutcomeUnknownError",
    "OwnerUnavailableError",
    "OversizedItemError",
    "ProcessBatchCancelledError",
    "QueueFullException",
    "ReentrantCallError",
    "TransientError",
]


class AsyncBatchException(Exception):
    """Base class of every error raised by async-batcher itself."""


class QueueFullException(AsyncBatchException):
    """The item was refused for want of room: the queue holds ``max_queue_size`` items, or ``max_queue_weight`` of
    weight is admitted and not yet answered (and ``wait_when_full`` is off). Try again later.

    ``retry_after``: seconds after which a new try may be admitted, when the batcher can tell (``None``: it cannot;
    :func:`async_batcher.fastapi.add_batcher_exception_handlers` then sends its default ``Retry-After``).
    """

    def __init__(self, *args: object, retry_after: float | None = None) -> None:
        super().__init__(*args)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[object, ...]:  # (pickled with its keywords: a worker process may raise it)
        return _rebuild, (type(self), self.args, vars(self))


class LateRefusalError(QueueFullException):
    """``refuse_late=True``: the item was refused at admission because it is predicted to be answered after its
    deadline (its call's ``timeout``, ``default_timeout``, or ``max_latency``): the work queued ahead of it, at the
    throughput measured, would take longer than it may wait. Refused at once, it costs no queue slot, no row of a
    batch and not its caller's whole timeout.

    An item is also refused when its deadline is far but it would join a batch whose items are due sooner and make
    them late: the items behind are held to the deadlines of those ahead.

    ``predicted``: seconds from its arrival to its predicted answer; ``margin``: seconds added to the prediction
    for its error; ``budget``: seconds it had (or the earliest due of the items ahead of it in its batch, if
    sooner); ``retry_after``: seconds until the backlog ahead of it is predicted to have drained enough for the same
    call to be admitted, never 0: refused for the items ahead of it in its batch, it waits at least until their
    batch has gone (or, when a slot is free and the policy decides when it goes, the time of a batch of its own).
    """

    def __init__(
        self, message: str, *, predicted: float, margin: float = 0.0, budget: float, retry_after: float
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.predicted = predicted
        self.margin = margin
        self.budget = budget


class OversizedItemError(AsyncBatchException, ValueError):
    """The item (or a ``process_many`` call's items together) weighs more than ``max_queue_weight`` or, alone,
    more than ``max_batch_weight``: it can never be admitted, so it is refused at once, never left waiting for room
    that cannot come. A ``ValueError``, as the too heavy item always was; not a :class:`QueueFullException`: trying
    again will not help (HTTP 413, not 503)."""

    def __init__(self, message: str, *, weight: float, limit: float) -> None:
        super().__init__(message)
        self.weight = weight
        self.limit = limit

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, vars(self))


def _rebuild(cls: type[BaseException], args: tuple[object, ...], attributes: dict[str, object]) -> BaseException:
    """An exception with keyword attributes, unpickled: built without its ``__init__``, its state restored."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(attributes)
    return exc


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


class TransientError(AsyncBatchException):
    """``process_batch`` answered this item with :class:`~async_batcher.failures.Retry` (without an error of its
    own), and it was not tried again: no retry policy (``retry=``), its attempts or the retry budget ran out, or its
    deadline would pass before its next try. The message says which."""


class OwnerUnavailableError(BatcherStoppedError):
    """A :class:`~async_batcher.shared.SharedBatcher`'s item found no owner to process it: none came within
    ``owner_wait`` seconds (the owner had stopped or died and no process took over, or none was ever started), or the
    owner refused this process's key. The item was not processed: it is safe to try again. The message names the
    socket's address; ``__cause__`` is the last error met trying to reach it, if any."""


class NotPicklableError(AsyncBatchException, TypeError):
    """An item, a result or an exception of a :class:`~async_batcher.shared.SharedBatcher` could not cross between
    processes: pickling it failed (or unpickling it, on the other side). The message names its type and the error;
    an item that cannot be pickled fails its caller at once, before anything is sent."""


class MessageTooLargeError(AsyncBatchException, ValueError):
    """An item or a result of a :class:`~async_batcher.shared.SharedBatcher`, pickled, is larger than
    ``max_message_size`` bytes: it does not cross (an item fails its caller at once, before anything is sent).
    ``size`` and ``limit`` are in bytes."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, vars(self))
