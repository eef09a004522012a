"""Publish N messages to SNS through AsyncSnsPublishBatcher, then one Publish per message, and compare.

One run of ``benchmarks/aws/run.py`` (``measure``): a fresh resource, checked afterwards, then deleted.
"""

from __future__ import annotations

import uuid
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig

from async_batcher.aws.sns import AsyncSnsPublishBatcher, SnsMessage
from benchmarks.aws.sqs import body, count_messages
from benchmarks.aws.support import ONE_CALL_PER_ITEM, Measurement, drive, mode_wait
from tools.aws import ApiCallCounter

CONFIG = AioConfig(max_pool_connections=50)


async def create_topic_and_queue(sns: Any, sqs: Any) -> tuple[str, str]:
    """A fresh topic with a fresh queue subscribed to it (raw delivery)."""
    name = f"async-batcher-example-{uuid.uuid4().hex[:8]}"
    topic = str((await sns.create_topic(Name=name))["TopicArn"])
    queue = str((await sqs.create_queue(QueueName=name))["QueueUrl"])
    arn = (await sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
    await sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    return topic, queue


async def batched(endpoint: str | None, topic: str, n: int, callers: int, concurrency: int, mode: str) -> Measurement:
    """n publishes through the batcher, from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    batcher = AsyncSnsPublishBatcher(
        topic_arn=topic,
        endpoint_url=endpoint,
        config=CONFIG,
        aioboto3_session=session,
        concurrency=concurrency,
        max_queue_time=mode_wait(mode),
    )
    async with batcher:
        await batcher.process(SnsMessage(message=body("warmup", 0)))
        counter.reset()
        seconds = await drive(n, callers, lambda i: batcher.process(SnsMessage(message=body("b", i))))
    return Measurement("SNS", mode, n, callers, seconds, counter.calls["PublishBatch"])


async def one_call_per_item(endpoint: str | None, topic: str, n: int, callers: int) -> Measurement:
    """n Publish calls on one client, from ``callers`` concurrent callers."""
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    async with session.client("sns", endpoint_url=endpoint, config=CONFIG) as client:
        await client.publish(TopicArn=topic, Message=body("warmup", 1))
        counter.reset()
        seconds = await drive(n, callers, lambda i: client.publish(TopicArn=topic, Message=body("u", i)))
    return Measurement("SNS", ONE_CALL_PER_ITEM, n, callers, seconds, counter.calls["Publish"])


async def measure(endpoint: str | None, mode: str, n: int, callers: int, concurrency: int = 4) -> Measurement:
    """One run on a fresh topic and queue, deleted afterwards; raises if the queue holds fewer messages."""
    session = aioboto3.Session()
    async with session.client("sns", endpoint_url=endpoint) as sns, session.client("sqs", endpoint_url=endpoint) as sqs:
        topic, queue = await create_topic_and_queue(sns, sqs)
        try:
            if mode != ONE_CALL_PER_ITEM:
                result = await batched(endpoint, topic, n, callers, concurrency, mode)
            else:
                result = await one_call_per_item(endpoint, topic, n, callers)
            stored = await count_messages(sqs, queue)
        finally:
            await sns.delete_topic(TopicArn=topic)
            await sqs.delete_queue(QueueUrl=queue)
    if stored < n + 1 and endpoint is not None:  # SQS's count is approximate on AWS, exact on moto
        raise RuntimeError(f"{mode}: {stored} messages reached the queue, expected {n + 1}")
    return result
