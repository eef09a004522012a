"""Put N records into Kinesis through AsyncKinesisPutBatcher, then one PutRecord per record, and compare.

One run of ``benchmarks/aws/run.py`` (``measure``): a fresh resource, checked afterwards, then deleted.

moto numbers a shard's records without a lock: concurrent puts to one shard can get the same sequence number,
and one record then replaces the other. The batcher sends one call at a time here (``concurrency=1``, its
default), so its records all land; one ``PutRecord`` per record from many callers loses some on moto (not on
AWS), which the run reports instead of failing.
"""

from __future__ import annotations

import uuid
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig

from async_batcher.aws.kinesis import AsyncKinesisPutBatcher, KinesisRecord
from benchmarks.aws.sqs import body
from benchmarks.aws.support import ONE_CALL_PER_ITEM, Measurement, drive, mode_wait
from tools.aws import ApiCallCounter

CONFIG = AioConfig(max_pool_connections=50)


async def create_stream(client: Any) -> str:
    name = f"async-batcher-example-{uuid.uuid4().hex[:8]}"
    await client.create_stream(StreamName=name, ShardCount=1)
    await client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    return name


async def count_records(client: Any, stream: str) -> int:
    shard = (await client.list_shards(StreamName=stream))["Shards"][0]["ShardId"]
    kwargs = {"StreamName": stream, "ShardId": shard, "ShardIteratorType": "TRIM_HORIZON"}
    iterator = (await client.get_shard_iterator(**kwargs))["ShardIterator"]
    total = 0
    while True:
        page = await client.get_records(ShardIterator=iterator, Limit=10_000)
        total += len(page["Records"])
        if not page["Records"] or (page.get("MillisBehindLatest", 0) == 0 and len(page["Records"]) < 10_000):
            return total
        iterator = page["NextShardIterator"]


async def batched(endpoint: str | None, stream: str, n: int, callers: int, mode: str) -> Measurement:
    """n puts through the batcher (one call at a time), from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    batcher = AsyncKinesisPutBatcher(
        stream_name=stream, endpoint_url=endpoint, config=CONFIG, aioboto3_session=session,
        max_queue_time=mode_wait(mode),
    )  # fmt: skip
    async with batcher:
        await batcher.process(KinesisRecord(data=body("warmup", 0), partition_key="warmup"))
        counter.reset()
        seconds = await drive(
            n, callers, lambda i: batcher.process(KinesisRecord(data=body("b", i), partition_key=f"k{i % 50}"))
        )
    return Measurement("Kinesis", mode, n, callers, seconds, counter.calls["PutRecords"])


async def one_call_per_item(endpoint: str | None, stream: str, n: int, callers: int) -> Measurement:
    """n PutRecord calls on one client, from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    async with session.client("kinesis", endpoint_url=endpoint, config=CONFIG) as client:
        await client.put_record(StreamName=stream, Data=body("warmup", 1), PartitionKey="warmup")
        counter.reset()
        seconds = await drive(
            n, callers, lambda i: client.put_record(StreamName=stream, Data=body("u", i), PartitionKey=f"k{i % 50}")
        )
    return Measurement("Kinesis", ONE_CALL_PER_ITEM, n, callers, seconds, counter.calls["PutRecord"])


async def measure(endpoint: str | None, mode: str, n: int, callers: int, concurrency: int = 1) -> Measurement:
    """One run on a fresh stream, deleted afterwards; raises if the batcher's records are not all there.

    ``concurrency`` is ignored: the batcher keeps its default of one call at a time (see the module docstring).
    """
    async with aioboto3.Session().client("kinesis", endpoint_url=endpoint) as admin:
        stream = await create_stream(admin)
        try:
            if mode != ONE_CALL_PER_ITEM:
                result = await batched(endpoint, stream, n, callers, mode)
            else:
                result = await one_call_per_item(endpoint, stream, n, callers)
            stored = await count_records(admin, stream)
        finally:
            await admin.delete_stream(StreamName=stream)
    if stored < n + 1:
        message = f"{mode}: {stored} records in the stream, expected {n + 1}"
        if mode != ONE_CALL_PER_ITEM:
            raise RuntimeError(message)
        print(f"note: {message} (concurrent PutRecord calls to one shard race in moto)")
    return result
