"""Batch DynamoDB reads into ``BatchGetItem`` calls.

Each caller's ``await batcher.process(GetItem(table_name=..., key=...))`` returns the item as a dict of plain
Python values (numbers as ``Decimal``, as boto3's resource API gives them), or None when there is no such
item. It raises the service's error when the service refused that key (a ``ValidationException`` isolated by
bisection, a missing table), :class:`~async_batcher.aws.errors.RetriesExhaustedError` when the key stayed
in ``UnprocessedKeys`` (or the table kept throttling or failing) for ``retry.max_attempts`` calls, or the
transport error when the service did not answer. A read has no effect, so none of these is "unknown": a stop
that cuts a batch off gives its callers the plain :class:`~async_batcher.BatcherStoppedError`, and any of them
may simply read again.

* Several callers asking for the same key in one batch share one read (the service refuses a call that
  names a key twice) and each gets the item.
* Calls carry at most 100 keys, from any number of tables. When the answer would pass the service's 16 MB
  cap, the service itself returns the rest as ``UnprocessedKeys``, which are retried like throttling, with
  exponential backoff and full jitter.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from async_batcher.aws._delivery import Outcomes, Splitter, splitter
from async_batcher.aws.base import AwsBatcher
from async_batcher.aws.dynamodb._keys import KeyIdentity, WireItem, deserialize_item, key_identity, serialize_item

__all__ = ["MAX_KEYS_PER_CALL", "AsyncDynamoDbGetBatcher", "GetItem"]

logger = logging.getLogger("async_batcher.aws")

MAX_KEYS_PER_CALL = 100
"""The most keys ``BatchGetItem`` takes in one call."""

# A call is refused whole for one bad item (bisect to find it) or one missing table (split by table).
_SPLIT: Splitter[_Read] = splitter(
    bisect_codes={"ValidationException", "SerializationException"},
    group_codes={"ResourceNotFoundException"},
    group_of=lambda entry: entry.table,
)


@dataclass(kw_only=True)
class GetItem:
    """One read: the item of ``table_name`` whose key is ``key`` (plain Python values)."""

    table_name: str
    key: dict[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.table_name, str) or not self.table_name:
            raise ValueError(f"table_name must be a non-empty str, got {self.table_name!r}")
        if not isinstance(self.key, Mapping) or not self.key:
            raise TypeError(f"key must be a non-empty dict of key attribute names to values, got {self.key!r:.200}")


@dataclass(eq=False)
class _Read:
    """One distinct key on its way, and the callers waiting for it."""

    table: str
    key: WireItem
    identity: KeyIdentity
    indices: list[int] = field(default_factory=list)


class AsyncDynamoDbGetBatcher(AwsBatcher[GetItem, "dict[str, Any] | None"]):
    """Batches :class:`GetItem` reads into DynamoDB ``BatchGetItem`` calls (see the module docstring).

    Args:
        max_batch_size: The most reads per batch (100 by default: one call). Larger batches are cut into
            calls of 100 that run concurrently.
        consistent_read: Use strongly consistent reads.
        **kwargs: The client settings of async-batcher 0.2.2 (``region_name``, ``use_ssl``, ``verify``,
            ``endpoint_url``, ``config``, ``aioboto3_session``), ``retry`` (the backoff and attempt limit for
            throttling and ``UnprocessedKeys``), all as in :class:`~async_batcher.aws.base.AwsBatcher`, and
            the :class:`~async_batcher.AsyncBatcher` settings (``max_queue_time``, ``concurrency``, ...).
    """

    service_name: ClassVar[str] = "dynamodb"
    # A read changes nothing: a stop gives its callers the plain BatcherStoppedError (read again), a lost
    # connection the transport error, as neither can have done anything twice.
    has_effects: ClassVar[bool] = False

    def __init__(
        self, *, max_batch_size: int = MAX_KEYS_PER_CALL, consistent_read: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, **kwargs)
        self.consistent_read = bool(consistent_read)

    async def process_batch(self, batch: list[GetItem]) -> list[dict[str, Any] | Exception | None]:
        outcomes: Outcomes[dict[str, Any] | None] = self._outcomes(len(batch), "BatchGetItem")
        reads = self._prepare(batch, outcomes)

        async def send(call: list[_Read]) -> list[_Read]:
            found, left = await self._call(call)
            kept = {id(read) for read in left}
            for read in call:
                if id(read) not in kept:
                    item = found.get(id(read))
                    for index in read.indices:
                        # Each caller gets its own dict: one caller mutating it must not change another's.
                        outcomes.succeed(index, None if item is None else deserialize_item(item))
            return left

        def fail(read: _Read, error: Exception) -> None:
            for index in read.indices:
                outcomes.fail(index, error)

        delivery = self._delivery("BatchGetItem", send, fail, _SPLIT, outcomes, indices_of=lambda read: read.indices)
        calls = [reads[start : start + MAX_KEYS_PER_CALL] for start in range(0, len(reads), MAX_KEYS_PER_CALL)]
        await self._run_calls(delivery, calls, outcomes)
        return outcomes.results()

    @staticmethod
    def _prepare(batch: list[GetItem], outcomes: Outcomes[dict[str, Any] | None]) -> list[_Read]:
        """One :class:`_Read` per distinct (table, key); record an error for keys that cannot be sent."""
        reads: dict[tuple[str, KeyIdentity], _Read] = {}
        for index, get in enumerate(batch):
            try:
                wire = serialize_item(get.key)
                identity = key_identity(wire, sorted(wire), get.table_name)
            except (TypeError, ValueError) as error:
                outcomes.fail(index, error)
                continue
            read = reads.get((get.table_name, identity))
            if read is None:
                read = reads[(get.table_name, identity)] = _Read(get.table_name, wire, identity)
            read.indices.append(index)
        return list(reads.values())

    async def _call(self, reads: list[_Read]) -> tuple[dict[int, WireItem], list[_Read]]:
        """One ``BatchGetItem`` call: the items found (by ``id`` of their read) and the reads left unprocessed."""
        request_items: dict[str, dict[str, Any]] = {}
        for read in reads:
            spec = request_items.setdefault(read.table, {"Keys": [], "ConsistentRead": self.consistent_read})
            spec["Keys"].append(read.key)
        response = await self.client.batch_get_item(RequestItems=request_items)
        by_identity = {(read.table, read.identity): read for read in reads}
        # The key attribute names of each table, as the callers spelt them (the service checked them).
        names_of: dict[str, set[tuple[str, ...]]] = {}
        for read in reads:
            names_of.setdefault(read.table, set()).add(tuple(sorted(read.key)))

        def find(table: str, wire: WireItem) -> _Read | None:
            for names in names_of.get(table, ()):
                try:
                    read = by_identity.get((table, key_identity(wire, names, table)))
                except ValueError:
                    continue
                if read is not None:
                    return read
            return None

        found: dict[int, WireItem] = {}
        for table, items in (response.get("Responses") or {}).items():
            for item in items:
                asked = find(table, item)
                if asked is None:
                    logger.error("%s: BatchGetItem returned an item of %r that was not asked for", self.name, table)
                    continue
                found[id(asked)] = item
        left: list[_Read] = []
        for table, spec in (response.get("UnprocessedKeys") or {}).items():
            for key in spec.get("Keys", ()):
                unanswered = find(table, key)
                if unanswered is None:
                    # Not one of ours: we cannot tell which key it is, so none counts as answered.
                    logger.error("%s: unrecognised UnprocessedKeys entry for %r; retrying the call", self.name, table)
                    return {}, reads
                left.append(unanswered)
        return found, left
