"""Send N messages to SQS through AsyncSqsSendBatcher, then one SendMessage per message, and compare.

One run of ``benchmarks/aws/run.py`` (``measure``): a fresh resource, checked afterwards, then deleted.

moto's server spends time proportional to the queue's length on every message it takes (it recomputes the
queue's attributes), so a few hundred messages already show the difference in API calls; with thousands the
run measures moto more than the client. Each mode gets a fresh queue.
"""

from __future__ import annotations

import uuid
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig

from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage
from benchmarks.aws.support import ONE_CALL_PER_ITEM, Measurement, drive, mode_wait
from tools.aws import ApiCallCounter

CONFIG = AioConfig(max_pool_connections=50)


def body(run: str, index: int) -> str:
    return f'{{"run": "{run}", "index": {index}, "payload": "{"x" * 100}"}}'


async def create_queue(client: Any) -> str:
    name = f"async-batcher-example-{uuid.uuid4().hex[:8]}"
    return str((await client.create_queue(QueueName=name))["QueueUrl"])


async def count_messages(client: Any, queue_url: str) -> int:
    answer = await client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(answer["Attributes"]["ApproximateNumberOfMessages"])


async def batched(
    endpoint: str | None, queue_url: str, n: int, callers: int, concurrency: int = 4, mode: str = "batched"
) -> Measurement:
    """n sends through the batcher, from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    batcher = AsyncSqsSendBatcher(
        queue_url=queue_url,
        endpoint_url=endpoint,
        config=CONFIG,
        aioboto3_session=session,
        concurrency=concurrency,
        max_queue_time=mode_wait(mode),
    )
    async with batcher:
        await batcher.process(SqsMessage(body=body("warmup", 0)))
        counter.reset()
        seconds = await drive(n, callers, lambda i: batcher.process(SqsMessage(body=body("b", i))))
    return Measurement("SQS", mode, n, callers, seconds, counter.calls["SendMessageBatch"])


async def one_call_per_item(endpoint: str | None, queue_url: str, n: int, callers: int) -> Measurement:
    """n SendMessage calls on one client, from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    async with session.client("sqs", endpoint_url=endpoint, config=CONFIG) as client:
        await client.send_message(QueueUrl=queue_url, MessageBody=body("warmup", 1))
        counter.reset()
        seconds = await drive(n, callers, lambda i: client.send_message(QueueUrl=queue_url, MessageBody=body("u", i)))
    return Measurement("SQS", "one call per item", n, callers, seconds, counter.calls["SendMessage"])


async def measure(endpoint: str | None, mode: str, n: int, callers: int, concurrency: int = 4) -> Measurement:
    """One run on a fresh queue, deleted afterwards; raises if the queue holds fewer messages than were sent."""
    async with aioboto3.Session().client("sqs", endpoint_url=endpoint) as admin:
        queue_url = await create_queue(admin)
        try:
            if mode != ONE_CALL_PER_ITEM:
                result = await batched(endpoint, queue_url, n, callers, concurrency, mode)
            else:
                result = await one_call_per_item(endpoint, queue_url, n, callers)
            stored = await count_messages(admin, queue_url)
        finally:
            await admin.delete_queue(QueueUrl=queue_url)
    # SQS's count is approximate on AWS (exact on moto): only a local run can insist on it.
    if stored < n + 1 and endpoint is not None:  # the messages and the warm-up send
        raise RuntimeError(f"{mode}: {stored} messages in the queue, expected {n + 1}")
    return result
