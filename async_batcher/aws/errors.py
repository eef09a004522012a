"""Errors the AWS batchers give to one caller when its item could not be written, read or sent.

The rule for a caller of a batcher that writes or sends (DynamoDB writes, SQS, SNS, Kinesis):

* a result: the service applied the item;
* an :class:`~async_batcher.OutcomeUnknownError` (here :class:`AwsOutcomeUnknownError` or
  :class:`AbandonedBatchError`): the service may or may not have applied it;
* any other exception: it did not apply it; but for the ``TimeoutError`` of the caller's own ``timeout=`` (or a
  cancellation), which says only that the caller stopped waiting: an item already sent runs on with its batch.

The service's own errors (botocore ``ClientError``) reach the caller unchanged when the service refused that
item (a ``ValidationException`` isolated to it, a table that does not exist). A transport error (botocore's
``EndpointConnectionError`` and the like) reaches the caller unchanged only when no request carrying the item
reached the service (the connection was refused, or an earlier call of the batch got no answer and this item
was never sent). The other classes here cover what the batcher itself concludes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from async_batcher.exceptions import AsyncBatchException, OutcomeUnknownError

__all__ = [
    "AbandonedBatchError",
    "AwsBatchError",
    "AwsOutcomeUnknownError",
    "BatchEntryError",
    "EntryOutcome",
    "KinesisRecordError",
    "RetriesExhaustedError",
    "SnsEntryError",
    "SqsEntryError",
]


class AwsBatchError(AsyncBatchException):
    """Base class of the errors raised by the AWS batchers."""


class RetriesExhaustedError(AwsBatchError):
    """The service kept this item unprocessed (or kept throttling) for ``attempts`` calls in a row.

    The item was *not* written / read / sent as far as the service told us; retrying it later is safe.
    ``last_error`` is the throttling error of the last call, or None when the last call returned the item as
    unprocessed (``UnprocessedItems``, ``UnprocessedKeys``, a retryable ``Failed`` entry).
    """

    def __init__(self, operation: str, attempts: int, last_error: BaseException | None) -> None:
        reason = "left unprocessed" if last_error is None else f"throttled ({_describe(last_error)})"
        super().__init__(f"{operation}: item still {reason} after {attempts} attempt(s); it was not applied")
        self.operation = operation
        self.attempts = attempts
        self.last_error = last_error


class BatchEntryError(AwsBatchError):
    """The service refused this item's entry of a batch call (``operation``) with ``code``.

    ``sender_fault`` is True when the item itself is at fault (retrying it unchanged will not help).
    """

    operation = "batch call"

    def __init__(self, code: str, message: str, sender_fault: bool) -> None:
        who = "sender" if sender_fault else "service"
        super().__init__(f"{self.operation} entry failed ({who} fault): {code}: {message}")
        self.code = code
        self.message = message
        self.sender_fault = sender_fault


class SqsEntryError(BatchEntryError):
    """SQS refused this message in ``SendMessageBatch`` (its ``Failed`` entry)."""

    operation = "SendMessageBatch"


class SnsEntryError(BatchEntryError):
    """SNS refused this message in ``PublishBatch`` (its ``Failed`` entry with ``SenderFault`` true)."""

    operation = "PublishBatch"


class KinesisRecordError(BatchEntryError):
    """Kinesis refused this record in ``PutRecords`` with an ``ErrorCode`` that waiting will not cure."""

    operation = "PutRecords"


class AwsOutcomeUnknownError(OutcomeUnknownError, AwsBatchError):
    """``operation`` may or may not have applied this item: a request carrying it may have reached the service,
    and no answer says what became of it.

    Given when the connection was lost or timed out after the request may have been sent (``__cause__`` is
    botocore's transport error), or when the batcher gave up retrying an item that a call answered with HTTP
    5xx, or with no answer, may already have applied (``__cause__`` is the :class:`RetriesExhaustedError`).
    Retrying the item may apply it twice: read it back first, or make it idempotent (a DynamoDB put of the same
    item, an SQS or SNS FIFO ``deduplication_id``, an id of your own in the payload that consumers check).
    """

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"{operation}: {reason}; the item may or may not have been applied")
        self.operation = operation


EntryState = Literal["applied", "not applied", "unknown"]


@dataclass(frozen=True)
class EntryOutcome:
    """What became of one item of a batch that a stop cut off (:meth:`AbandonedBatchError.outcome_of`).

    ``state`` is ``"applied"`` (the service answered that it wrote or sent the item; ``result`` is what the
    caller would have got: a message id, a :class:`~async_batcher.aws.kinesis.KinesisPutResult`, None for a
    DynamoDB write), ``"not applied"`` (never sent, or the service answered that it did not apply it: ``error``
    says why when it did) or ``"unknown"`` (a request carrying it was under way, or got an answer that does not
    say).
    """

    state: EntryState
    result: Any = None
    error: BaseException | None = None


class AbandonedBatchError(AwsOutcomeUnknownError):
    """The batcher was stopped (``stop(force=True)``, an expired ``stop(timeout=...)``, the event loop shutting
    down) while this item's batch was under way, and some items of the batch may have been applied.

    Every waiting caller of the batch gets this one exception (``__cause__`` is the stop's
    :class:`~async_batcher.BatcherStoppedError`); :meth:`outcome_of` tells each what the batcher knew of its own
    item when the stop came. A batch none of whose items can have been applied gives its callers the plain
    ``BatcherStoppedError`` instead: those items may be sent again as they are.
    """

    def __init__(self, operation: str, items: Sequence[object], outcomes: Sequence[EntryOutcome]) -> None:
        counts = {state: sum(o.state == state for o in outcomes) for state in ("applied", "unknown", "not applied")}
        super().__init__(
            operation,
            f"the batcher was stopped while a batch of {len(outcomes)} item(s) was under way ({counts['applied']} "
            f"applied, {counts['unknown']} unknown, {counts['not applied']} not applied); outcome_of(item) says "
            f"which",
        )
        self.items = tuple(items)
        self.outcomes = tuple(outcomes)

    def outcome_of(self, item: object) -> EntryOutcome:
        """What became of ``item``: the very object given to ``process()`` (found by identity, not equality).

        An object submitted more than once in the batch gets the state its submissions share (without a result
        or error, unless they share those too), or ``"unknown"`` when they differ. Raises ``ValueError`` for an
        object that is not an item of this batch.
        """
        found = [outcome for candidate, outcome in zip(self.items, self.outcomes, strict=True) if candidate is item]
        if not found:
            raise ValueError(f"{type(item).__name__} object at {id(item):#x} is not an item of this batch")
        first = found[0]
        if all(outcome == first for outcome in found):
            return first
        if all(outcome.state == first.state for outcome in found):
            return EntryOutcome(first.state)
        return EntryOutcome("unknown")


def _describe(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
    return type(error).__name__
