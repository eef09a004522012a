"""Small async helpers shared by the AWS tests: tables, queues, read-backs, and test-speed settings."""

from __future__ import annotations

import uuid
from typing import Any

from aiobotocore.config import AioConfig

from async_batcher.aws.dynamodb._keys import deserialize_item
from async_batcher.aws.retry import RetryPolicy
from tests.crash import kill_mid_run as kill_mid_run  # the AWS tests import it from here

# botocore makes one attempt per call, so the batcher's own retries are what the tests observe; short
# timeouts so that a dead server is noticed quickly.
NO_BOTOCORE_RETRY = AioConfig(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=20)

# Real backoff, but small waits: the tests do not time anything.
FAST_RETRY = RetryPolicy(max_attempts=8, base_delay=0.002, max_delay=0.02)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def create_table(client: Any, *, hash_key: str = "pk", range_key: str | None = None,
                       hash_type: str = "S", range_type: str = "N") -> str:  # fmt: skip
    """A fresh on-demand table; returns its name."""
    name = unique("table")
    key_schema = [{"AttributeName": hash_key, "KeyType": "HASH"}]
    definitions = [{"AttributeName": hash_key, "AttributeType": hash_type}]
    if range_key is not None:
        key_schema.append({"AttributeName": range_key, "KeyType": "RANGE"})
        definitions.append({"AttributeName": range_key, "AttributeType": range_type})
    await client.create_table(
        TableName=name, KeySchema=key_schema, AttributeDefinitions=definitions, BillingMode="PAY_PER_REQUEST"
    )
    return name


async def scan_all(client: Any, table: str) -> list[dict[str, Any]]:
    """Every item of ``table``, as plain values, following pagination."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = await client.scan(**kwargs)
        items.extend(deserialize_item(item) for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


async def create_queue(client: Any, *, fifo: bool = False) -> str:
    """A fresh queue; returns its URL."""
    name = unique("queue") + (".fifo" if fifo else "")
    attributes = {"FifoQueue": "true"} if fifo else {}
    return str((await client.create_queue(QueueName=name, Attributes=attributes))["QueueUrl"])


async def receive_all(client: Any, queue_url: str) -> list[dict[str, Any]]:
    """Every message in the queue, deleting them as they come (a FIFO group hands out its next message only
    once the previous one is deleted). moto answers at once: an empty receive means the queue is drained."""
    messages: list[dict[str, Any]] = []
    while True:
        answer = await client.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            VisibilityTimeout=300,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        )
        batch = answer.get("Messages", [])
        if not batch:
            return messages
        messages.extend(batch)
        await client.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(batch)],
        )


async def create_topic_to_queue(sns: Any, sqs: Any, *, fifo: bool = False) -> tuple[str, str]:
    """A fresh SNS topic with a fresh SQS queue subscribed to it (raw delivery: the queue's bodies are the
    published messages, with their attributes); returns (topic ARN, queue URL)."""
    suffix = ".fifo" if fifo else ""
    attributes = {"FifoTopic": "true"} if fifo else {}
    topic = (await sns.create_topic(Name=unique("topic") + suffix, Attributes=attributes))["TopicArn"]
    queue = await create_queue(sqs, fifo=fifo)
    arn = (await sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
    await sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    return str(topic), queue


async def create_stream(client: Any, *, shards: int = 2) -> str:
    """A fresh Kinesis stream (moto makes it active at once); returns its name."""
    name = unique("stream")
    await client.create_stream(StreamName=name, ShardCount=shards)
    return name


async def read_stream(client: Any, stream: str) -> list[tuple[str, dict[str, Any]]]:
    """Every record of ``stream`` as (shard id, record), shard by shard from the start. moto answers at once: an
    empty page means the shard is read."""
    records: list[tuple[str, dict[str, Any]]] = []
    for shard in (await client.list_shards(StreamName=stream))["Shards"]:
        shard_id = shard["ShardId"]
        iterator = (
            await client.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
        )["ShardIterator"]
        while True:
            page = await client.get_records(ShardIterator=iterator, Limit=10_000)
            if not page["Records"]:
                break
            records.extend((shard_id, record) for record in page["Records"])
            iterator = page["NextShardIterator"]
    return records
