"""Write N items to DynamoDB through AsyncDynamoDbWriteBatcher, then one PutItem per item, and compare.

One run of ``benchmarks/aws/run.py`` (``measure``): a fresh resource, checked afterwards, then deleted.
"""

from __future__ import annotations

import uuid
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig

from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher, WriteOperation
from benchmarks.aws.support import ONE_CALL_PER_ITEM, Measurement, drive, mode_wait
from tools.aws import ApiCallCounter

CONFIG = AioConfig(max_pool_connections=50)


def item(run: str, index: int) -> dict[str, Any]:
    return {"pk": f"{run}-{index}", "index": index, "payload": "x" * 100}


async def create_table(client: Any) -> str:
    name = f"async-batcher-example-{uuid.uuid4().hex[:8]}"
    await client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    await client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    return name


async def count_items(client: Any, table: str) -> int:
    total, kwargs = 0, {"TableName": table, "Select": "COUNT", "ConsistentRead": True}
    while True:
        page = await client.scan(**kwargs)
        total += page["Count"]
        if "LastEvaluatedKey" not in page:
            return total
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


async def batched(
    endpoint: str | None, table: str, n: int, callers: int, concurrency: int = 4, mode: str = "batched"
) -> Measurement:
    """n writes through the batcher, from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    batcher = AsyncDynamoDbWriteBatcher(
        endpoint_url=endpoint,
        config=CONFIG,
        aioboto3_session=session,
        concurrency=concurrency,
        max_queue_time=mode_wait(mode),
    )
    async with batcher:
        await batcher.process(WriteOperation(operation="PUT", table_name=table, data=item("warmup", 0)))
        counter.reset()
        seconds = await drive(
            n, callers, lambda i: batcher.process(WriteOperation(operation="PUT", table_name=table, data=item("b", i)))
        )
    return Measurement("DynamoDB", mode, n, callers, seconds, counter.calls["BatchWriteItem"])


async def one_call_per_item(endpoint: str | None, table: str, n: int, callers: int) -> Measurement:
    """n PutItem calls on one client, from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    async with session.resource("dynamodb", endpoint_url=endpoint, config=CONFIG) as dynamodb:
        resource_table = await dynamodb.Table(table)
        await resource_table.put_item(Item=item("warmup", 1))
        counter.reset()
        seconds = await drive(n, callers, lambda i: resource_table.put_item(Item=item("u", i)))
    return Measurement("DynamoDB", "one call per item", n, callers, seconds, counter.calls["PutItem"])


async def measure(endpoint: str | None, mode: str, n: int, callers: int, concurrency: int = 4) -> Measurement:
    """One run in a fresh table, deleted afterwards; raises if any write is missing from the table."""
    async with aioboto3.Session().client("dynamodb", endpoint_url=endpoint) as admin:
        table = await create_table(admin)
        try:
            if mode != ONE_CALL_PER_ITEM:
                result = await batched(endpoint, table, n, callers, concurrency, mode)
            else:
                result = await one_call_per_item(endpoint, table, n, callers)
            stored = await count_items(admin, table)
        finally:
            await admin.delete_table(TableName=table)
    if stored != n + 1:  # the items and the warm-up write
        raise RuntimeError(f"{mode}: {stored} items in the table, expected {n + 1}")
    return result
