"""Batch SQS sends into ``SendMessageBatch`` calls.

Each caller's ``await batcher.process(SqsMessage(...))`` returns the message id SQS gave the message, or
raises:

* :class:`~async_batcher.aws.errors.SqsEntryError` when SQS refused that message (its ``Failed`` entry has
  ``SenderFault`` true: the message itself is at fault);
* :class:`~async_batcher.aws.errors.RetriesExhaustedError` when SQS kept failing it on its side
  (``SenderFault`` false) or kept throttling for ``retry.max_attempts`` calls; the message was not sent;
* the service's error (botocore ``ClientError``) when SQS refused the call for a reason of this message's
  (isolated by bisection) or of its queue (``QueueDoesNotExist``: every message for that queue);
* :class:`~async_batcher.aws.errors.AwsOutcomeUnknownError` when SQS may or may not have sent it: the
  connection was lost or timed out after the request may have left, or the batcher gave up after a call that
  answered 5xx; :class:`~async_batcher.aws.errors.AbandonedBatchError` when a stop cut its batch off while some
  of it may have been sent (``outcome_of(item)`` says what became of each item);
* the transport error when the connection could not be opened (refused, DNS, connect timeout), even after
  botocore's retries, or its call was never made because an earlier call of the batch got no answer: the
  message was not sent.

A call carries messages for one queue only, at most 10 of them, and at most ``max_batch_bytes`` of payload
(bodies plus attributes, counted as SQS counts them; 256 KiB by default, which every queue accepts: raise it to
1 MiB for queues configured for that). ``batch_key`` returns the queue URL, so the batcher never mixes queues
in a batch, and ``process_batch`` groups by queue as well, so a mixed batch is still right.

The calls of a FIFO queue (``.fifo``) go one after the other, and a call refused for one message is bisected in
order, so a message group keeps its order inside a batch; across batches it does only with ``concurrency=1``.
Retried messages can still overtake one another: a message whose entry failed on SQS's side is sent again after
the entries of the same call that succeeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from async_batcher.aws._chunking import attributes_size, check_attributes, utf8_length
from async_batcher.aws._delivery import Outcomes
from async_batcher.aws._entries import numbered, settle_entries
from async_batcher.aws._targeted import Entry, TargetedBatcher
from async_batcher.aws.errors import SqsEntryError

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "MAX_ENTRIES_PER_CALL",
    "AsyncSqsSendBatcher",
    "SqsMessage",
    "message_size",
]

MAX_ENTRIES_PER_CALL = 10
"""The most messages ``SendMessageBatch`` takes in one call."""

DEFAULT_MAX_BATCH_BYTES = 256 * 1024
"""The payload cap per call this batcher keeps to by default: 256 KiB, the limit of every SQS queue."""

_MAX_BATCH_BYTES_CAP = 1024 * 1024  # the largest payload SQS takes in one call (2025 onwards)

# What one bad message can make SQS refuse a whole SendMessageBatch call with.
_BISECT_CODES = frozenset(
    {
        "InvalidMessageContents",
        "InvalidParameterValue",
        "InvalidAttributeValue",
        "InvalidAttributeName",
        "ValidationException",
        "BatchRequestTooLong",
        "AWS.SimpleQueueService.BatchRequestTooLong",
        "MissingParameter",
    }
)


@dataclass(kw_only=True)
class SqsMessage:
    """One message to send.

    Args:
        body: The message body (non-empty).
        queue_url: The queue; the batcher's ``queue_url`` if None.
        attributes: Message attributes in SQS's form,
            ``{"name": {"DataType": "String", "StringValue": "x"}}`` (or ``BinaryValue`` bytes).
        delay_seconds: Delay before the message becomes visible (standard queues).
        group_id: ``MessageGroupId`` (FIFO queues).
        deduplication_id: ``MessageDeduplicationId`` (FIFO queues without content-based deduplication).
    """

    body: str
    queue_url: str | None = None
    attributes: Mapping[str, Mapping[str, Any]] | None = None
    delay_seconds: int | None = None
    group_id: str | None = None
    deduplication_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.body, str) or not self.body:
            raise ValueError(f"body must be a non-empty str, got {self.body!r:.200}")
        if self.queue_url is not None and (not isinstance(self.queue_url, str) or not self.queue_url):
            raise ValueError(f"queue_url must be a non-empty str or None, got {self.queue_url!r}")
        if self.delay_seconds is not None and (
            isinstance(self.delay_seconds, bool) or not isinstance(self.delay_seconds, int) or self.delay_seconds < 0
        ):
            raise ValueError(f"delay_seconds must be an int >= 0, got {self.delay_seconds!r}")
        check_attributes(self.attributes)

    def entry(self) -> dict[str, Any]:
        """The ``SendMessageBatch`` entry for this message, without its ``Id``."""
        entry: dict[str, Any] = {"MessageBody": self.body}
        if self.attributes:
            entry["MessageAttributes"] = {name: dict(value) for name, value in self.attributes.items()}
        if self.delay_seconds is not None:
            entry["DelaySeconds"] = self.delay_seconds
        if self.group_id is not None:
            entry["MessageGroupId"] = self.group_id
        if self.deduplication_id is not None:
            entry["MessageDeduplicationId"] = self.deduplication_id
        return entry


def message_size(message: SqsMessage) -> int:
    """The size SQS counts against its limits: the body, and each attribute's name, type and value."""
    return utf8_length(message.body) + attributes_size(message.attributes)


class AsyncSqsSendBatcher(TargetedBatcher[SqsMessage, str]):
    """Batches :class:`SqsMessage` sends into SQS ``SendMessageBatch`` calls (see the module docstring).

    Args:
        queue_url: The queue of the messages that name none.
        max_batch_size: The most messages per batch (10 by default: one call).
        max_batch_bytes: The most payload bytes per call (default 256 KiB, at most 1 MiB).
        **kwargs: The client settings (``region_name``, ``use_ssl``, ``verify``, ``endpoint_url``, ``config``,
            ``aioboto3_session``), ``retry`` (the backoff and attempt limit for throttling and ``Failed``
            entries that are SQS's fault), all as in :class:`~async_batcher.aws.base.AwsBatcher`, and the
            :class:`~async_batcher.AsyncBatcher` settings (``max_queue_time``, ``concurrency``, ...).
    """

    service_name: ClassVar[str] = "sqs"
    operation: ClassVar[str] = "SendMessageBatch"
    target_attribute: ClassVar[str] = "queue_url"
    max_entries: ClassVar[int] = MAX_ENTRIES_PER_CALL
    bisect_codes: ClassVar[frozenset[str]] = _BISECT_CODES

    def __init__(
        self,
        *,
        queue_url: str | None = None,
        max_batch_size: int = MAX_ENTRIES_PER_CALL,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        **kwargs: Any,
    ) -> None:
        super().__init__(default_target=queue_url, max_batch_size=max_batch_size, **kwargs)
        if not isinstance(max_batch_bytes, int) or not 1 <= max_batch_bytes <= _MAX_BATCH_BYTES_CAP:
            raise ValueError(f"max_batch_bytes must be an int in [1, {_MAX_BATCH_BYTES_CAP}], got {max_batch_bytes!r}")
        self.max_batch_bytes = max_batch_bytes

    @property
    def queue_url(self) -> str | None:
        """The queue of the messages that name none."""
        return self.default_target

    def max_call_bytes(self) -> int:
        return self.max_batch_bytes

    def entry_of(self, item: SqsMessage) -> tuple[dict[str, Any], int]:
        return item.entry(), message_size(item)

    async def call(self, entries: list[Entry], outcomes: Outcomes[str]) -> list[Entry]:
        """One ``SendMessageBatch`` call; records the sent and refused messages, returns those to retry."""
        response = await self.client.send_message_batch(
            QueueUrl=entries[0].target, Entries=numbered([item.entry for item in entries])
        )
        return settle_entries(response, entries, outcomes, refused=SqsEntryError)
