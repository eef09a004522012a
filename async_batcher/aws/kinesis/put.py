"""Batch Kinesis ``PutRecord`` into ``PutRecords`` calls.

Each caller's ``await batcher.process(KinesisRecord(data=..., partition_key=...))`` returns a
:class:`KinesisPutResult` (the shard and sequence number Kinesis gave the record), or raises:

* :class:`~async_batcher.aws.errors.RetriesExhaustedError` when Kinesis kept failing the record
  (``ProvisionedThroughputExceededException``, ``InternalFailure``) or kept throttling the whole call for
  ``retry.max_attempts`` calls; the record was not put;
* :class:`~async_batcher.aws.errors.KinesisRecordError` when Kinesis failed the record with another
  ``ErrorCode`` (not retried);
* the service's error (botocore ``ClientError``) when Kinesis refused the call for a reason of this record's
  (``ValidationException``, ``InvalidArgumentException``: isolated by bisection) or of its stream
  (``ResourceNotFoundException``, KMS errors: every record for that stream);
* :class:`~async_batcher.aws.errors.AwsOutcomeUnknownError` when Kinesis may or may not have put it: the
  connection was lost or timed out after the request may have left, or the batcher gave up after a call that
  answered 5xx; :class:`~async_batcher.aws.errors.AbandonedBatchError` when a stop cut its batch off while some
  of it may have been put (``outcome_of(item)`` says what became of each item);
* the transport error when the connection could not be opened (refused, DNS, connect timeout), even after
  botocore's retries, or its call was never made because an earlier call of the batch got no answer: the
  record was not put.

A call carries records for one stream only, at most 500 of them and at most 5 MiB (data plus partition keys).
The calls of a batch go one after the other, so the records of a partition key keep their order inside a
batch (across batches only with ``concurrency=1``, the default). Kinesis answers record by record in request
order: failed records are sent again, with exponential backoff and full jitter, after the others of their
call, so a retried record can land after later records of its shard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from async_batcher.aws._chunking import utf8_length
from async_batcher.aws._delivery import Outcomes
from async_batcher.aws._targeted import Entry, TargetedBatcher
from async_batcher.aws.errors import KinesisRecordError
from async_batcher.aws.retry import RETRYABLE_ERROR_CODES

__all__ = [
    "MAX_HASH_KEY",
    "MAX_RECORDS_PER_CALL",
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_BYTES",
    "AsyncKinesisPutBatcher",
    "KinesisPutResult",
    "KinesisRecord",
]

MAX_RECORDS_PER_CALL = 500
"""The most records ``PutRecords`` takes in one call."""

MAX_REQUEST_BYTES = 5 * 1024 * 1024
"""The most data plus partition keys ``PutRecords`` takes in one call."""

MAX_RECORD_BYTES = 1024 * 1024
"""The most data plus partition key of one record."""

# What one bad record can make Kinesis refuse a whole PutRecords call with.
_BISECT_CODES = frozenset({"ValidationException", "InvalidArgumentException"})

MAX_HASH_KEY = 2**128 - 1
"""The largest hash key: Kinesis hashes partition keys to 128-bit integers."""

# The service's pattern for a hash key, 0|([1-9]\d{0,38}), with ASCII digits only: str.isdigit() and \d in a str
# pattern also take "²" or Arabic-Indic digits, which int() reads but Kinesis refuses.
_HASH_KEY = re.compile(r"0|[1-9][0-9]{0,38}")


def _check_hash_key(key: object) -> None:
    """Refuse a hash key Kinesis would refuse: anything but the decimal form of an integer in [0, 2**128 - 1]."""
    if not isinstance(key, str) or _HASH_KEY.fullmatch(key) is None or int(key) > MAX_HASH_KEY:
        raise ValueError(
            f"explicit_hash_key must be None or a str of ASCII digits without a leading zero, "
            f"at most 2**128 - 1, got {key!r:.100}"
        )


@dataclass(kw_only=True)
class KinesisRecord:
    """One record to put.

    Args:
        data: The record's data (a str is sent as UTF-8).
        partition_key: Picks the shard (1 to 256 characters).
        explicit_hash_key: A hash value that picks the shard instead of the partition key's hash: the decimal
            form of an integer from 0 to 2**128 - 1 (ASCII digits, no leading zero), checked here.
        stream_name: The stream; the batcher's ``stream_name`` if None.
    """

    data: bytes | str
    partition_key: str
    explicit_hash_key: str | None = None
    stream_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes | str):
            raise TypeError(f"data must be bytes or str, got {type(self.data).__name__}")
        if not isinstance(self.partition_key, str) or not 1 <= len(self.partition_key) <= 256:
            raise ValueError(f"partition_key must be a str of 1 to 256 characters, got {self.partition_key!r:.300}")
        if self.explicit_hash_key is not None:
            _check_hash_key(self.explicit_hash_key)
        if self.stream_name is not None and (not isinstance(self.stream_name, str) or not self.stream_name):
            raise ValueError(f"stream_name must be a non-empty str or None, got {self.stream_name!r}")
        if self.size > MAX_RECORD_BYTES:
            raise ValueError(f"the record's data and partition key take {self.size} bytes; the most is 1 MiB")

    @property
    def size(self) -> int:
        """The bytes Kinesis counts against its limits: data plus partition key."""
        return utf8_length(self.data) + utf8_length(self.partition_key)

    def entry(self) -> dict[str, Any]:
        """The ``PutRecords`` entry for this record."""
        data = self.data.encode("utf-8") if isinstance(self.data, str) else self.data
        entry: dict[str, Any] = {"Data": data, "PartitionKey": self.partition_key}
        if self.explicit_hash_key is not None:
            entry["ExplicitHashKey"] = self.explicit_hash_key
        return entry


@dataclass(frozen=True)
class KinesisPutResult:
    """Where Kinesis put a record."""

    shard_id: str
    sequence_number: str


class AsyncKinesisPutBatcher(TargetedBatcher[KinesisRecord, KinesisPutResult]):
    """Batches :class:`KinesisRecord` puts into Kinesis ``PutRecords`` calls (see the module docstring).

    Args:
        stream_name: The stream of the records that name none.
        max_batch_size: The most records per batch (500 by default: one call).
        **kwargs: The client settings (``region_name``, ``use_ssl``, ``verify``, ``endpoint_url``, ``config``,
            ``aioboto3_session``), ``retry`` (the backoff and attempt limit for failed records and throttling),
            all as in :class:`~async_batcher.aws.base.AwsBatcher`, and the :class:`~async_batcher.AsyncBatcher`
            settings (``max_queue_time``, ``concurrency``, ...).
    """

    service_name: ClassVar[str] = "kinesis"
    operation: ClassVar[str] = "PutRecords"
    target_attribute: ClassVar[str] = "stream_name"
    max_entries: ClassVar[int] = MAX_RECORDS_PER_CALL
    bisect_codes: ClassVar[frozenset[str]] = _BISECT_CODES

    def __init__(
        self, *, stream_name: str | None = None, max_batch_size: int = MAX_RECORDS_PER_CALL, **kwargs: Any
    ) -> None:
        super().__init__(default_target=stream_name, max_batch_size=max_batch_size, **kwargs)

    @property
    def stream_name(self) -> str | None:
        """The stream of the records that name none."""
        return self.default_target

    def max_call_bytes(self) -> int:
        return MAX_REQUEST_BYTES

    def entry_of(self, item: KinesisRecord) -> tuple[dict[str, Any], int]:
        return item.entry(), item.size

    def in_order(self, target: str) -> bool:
        """Always: one call after the other, the records of a partition key keep their order inside a batch."""
        return True

    async def call(self, entries: list[Entry], outcomes: Outcomes[KinesisPutResult]) -> list[Entry]:
        """One ``PutRecords`` call; records the records put and refused, returns those to retry."""
        response = await self.client.put_records(StreamName=entries[0].target, Records=[e.entry for e in entries])
        answers = response.get("Records") or []
        if len(answers) != len(entries):
            # Kinesis answers every record, in order; without that, none of them counts as put, and any may be.
            outcomes.may_have_applied(put.index for put in entries)
            return entries
        left: list[Entry] = []
        for put, answer in zip(entries, answers, strict=True):
            code = answer.get("ErrorCode")
            if code is None:
                outcomes.succeed(put.index, KinesisPutResult(answer["ShardId"], answer["SequenceNumber"]))
            elif code in RETRYABLE_ERROR_CODES:
                left.append(put)
            else:
                outcomes.fail(put.index, KinesisRecordError(code, answer.get("ErrorMessage", ""), sender_fault=True))
        return left
