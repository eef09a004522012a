"""Batch DynamoDB puts and deletes into ``BatchWriteItem`` calls, without ever losing a write silently.

Each caller's ``await batcher.process(WriteOperation(...))`` returns None once the service has applied the
write, or raises:

* the service's own error (botocore ``ClientError``) when it refused that write: a ``ValidationException``
  caused by this item (the call is bisected so the other callers' writes still land), or the table's
  ``DescribeTable`` failing (no such table);
* :class:`~async_batcher.aws.errors.RetriesExhaustedError` when the service kept it unprocessed or kept
  throttling for ``retry.max_attempts`` calls; the write was not applied;
* ``TypeError`` / ``ValueError`` naming the attribute, for an item that cannot be stored (a float, a missing
  key attribute);
* :class:`~async_batcher.aws.errors.AwsOutcomeUnknownError` when the service may or may not have applied it: the
  connection was lost or timed out after the request may have left, or the batcher gave up after a call that
  answered 5xx; :class:`~async_batcher.aws.errors.AbandonedBatchError` when a stop cut its batch off while some
  of it may have been applied (``outcome_of(item)`` says what became of each item);
* the transport error when the connection could not be opened (refused, DNS, connect timeout), even after
  botocore's retries, or its call was never made because an earlier call of the batch got no answer: the
  write was not applied.

How a batch becomes calls:

1. The key schema of each table is read once (``DescribeTable``, cached; or given as ``table_keys``).
2. **Several writes to one key** in a batch are sent in *rounds*: the n-th write to each key goes in round n,
   and round n+1 is sent only when round n is done. The service refuses a call that touches a key twice,
   and this keeps every write (each caller gets its own outcome) and their order: the last one submitted is
   the one that stays.
3. Each round is cut into calls of at most 25 requests and ``max_request_bytes`` of JSON (16 MB is the
   service's cap), several tables per call; the calls of a round run concurrently.
4. ``UnprocessedItems`` and throttling errors (``ProvisionedThroughputExceededException``,
   ``ThrottlingException``, ``RequestLimitExceeded``, ``InternalServerError`` and any 5xx) are retried with
   exponential backoff and full jitter (:class:`~async_batcher.aws.retry.RetryPolicy`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from async_batcher.aws._chunking import chunk, json_size, split_rounds
from async_batcher.aws._delivery import Outcomes, Splitter, splitter
from async_batcher.aws.base import AwsBatcher
from async_batcher.aws.dynamodb._keys import KeyIdentity, KeySchemaCache, WireItem, key_identity, serialize_item

__all__ = ["MAX_ITEMS_PER_CALL", "MAX_REQUEST_BYTES", "AsyncDynamoDbWriteBatcher", "WriteOperation"]

logger = logging.getLogger("async_batcher.aws")

MAX_ITEMS_PER_CALL = 25
"""The most put and delete requests ``BatchWriteItem`` takes in one call."""

MAX_REQUEST_BYTES = 16 * 1024 * 1024
"""The most bytes ``BatchWriteItem`` takes in one call (items are also capped at 400 KB each)."""

# What a single bad item can make the service refuse a whole BatchWriteItem call with.
# A call is refused whole for one bad item (bisect to find it) or one missing table (split by table).
_SPLIT: Splitter[_Write] = splitter(
    bisect_codes={"ValidationException", "SerializationException"},
    group_codes={"ResourceNotFoundException"},
    group_of=lambda entry: entry.table,
)

# Room left under max_request_bytes for the JSON around the requests ({"RequestItems": {"table": [...]}}).
_ENVELOPE_BYTES = 64 * 1024


@dataclass(kw_only=True)
class WriteOperation:
    """One write: ``operation="PUT"`` stores ``data`` as the item; ``"DELETE"`` deletes the item whose key is
    ``data``. Values are plain Python values, as boto3's resource API takes them (numbers as int or Decimal).
    """

    operation: Literal["PUT", "DELETE"]
    table_name: str
    data: dict[str, Any]

    def __post_init__(self) -> None:
        if self.operation not in ("PUT", "DELETE"):
            raise ValueError(f"operation must be 'PUT' or 'DELETE', got {self.operation!r}")
        if not isinstance(self.table_name, str) or not self.table_name:
            raise ValueError(f"table_name must be a non-empty str, got {self.table_name!r}")
        if not isinstance(self.data, Mapping):
            raise TypeError(f"data must be a dict of attribute names to values, got {type(self.data).__name__}")


@dataclass(eq=False)
class _Write:
    """A write on its way: where its outcome goes, and its request in wire format."""

    index: int
    table: str
    request: dict[str, Any]
    key: KeyIdentity
    key_names: tuple[str, ...]
    size: int = field(default=0)


class AsyncDynamoDbWriteBatcher(AwsBatcher[WriteOperation, None]):
    """Batches :class:`WriteOperation` items into DynamoDB ``BatchWriteItem`` calls (see the module docstring).

    Args:
        max_batch_size: The most writes per batch (25 by default: one call). Larger batches are cut into
            calls of 25 that run concurrently.
        table_keys: Key attribute names per table (``{"orders": ["pk", "sk"]}``): tables listed here need no
            ``DescribeTable`` permission or call.
        max_request_bytes: The most JSON bytes per call (default and cap: 16 MB).
        **kwargs: The client settings of async-batcher 0.2.2 (``region_name``, ``use_ssl``, ``verify``,
            ``endpoint_url``, ``config``, ``aioboto3_session``), ``retry`` (the backoff and attempt limit for
            throttling and ``UnprocessedItems``), all as in :class:`~async_batcher.aws.base.AwsBatcher`, and
            the :class:`~async_batcher.AsyncBatcher` settings (``max_queue_time``, ``concurrency``, ...).
    """

    service_name: ClassVar[str] = "dynamodb"

    def __init__(
        self,
        *,
        max_batch_size: int = MAX_ITEMS_PER_CALL,
        table_keys: Mapping[str, Sequence[str]] | None = None,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, **kwargs)
        if not isinstance(max_request_bytes, int) or not 1 <= max_request_bytes <= MAX_REQUEST_BYTES:
            raise ValueError(f"max_request_bytes must be an int in [1, {MAX_REQUEST_BYTES}], got {max_request_bytes!r}")
        self.max_request_bytes = max_request_bytes
        self._key_schemas = KeySchemaCache(self._describe_keys, table_keys)

    async def _describe_keys(self, table: str) -> tuple[str, ...]:
        response = await self.client.describe_table(TableName=table)
        schema = response["Table"]["KeySchema"]
        # The partition (HASH) key first, then the sort (RANGE) key.
        ordered = sorted(schema, key=lambda element: element["KeyType"] != "HASH")
        return tuple(element["AttributeName"] for element in ordered)

    async def process_batch(self, batch: list[WriteOperation]) -> list[Exception | None]:
        outcomes: Outcomes[None] = self._outcomes(len(batch), "BatchWriteItem")
        with self._tracking(batch, outcomes):
            writes = await self._prepare(batch, outcomes)

            async def send(call: list[_Write]) -> list[_Write]:
                left = await self._call(call, outcomes)
                kept = {id(write) for write in left}
                for write in call:
                    if id(write) not in kept:
                        outcomes.succeed(write.index, None)
                return left

            delivery = self._delivery(
                "BatchWriteItem",
                send,
                lambda write, error: outcomes.fail(write.index, error),
                _SPLIT,
                outcomes,
                indices_of=lambda write: (write.index,),
            )
            budget = max(1, self.max_request_bytes - _ENVELOPE_BYTES)
            for round_ in split_rounds(writes, key_of=lambda write: (write.table, write.key)):
                calls = chunk(round_, max_count=MAX_ITEMS_PER_CALL, max_bytes=budget, size_of=lambda write: write.size)
                if not await self._run_calls(delivery, calls, outcomes):
                    break  # the service does not answer: the later rounds, never sent, get its error
            return outcomes.results()

    async def _prepare(self, batch: list[WriteOperation], outcomes: Outcomes[None]) -> list[_Write]:
        """Convert each operation to its wire request; record an error for those that cannot be sent."""
        tables = list(dict.fromkeys(operation.table_name for operation in batch))
        schemas = await asyncio.gather(*(self._key_schemas.get(table) for table in tables), return_exceptions=True)
        key_names: dict[str, tuple[str, ...] | BaseException] = dict(zip(tables, schemas, strict=True))
        writes: list[_Write] = []
        for index, operation in enumerate(batch):
            names = key_names[operation.table_name]
            if isinstance(names, BaseException):
                if not isinstance(names, Exception):
                    raise names
                outcomes.fail(index, names)
                continue
            try:
                wire: WireItem = serialize_item(operation.data)
                key = key_identity(wire, names, operation.table_name)
            except (TypeError, ValueError) as error:
                outcomes.fail(index, error)
                continue
            if operation.operation == "PUT":
                request: dict[str, Any] = {"PutRequest": {"Item": wire}}
            else:
                request = {"DeleteRequest": {"Key": {name: wire[name] for name in names}}}
            writes.append(_Write(index, operation.table_name, request, key, names, json_size(request)))
        return writes

    async def _call(self, writes: list[_Write], outcomes: Outcomes[None]) -> list[_Write]:
        """One ``BatchWriteItem`` call; returns the writes the service left unprocessed."""
        request_items: dict[str, list[dict[str, Any]]] = {}
        for write in writes:
            request_items.setdefault(write.table, []).append(write.request)
        response = await self.client.batch_write_item(RequestItems=request_items)
        unprocessed: dict[str, list[dict[str, Any]]] = response.get("UnprocessedItems") or {}
        if not unprocessed:
            return []
        # Inside a round each (table, key) appears once, so the key tells which write came back.
        by_key = {(write.table, write.key): write for write in writes}
        names_of = {write.table: write.key_names for write in writes}
        left: list[_Write] = []
        for table, requests in unprocessed.items():
            for request in requests:
                wire = (request.get("PutRequest") or {}).get("Item") or (request.get("DeleteRequest") or {}).get("Key")
                try:
                    left.append(by_key[(table, key_identity(wire or {}, names_of[table], table))])
                except (KeyError, ValueError):
                    # Not one of ours: we cannot tell which write it is, so none counts as done, and any of them
                    # may have been.
                    logger.error("%s: unrecognised UnprocessedItems entry for %r; retrying the call", self.name, table)
                    outcomes.may_have_applied(write.index for write in writes)
                    return writes
        return left
