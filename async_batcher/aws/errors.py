"""Errors the AWS batchers give to one caller when its item could not be written, read or sent.

The service's own errors (botocore ``ClientError``) reach the caller unchanged when the service refused that
item (a ``ValidationException`` isolated to it, a table that does not exist). These classes cover what the
batcher itself concludes.
"""

from __future__ import annotations

from async_batcher.exceptions import AsyncBatchException

__all__ = [
    "AwsBatchError",
    "BatchEntryError",
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


def _describe(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
    return type(error).__name__
