"""AsyncSnsPublishBatcher against moto's server, with Failed entries and throttling injected by a proxy.

Each topic has an SQS queue subscribed to it (raw delivery), and every test receives the queues back: a message
whose caller got a message id is there exactly once, and one whose caller got an error is not there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError

from async_batcher.aws.errors import RetriesExhaustedError, SnsEntryError
from async_batcher.aws.retry import RetryPolicy
from async_batcher.aws.sns import AsyncSnsPublishBatcher, SnsMessage
from async_batcher.aws.sns.publish import MAX_BATCH_BYTES, message_size
from tests.aws.faultproxy import FaultProxy, Reply, Withhold, first_calls
from tests.aws.helpers import FAST_RETRY, NO_BOTOCORE_RETRY, create_topic_to_queue, kill_mid_run, receive_all
from tools.aws import ApiCallCounter, MotoServer

pytestmark = pytest.mark.single_loop


def publisher(endpoint: str, session: aioboto3.Session | None = None, **kwargs: Any) -> AsyncSnsPublishBatcher:
    kwargs.setdefault("retry", FAST_RETRY)
    kwargs.setdefault("config", NO_BOTOCORE_RETRY)
    return AsyncSnsPublishBatcher(endpoint_url=endpoint, aioboto3_session=session or aioboto3.Session(), **kwargs)


@contextlib.asynccontextmanager
async def clients(endpoint: str) -> AsyncIterator[tuple[Any, Any]]:
    session = aioboto3.Session()
    async with session.client("sns", endpoint_url=endpoint) as sns, session.client("sqs", endpoint_url=endpoint) as sqs:
        yield sns, sqs


def by_message(received: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """message -> the SQS message that carried it, checking that none arrived twice."""
    counts = collections.Counter(m["Body"] for m in received)
    assert not [body for body, n in counts.items() if n > 1], "a message was delivered more than once"
    return {m["Body"]: m for m in received}


async def test_publishes_to_two_topics_all_arrive(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with clients(moto_server.endpoint_url) as (sns, sqs):
        (first, first_queue), (second, second_queue) = [await create_topic_to_queue(sns, sqs) for _ in range(2)]
        messages = [SnsMessage(topic_arn=(first, second)[i % 3 == 0], message=f"m{i}") for i in range(120)]
        async with publisher(moto_server.endpoint_url, session, topic_arn=first, concurrency=3) as batcher:
            ids = await asyncio.gather(*(batcher.process(m) for m in messages[:100]))
            ids += await batcher.process_batch(batch=messages[100:])  # a batch that mixes topics is split
        received = by_message(await receive_all(sqs, first_queue)) | by_message(await receive_all(sqs, second_queue))
    assert set(received) == {m.message for m in messages}
    assert len(set(ids)) == 120 and all(isinstance(i, str) for i in ids)
    calls = counter.params["PublishBatch"]
    assert all(len(params["PublishBatchRequestEntries"]) <= 10 for params in calls)
    assert sum(len(params["PublishBatchRequestEntries"]) for params in calls) == 120
    for params in calls:  # each call's messages belong to the topic it names
        bodies = {entry["Message"] for entry in params["PublishBatchRequestEntries"]}
        assert all((int(b[1:]) % 3 == 0) == (params["TopicArn"] == second) for b in bodies)


async def test_calls_respect_the_payload_cap(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with clients(moto_server.endpoint_url) as (sns, sqs):
        topic, queue = await create_topic_to_queue(sns, sqs)
        attributes = {"kind": {"DataType": "String", "StringValue": "big"}}
        messages = [SnsMessage(message=f"{i:04d}" + "x" * 100_000, attributes=attributes) for i in range(8)]
        async with publisher(moto_server.endpoint_url, session, topic_arn=topic) as batcher:
            await batcher.process_many(messages)
        assert len(await receive_all(sqs, queue)) == 8
    calls = counter.params["PublishBatch"]
    assert len(calls) == 4  # two ~100 KB messages per call under 256 KiB
    for params in calls:
        entries = params["PublishBatchRequestEntries"]
        size = sum(message_size(SnsMessage(message=e["Message"], attributes=e["MessageAttributes"])) for e in entries)
        assert size <= MAX_BATCH_BYTES


async def test_failed_entries_that_are_not_the_senders_fault_are_retried(moto_server: MotoServer) -> None:
    async with FaultProxy(moto_server.endpoint_url) as proxy, clients(moto_server.endpoint_url) as (sns, sqs):
        topic, queue = await create_topic_to_queue(sns, sqs)
        entries = "PublishBatchRequestEntries"
        proxy.rules.append(
            first_calls("PublishBatch", 12, lambda body: Withhold([i for i in (0, 3, 7) if i < len(body[entries]) - 1]))
        )
        async with publisher(proxy.url, topic_arn=topic, concurrency=2) as batcher:
            ids = await asyncio.gather(*(batcher.process(SnsMessage(message=f"m{i}")) for i in range(80)))
        received = by_message(await receive_all(sqs, queue))
    assert set(received) == {f"m{i}" for i in range(80)}
    assert len(set(ids)) == 80
    assert sum(len(body[entries]) for op, body in proxy.forwarded if op == "PublishBatch") == 80
    assert sum(len(body[entries]) for body in proxy.calls("PublishBatch")) > 80


async def test_a_message_at_fault_fails_only_its_caller(moto_server: MotoServer) -> None:
    def refuse_bad(operation: str, body: dict[str, Any]) -> Withhold | None:
        if operation != "PublishBatch":
            return None
        entries = body["PublishBatchRequestEntries"]
        bad = [i for i, entry in enumerate(entries) if entry["Message"].startswith("bad")]
        return Withhold(bad, code="InvalidParameter", sender_fault=True)

    async with FaultProxy(moto_server.endpoint_url) as proxy, clients(moto_server.endpoint_url) as (sns, sqs):
        topic, queue = await create_topic_to_queue(sns, sqs)
        proxy.rules.append(refuse_bad)
        bodies = [f"bad{i}" if i % 7 == 3 else f"ok{i}" for i in range(30)]
        async with publisher(proxy.url, topic_arn=topic) as batcher:
            results = await asyncio.gather(
                *(batcher.process(SnsMessage(message=b)) for b in bodies), return_exceptions=True
            )
        received = by_message(await receive_all(sqs, queue))
    for body, result in zip(bodies, results, strict=True):
        if body.startswith("bad"):
            assert isinstance(result, SnsEntryError)
            assert (result.code, result.sender_fault) == ("InvalidParameter", True)
        else:
            assert isinstance(result, str)
    assert set(received) == {b for b in bodies if b.startswith("ok")}
    assert len(proxy.calls("PublishBatch")) == 3  # refused entries are not retried


@pytest.mark.parametrize(("code", "status"), [("Throttled", 429), ("ThrottlingException", 400), ("InternalError", 500)])
async def test_throttled_calls_are_retried(moto_server: MotoServer, code: str, status: int) -> None:
    async with FaultProxy(moto_server.endpoint_url) as proxy, clients(moto_server.endpoint_url) as (sns, sqs):
        topic, queue = await create_topic_to_queue(sns, sqs)
        proxy.rules.append(first_calls("PublishBatch", 3, Reply(code, status)))
        async with publisher(proxy.url, topic_arn=topic) as batcher:
            await batcher.process_many([SnsMessage(message=f"m{i}") for i in range(10)])
        assert set(by_message(await receive_all(sqs, queue))) == {f"m{i}" for i in range(10)}
    assert len(proxy.calls("PublishBatch")) == 4


async def test_a_message_sns_keeps_failing_gets_retries_exhausted(moto_server: MotoServer) -> None:
    async with FaultProxy(moto_server.endpoint_url) as proxy, clients(moto_server.endpoint_url) as (sns, sqs):
        topic, queue = await create_topic_to_queue(sns, sqs)
        proxy.rules.append(first_calls("PublishBatch", 10_000, Withhold([0], code="InternalError")))
        async with publisher(proxy.url, topic_arn=topic) as batcher:
            with pytest.raises(RetriesExhaustedError, match="PublishBatch: item still left unprocessed"):
                await batcher.process(SnsMessage(message="never"))
        assert await receive_all(sqs, queue) == []
    assert len(proxy.calls("PublishBatch")) == FAST_RETRY.max_attempts


async def test_fifo_fields_reach_sns_and_bad_messages_fail_alone(moto_server: MotoServer) -> None:
    async with clients(moto_server.endpoint_url) as (sns, sqs):
        fifo, fifo_queue = await create_topic_to_queue(sns, sqs, fifo=True)
        messages = [
            SnsMessage(message=f"g{i % 2}-{i}", group_id=f"g{i % 2}", deduplication_id=f"d{i}",
                       attributes={"n": {"DataType": "Number", "StringValue": str(i)}})
            for i in range(14)
        ]  # fmt: skip
        messages.insert(5, SnsMessage(message="no group id"))  # SNS refuses the whole call: bisected
        messages.append(SnsMessage(topic_arn=fifo + "-missing", message="lost", group_id="g"))
        async with publisher(moto_server.endpoint_url, topic_arn=fifo, max_batch_size=20) as batcher:
            results = await asyncio.gather(*(batcher.process(m) for m in messages), return_exceptions=True)
        received = await receive_all(sqs, fifo_queue)
    assert isinstance(results[5], ClientError)
    assert results[5].response["Error"]["Code"] == "InvalidParameter"
    assert isinstance(results[-1], ClientError)
    assert results[-1].response["Error"]["Code"] == "NotFound"
    assert all(isinstance(r, str) for i, r in enumerate(results) if i not in (5, len(results) - 1))
    for group in ("g0", "g1"):  # each group in order
        bodies = [m["Body"] for m in received if m["Body"].startswith(group)]
        assert bodies == [f"{group}-{i}" for i in range(14) if f"g{i % 2}" == group]
    for message in received:
        i = int(message["Body"].split("-")[1])
        assert message["MessageAttributes"]["n"]["StringValue"] == str(i)
        assert message["Attributes"]["MessageGroupId"] == f"g{i % 2}"


async def test_a_message_without_a_topic_fails_alone(moto_server: MotoServer) -> None:
    async with clients(moto_server.endpoint_url) as (sns, sqs):
        topic, queue = await create_topic_to_queue(sns, sqs)
        async with publisher(moto_server.endpoint_url) as batcher:
            results = await asyncio.gather(
                batcher.process(SnsMessage(message="nowhere")),
                batcher.process(SnsMessage(topic_arn=topic, message="somewhere", subject="hi")),
                return_exceptions=True,
            )
        assert isinstance(results[0], ValueError)
        assert "names no topic_arn" in str(results[0])
        assert set(by_message(await receive_all(sqs, queue))) == {"somewhere"}


def test_messages_and_settings_are_validated_eagerly() -> None:
    with pytest.raises(ValueError, match="message must be a non-empty str"):
        SnsMessage(message="")
    with pytest.raises(ValueError, match="group_id must be a non-empty str or None"):
        SnsMessage(message="x", group_id="")
    with pytest.raises(ValueError, match="message attribute 'a' must be a mapping with a 'DataType'"):
        SnsMessage(message="x", attributes={"a": {"StringValue": "1"}})
    with pytest.raises(ValueError, match="topic_arn must be a non-empty str or None"):
        AsyncSnsPublishBatcher(topic_arn="")
    batcher = AsyncSnsPublishBatcher(topic_arn="arn:default")
    assert batcher.batch_key(SnsMessage(message="x")) == "arn:default"
    assert batcher.batch_key(SnsMessage(message="x", topic_arn="arn:other")) == "arn:other"


async def test_default_botocore_retries_bound_the_requests_per_item(moto_server: MotoServer) -> None:
    # No config given: the batcher's client retries in botocore's standard mode with 2 attempts, so a call
    # throttled for good costs 2 requests per batcher attempt, not botocore's legacy default of 5 (10 for DynamoDB).
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    async with FaultProxy(moto_server.endpoint_url) as proxy, clients(moto_server.endpoint_url) as (sns, sqs):
        topic, _ = await create_topic_to_queue(sns, sqs)
        proxy.rules.append(first_calls("PublishBatch", 10_000, Reply("Throttling", 400)))
        policy = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.002)
        batcher = AsyncSnsPublishBatcher(endpoint_url=proxy.url, aioboto3_session=session, retry=policy)
        async with batcher:
            assert batcher.client.meta.config.retries == {"mode": "standard", "total_max_attempts": 2}
            with pytest.raises(RetriesExhaustedError, match="throttled"):
                await batcher.process(SnsMessage(message="x", topic_arn=topic))
    assert counter.calls["PublishBatch"] == 3
    assert counter.requests["PublishBatch"] == len(proxy.calls("PublishBatch")) == 6


async def test_a_server_that_dies_mid_run_fails_callers_promptly() -> None:
    with MotoServer() as server:
        session = aioboto3.Session()
        async with clients(server.endpoint_url) as (sns, sqs):
            topic, _ = await create_topic_to_queue(sns, sqs)
        batcher = publisher(server.endpoint_url, session, topic_arn=topic, max_queue_time=0.001)
        messages = [SnsMessage(message=f"m{i}") for i in range(1500)]
        outcomes = await kill_mid_run(server, batcher, messages, SnsMessage(message="late"))
    assert all(isinstance(o, str | Exception) for o in outcomes)
