"""Wire conversion, key identities, and the cached key schemas."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from async_batcher.aws.dynamodb._keys import (
    KeySchemaCache,
    deserialize_item,
    key_identity,
    serialize_item,
)


def test_round_trip() -> None:
    item = {"pk": "a", "n": Decimal("1.5"), "tags": {"x", "y"}, "nested": {"l": [1, "s", None, True]}}
    wire = serialize_item(item)
    assert wire["pk"] == {"S": "a"}
    assert wire["n"] == {"N": "1.5"}
    assert deserialize_item(wire) == item


def test_unstorable_value_names_the_attribute() -> None:
    with pytest.raises(TypeError, match="attribute 'price': Float types are not supported"):
        serialize_item({"pk": "a", "price": 1.5})


def test_non_mapping_item_is_refused() -> None:
    with pytest.raises(TypeError, match="must be a mapping"):
        serialize_item(["pk", "a"])  # type: ignore[arg-type]


def test_numbers_are_one_key_whatever_their_spelling() -> None:
    a = key_identity({"pk": {"N": "1.0"}, "other": {"S": "x"}}, ("pk",), "t")
    b = key_identity({"pk": {"N": "1"}}, ("pk",), "t")
    assert a == b
    assert hash(a) == hash(b)


def test_identity_follows_the_schema_order_and_ignores_other_attributes() -> None:
    item = {"sk": {"B": b"\x01"}, "pk": {"S": "p"}, "v": {"S": "v"}}
    assert key_identity(item, ("pk", "sk"), "t") == (("pk", "S", "p"), ("sk", "B", b"\x01"))


def test_missing_key_attribute_is_named() -> None:
    with pytest.raises(ValueError, match="item for table 'orders' lacks key attribute 'sk'"):
        key_identity({"pk": {"S": "p"}}, ("pk", "sk"), "orders")


def test_non_scalar_key_is_refused() -> None:
    with pytest.raises(ValueError, match="key attribute 'pk' must be a string, number or binary"):
        key_identity({"pk": {"L": []}}, ("pk",), "t")


async def test_schema_is_described_once_for_concurrent_batches() -> None:
    calls: list[str] = []
    release = asyncio.Event()

    async def describe(table: str) -> tuple[str, ...]:
        calls.append(table)
        await release.wait()
        return ("pk",)

    cache = KeySchemaCache(describe)
    waiters = [asyncio.ensure_future(cache.get("t")) for _ in range(5)]
    await asyncio.sleep(0)  # let them all reach the shared request
    release.set()
    assert await asyncio.gather(*waiters) == [("pk",)] * 5
    assert await cache.get("t") == ("pk",)
    assert calls == ["t"]


async def test_failed_describe_is_not_kept() -> None:
    answers: list[BaseException | tuple[str, ...]] = [LookupError("no such table"), ("pk", "sk")]

    async def describe(table: str) -> tuple[str, ...]:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    cache = KeySchemaCache(describe)
    with pytest.raises(LookupError, match="no such table"):
        await cache.get("t")
    assert await cache.get("t") == ("pk", "sk")


async def test_cancelled_waiter_does_not_cancel_the_shared_request() -> None:
    release = asyncio.Event()

    async def describe(table: str) -> tuple[str, ...]:
        await release.wait()
        return ("id",)

    cache = KeySchemaCache(describe)
    first = asyncio.ensure_future(cache.get("t"))
    second = asyncio.ensure_future(cache.get("t"))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == ("id",)
    assert first.cancelled()


async def test_known_tables_cost_no_request() -> None:
    async def describe(table: str) -> tuple[str, ...]:
        raise AssertionError("must not be called")

    assert await KeySchemaCache(describe, {"t": ["pk", "sk"]}).get("t") == ("pk", "sk")


@pytest.mark.parametrize("names", [[], ["a", "b", "c"], [""]])
def test_bad_known_schemas_are_refused(names: list[str]) -> None:
    async def describe(table: str) -> tuple[str, ...]:
        return ()

    with pytest.raises(ValueError, match=r"table_keys\['t'\] must be"):
        KeySchemaCache(describe, {"t": names})
