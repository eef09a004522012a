"""Items and keys of DynamoDB: the wire format, the identity of a key, and the tables' key schemas.

The batchers take items as plain Python values (``{"pk": "a", "n": Decimal(1)}``), as the boto3 resource API
and async-batcher 0.2.2 do, and talk to the low-level client in DynamoDB's typed wire format
(``{"pk": {"S": "a"}, "n": {"N": "1"}}``). boto3's own ``TypeSerializer``/``TypeDeserializer`` convert.

A key's *identity* is what the service compares: two writes to the same identity in one ``BatchWriteItem``
(or two reads in one ``BatchGetItem``) make it refuse the whole call. Numbers are compared by value
(``"1.0"`` and ``"1"`` are one key), so their identity is a ``Decimal``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from async_batcher.aws._sdk import TypeDeserializer, TypeSerializer

WireItem = dict[str, dict[str, Any]]
"""An item (or a key) in DynamoDB's wire format: attribute name -> ``{"S": "..."}`` and the like."""

KeyIdentity = tuple[tuple[str, str, object], ...]
"""(attribute name, type, comparable value) for each key attribute, in the key schema's order."""

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def serialize_item(item: Mapping[str, Any]) -> WireItem:
    """Python values -> wire format. Raises ``TypeError`` naming the attribute whose value is not storable."""
    if not isinstance(item, Mapping):
        raise TypeError(f"a DynamoDB item must be a mapping of attribute names to values, got {item!r:.200}")
    wire: WireItem = {}
    for name, value in item.items():
        if not isinstance(name, str):
            raise TypeError(f"DynamoDB attribute names must be str, got {name!r:.100}")
        try:
            wire[name] = _serializer.serialize(value)
        except TypeError as error:
            # boto3 says "Unsupported type" or "Float types are not supported" without naming the attribute.
            raise TypeError(f"attribute {name!r}: {error}") from error
    return wire


def deserialize_item(wire: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Wire format -> Python values (numbers as ``Decimal``, binary as ``boto3...Binary``, as boto3 gives)."""
    return {name: _deserializer.deserialize(dict(value)) for name, value in wire.items()}


def key_identity(item: Mapping[str, Mapping[str, Any]], key_names: Sequence[str], table: str) -> KeyIdentity:
    """The identity of ``item``'s key (wire format) under the key attributes ``key_names``.

    Raises ``ValueError`` naming the table and attribute when a key attribute is missing or not a scalar of
    type S, N or B (the only key types DynamoDB has).
    """
    parts: list[tuple[str, str, object]] = []
    for name in key_names:
        value = item.get(name)
        if value is None:
            raise ValueError(f"item for table {table!r} lacks key attribute {name!r} (key schema: {key_names})")
        if len(value) != 1:
            raise ValueError(f"table {table!r}: key attribute {name!r} has a malformed value")
        ((type_, raw),) = value.items()
        comparable: object
        if type_ == "S":
            comparable = raw
        elif type_ == "N":
            comparable = Decimal(raw)
        elif type_ == "B":
            comparable = bytes(raw)
        else:
            raise ValueError(f"table {table!r}: key attribute {name!r} must be a string, number or binary")
        parts.append((name, type_, comparable))
    return tuple(parts)


DescribeKeys = Callable[[str], Awaitable[tuple[str, ...]]]


class KeySchemaCache:
    """The key attribute names of each table, asked once per table (``DescribeTable``) and kept.

    Concurrent batches asking for the same table share one request. A failed request is not kept: the error
    goes to the callers that were waiting, and the next batch asks again (the table may have been created
    since). ``known`` pre-fills tables whose key the user gave, which then cost no request.
    """

    def __init__(self, describe: DescribeKeys, known: Mapping[str, Sequence[str]] | None = None) -> None:
        self._describe = describe
        self._known: dict[str, tuple[str, ...]] = {}
        for table, names in (known or {}).items():
            names = tuple(names)
            if not 1 <= len(names) <= 2 or not all(isinstance(n, str) and n for n in names):
                raise ValueError(
                    f"table_keys[{table!r}] must be the partition key name and optionally the sort key name, "
                    f"got {names!r}"
                )
            self._known[table] = names
        self._pending: dict[str, asyncio.Future[tuple[str, ...]]] = {}

    async def get(self, table: str) -> tuple[str, ...]:
        """The key attribute names of ``table`` (partition key first)."""
        names = self._known.get(table)
        if names is not None:
            return names
        future = self._pending.get(table)
        if future is None:
            future = asyncio.ensure_future(self._describe(table))
            self._pending[table] = future
            future.add_done_callback(lambda done: self._settle(table, done))
        # shield: one cancelled waiter must not cancel the request the others share.
        return await asyncio.shield(future)

    def _settle(self, table: str, future: asyncio.Future[tuple[str, ...]]) -> None:
        if self._pending.get(table) is future:
            del self._pending[table]
        if not future.cancelled() and future.exception() is None:
            self._known[table] = future.result()
