"""Batch SNS publishes into ``PublishBatch`` calls.

Each caller's ``await batcher.process(SnsMessage(...))`` returns the message id SNS gave the message, or raises:

* :class:`~async_batcher.aws.errors.SnsEntryError` when SNS refused that message (its ``Failed`` entry has
  ``SenderFault`` true: the message itself is at fault);
* :class:`~async_batcher.aws.errors.RetriesExhaustedError` when SNS kept failing it on its side
  (``SenderFault`` false) or kept throttling for ``retry.max_attempts`` calls; the message was not published;
* the service's error (botocore ``ClientError``) when SNS refused the call for a reason of this message's
  (``InvalidParameter``, such as a FIFO message without ``group_id``: isolated by bisection) or of its topic
  (``NotFound``: every message for that topic);
* :class:`~async_batcher.aws.errors.AwsOutcomeUnknownError` when SNS may or may not have published it: the
  connection was lost or timed out after the request may have left, or the batcher gave up after a call that
  answered 5xx; :class:`~async_batcher.aws.errors.AbandonedBatchError` when a stop cut its batch off while some
  of it may have been published (``outcome_of(item)`` says what became of each item);
* the transport error when the connection could not be opened (refused, DNS, connect timeout), even after
  botocore's retries, or its call was never made because an earlier call of the batch got no answer: the
  message was not published.

A call carries messages for one topic only, at most 10 of them and at most 256 KiB of payload (messages,
subjects and attributes). ``batch_key`` returns the topic ARN, so the batcher never mixes topics in a batch,
and ``process_batch`` groups by topic as well. The calls of a FIFO topic (``.fifo``) go one after the other, and
a call refused for one message is bisected in order, so a group keeps its order inside a batch; across batches
it does only with ``concurrency=1``. A message retried after an SNS-side failure (a ``Failed`` entry that is not
the sender's fault) can still land after later messages of its call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from async_batcher.aws._chunking import attributes_size, check_attributes, utf8_length
from async_batcher.aws._delivery import Outcomes
from async_batcher.aws._entries import numbered, settle_entries
from async_batcher.aws._targeted import Entry, TargetedBatcher
from async_batcher.aws.errors import SnsEntryError

__all__ = ["MAX_BATCH_BYTES", "MAX_ENTRIES_PER_CALL", "AsyncSnsPublishBatcher", "SnsMessage", "message_size"]

MAX_ENTRIES_PER_CALL = 10
"""The most messages ``PublishBatch`` takes in one call."""

MAX_BATCH_BYTES = 256 * 1024
"""The most payload ``PublishBatch`` takes in one call (all its messages together)."""

# What one bad message can make SNS refuse a whole PublishBatch call with.
_BISECT_CODES = frozenset(
    {
        "InvalidParameter",
        "InvalidParameterValue",
        "ParameterValueInvalid",
        "ValidationException",
        "BatchRequestTooLong",
    }
)


def _optional_text(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be a non-empty str or None, got {value!r:.200}")


@dataclass(kw_only=True)
class SnsMessage:
    """One message to publish.

    Args:
        message: The message (non-empty); with ``message_structure="json"``, a JSON object of one message per
            protocol.
        topic_arn: The topic; the batcher's ``topic_arn`` if None.
        subject: The subject (email subscriptions).
        message_structure: ``"json"`` to send a different message to each protocol.
        attributes: Message attributes in SNS's form, ``{"name": {"DataType": "String", "StringValue": "x"}}``.
        group_id: ``MessageGroupId`` (FIFO topics: required there).
        deduplication_id: ``MessageDeduplicationId`` (FIFO topics without content-based deduplication).
    """

    message: str
    topic_arn: str | None = None
    subject: str | None = None
    message_structure: str | None = None
    attributes: Mapping[str, Mapping[str, Any]] | None = None
    group_id: str | None = None
    deduplication_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.message, str) or not self.message:
            raise ValueError(f"message must be a non-empty str, got {self.message!r:.200}")
        for name in ("topic_arn", "subject", "message_structure", "group_id", "deduplication_id"):
            _optional_text(name, getattr(self, name))
        check_attributes(self.attributes)

    def entry(self) -> dict[str, Any]:
        """The ``PublishBatch`` entry for this message, without its ``Id``."""
        entry: dict[str, Any] = {"Message": self.message}
        optional = {
            "Subject": self.subject,
            "MessageStructure": self.message_structure,
            "MessageGroupId": self.group_id,
            "MessageDeduplicationId": self.deduplication_id,
        }
        entry.update({key: value for key, value in optional.items() if value is not None})
        if self.attributes:
            entry["MessageAttributes"] = {name: dict(value) for name, value in self.attributes.items()}
        return entry


def message_size(message: SnsMessage) -> int:
    """The payload SNS counts: the message, its subject and each attribute's name, type and value."""
    return utf8_length(message.message) + utf8_length(message.subject or "") + attributes_size(message.attributes)


class AsyncSnsPublishBatcher(TargetedBatcher[SnsMessage, str]):
    """Batches :class:`SnsMessage` publishes into SNS ``PublishBatch`` calls (see the module docstring).

    Args:
        topic_arn: The topic of the messages that name none.
        max_batch_size: The most messages per batch (10 by default: one call).
        **kwargs: The client settings (``region_name``, ``use_ssl``, ``verify``, ``endpoint_url``, ``config``,
            ``aioboto3_session``), ``retry`` (the backoff and attempt limit for throttling and ``Failed``
            entries that are SNS's fault), all as in :class:`~async_batcher.aws.base.AwsBatcher`, and the
            :class:`~async_batcher.AsyncBatcher` settings (``max_queue_time``, ``concurrency``, ...).
    """

    service_name: ClassVar[str] = "sns"
    operation: ClassVar[str] = "PublishBatch"
    target_attribute: ClassVar[str] = "topic_arn"
    max_entries: ClassVar[int] = MAX_ENTRIES_PER_CALL
    bisect_codes: ClassVar[frozenset[str]] = _BISECT_CODES

    def __init__(
        self, *, topic_arn: str | None = None, max_batch_size: int = MAX_ENTRIES_PER_CALL, **kwargs: Any
    ) -> None:
        super().__init__(default_target=topic_arn, max_batch_size=max_batch_size, **kwargs)

    @property
    def topic_arn(self) -> str | None:
        """The topic of the messages that name none."""
        return self.default_target

    def max_call_bytes(self) -> int:
        return MAX_BATCH_BYTES

    def entry_of(self, item: SnsMessage) -> tuple[dict[str, Any], int]:
        return item.entry(), message_size(item)

    async def call(self, entries: list[Entry], outcomes: Outcomes[str]) -> list[Entry]:
        """One ``PublishBatch`` call; records the published and refused messages, returns those to retry."""
        response = await self.client.publish_batch(
            TopicArn=entries[0].target, PublishBatchRequestEntries=numbered([item.entry for item in entries])
        )
        return settle_entries(response, entries, outcomes, refused=SnsEntryError)
