"""AsyncDynamoDbGetBatcher against moto's server and DynamoDB Local (the ``dynamodb`` fixture), with UnprocessedKeys
and throttling injected by a proxy. Only DynamoDB Local checks the type of a key."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError

from async_batcher.aws.dynamodb._keys import serialize_item
from async_batcher.aws.dynamodb.get import AsyncDynamoDbGetBatcher, GetItem
from async_batcher.aws.errors import RetriesExhaustedError
from tests.aws.faultproxy import FaultProxy, Reply, Withhold, first_calls
from tests.aws.helpers import FAST_RETRY, NO_BOTOCORE_RETRY, create_table
from tools.aws import ApiCallCounter, DynamoDBLocal
from tools.servers import LocalServer


def reader(endpoint: str, session: aioboto3.Session | None = None, **kwargs: Any) -> AsyncDynamoDbGetBatcher:
    kwargs.setdefault("retry", FAST_RETRY)
    return AsyncDynamoDbGetBatcher(
        endpoint_url=endpoint, config=NO_BOTOCORE_RETRY, aioboto3_session=session or aioboto3.Session(), **kwargs
    )


async def fill(admin: Any, table: str, items: list[dict[str, Any]]) -> None:
    for start in range(0, len(items), 25):
        requests = [{"PutRequest": {"Item": serialize_item(item)}} for item in items[start : start + 25]]
        answer = await admin.batch_write_item(RequestItems={table: requests})
        assert not answer.get("UnprocessedItems")


async def test_reads_return_each_caller_its_item_or_none(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin, range_key="sk")
        other = await create_table(admin, hash_type="N")
        await fill(admin, table, [{"pk": f"p{i % 5}", "sk": i, "v": f"value{i}"} for i in range(120)])
        await fill(admin, other, [{"pk": i, "tags": {"a", "b"}} for i in range(30)])
        gets = [GetItem(table_name=table, key={"pk": f"p{i % 5}", "sk": i}) for i in range(140)]
        gets += [GetItem(table_name=other, key={"pk": i}) for i in range(25, 35)]
        async with reader(dynamodb.endpoint_url, session, max_batch_size=100, concurrency=2) as batcher:
            results = await asyncio.gather(*(batcher.process(get) for get in gets))
    for get, result in zip(gets, results, strict=True):
        if get.table_name == table:
            sk = get.key["sk"]
            assert result == ({"pk": f"p{sk % 5}", "sk": Decimal(sk), "v": f"value{sk}"} if sk < 120 else None)
        else:
            assert result == ({"pk": Decimal(get.key["pk"]), "tags": {"a", "b"}} if get.key["pk"] < 30 else None)
    calls = counter.params["BatchGetItem"]
    assert all(sum(len(spec["Keys"]) for spec in params["RequestItems"].values()) <= 100 for params in calls)
    assert sum(len(spec["Keys"]) for params in calls for spec in params["RequestItems"].values()) == 150


async def test_duplicate_keys_share_one_read(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin, hash_type="N")
        await fill(admin, table, [{"pk": 1, "v": "one"}, {"pk": 2, "v": "two"}])
        gets = [GetItem(table_name=table, key={"pk": key}) for key in (1, Decimal("1.0"), 2, 1, 3, 3)]
        async with reader(dynamodb.endpoint_url, session) as batcher:
            results = await batcher.process_many(gets)
    one = {"pk": Decimal(1), "v": "one"}
    assert results == [one, one, {"pk": Decimal(2), "v": "two"}, one, None, None]
    assert results[0] is not results[1]  # each caller gets its own dict
    (params,) = counter.params["BatchGetItem"]
    assert len(params["RequestItems"][table]["Keys"]) == 3


async def test_unprocessed_keys_are_retried(dynamodb: LocalServer) -> None:
    async with (
        FaultProxy(dynamodb.endpoint_url) as proxy,
        aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin,
    ):
        table = await create_table(admin)
        await fill(admin, table, [{"pk": f"k{i}", "n": i} for i in range(150)])
        proxy.rules.append(first_calls("BatchGetItem", 6, Withhold(range(0, 100, 2))))
        async with reader(proxy.url) as batcher:
            results = await asyncio.gather(
                *(batcher.process(GetItem(table_name=table, key={"pk": f"k{i}"})) for i in range(160))
            )
    assert results == [{"pk": f"k{i}", "n": Decimal(i)} if i < 150 else None for i in range(160)]
    assert len(proxy.calls("BatchGetItem")) > 2


async def test_throttled_reads_are_retried_and_then_fail_clearly(dynamodb: LocalServer) -> None:
    async with (
        FaultProxy(dynamodb.endpoint_url) as proxy,
        aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin,
    ):
        table = await create_table(admin)
        await fill(admin, table, [{"pk": "a"}])
        proxy.rules.append(first_calls("BatchGetItem", 3, Reply("ProvisionedThroughputExceededException")))
        async with reader(proxy.url) as batcher:
            assert await batcher.process(GetItem(table_name=table, key={"pk": "a"})) == {"pk": "a"}
            proxy.rules.append(first_calls("BatchGetItem", 10_000, Withhold([0])))
            with pytest.raises(RetriesExhaustedError, match="BatchGetItem: item still left unprocessed"):
                await batcher.process(GetItem(table_name=table, key={"pk": "a"}))


async def test_an_invalid_key_fails_only_its_caller(dynamodb_local: DynamoDBLocal) -> None:
    async with aioboto3.Session().client("dynamodb", endpoint_url=dynamodb_local.endpoint_url) as admin:
        table = await create_table(admin)
        await fill(admin, table, [{"pk": f"k{i}"} for i in range(10)])
        gets = [GetItem(table_name=table, key={"pk": f"k{i}"}) for i in range(10)]
        gets[4] = GetItem(table_name=table, key={"pk": "k4", "not_a_key": 1})
        gets.append(GetItem(table_name="missing-table", key={"pk": "x"}))
        async with reader(dynamodb_local.endpoint_url) as batcher:
            results = await asyncio.gather(*(batcher.process(get) for get in gets), return_exceptions=True)
    assert isinstance(results[4], ClientError)
    assert results[4].response["Error"]["Code"] == "ValidationException"
    assert isinstance(results[10], ClientError)
    assert results[10].response["Error"]["Code"] == "ResourceNotFoundException"
    assert [r for i, r in enumerate(results) if i not in (4, 10)] == [{"pk": f"k{i}"} for i in range(10) if i != 4]


def test_reads_are_validated_eagerly() -> None:
    with pytest.raises(TypeError, match="key must be a non-empty dict"):
        GetItem(table_name="t", key={})
    with pytest.raises(ValueError, match="table_name must be a non-empty str, got None"):
        GetItem(table_name=None, key={"pk": 1})  # type: ignore[arg-type]
