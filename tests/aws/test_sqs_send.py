"""AsyncSqsSendBatcher against moto's server, with Failed entries and throttling injected by a proxy.

Every test receives the queues back: a message whose caller got a message id is there exactly once, with that
id, and one whose caller got an error is not there.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError

from async_batcher.aws.errors import RetriesExhaustedError, SqsEntryError
from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage
from async_batcher.aws.sqs.send import DEFAULT_MAX_BATCH_BYTES, message_size
from tests.aws.faultproxy import FaultProxy, Reply, Withhold, first_calls
from tests.aws.helpers import FAST_RETRY, NO_BOTOCORE_RETRY, create_queue, kill_mid_run, receive_all
from tools.aws import ApiCallCounter, MotoServer

pytestmark = pytest.mark.single_loop


def sender(endpoint: str, session: aioboto3.Session | None = None, **kwargs: Any) -> AsyncSqsSendBatcher:
    kwargs.setdefault("retry", FAST_RETRY)
    return AsyncSqsSendBatcher(
        endpoint_url=endpoint, config=NO_BOTOCORE_RETRY, aioboto3_session=session or aioboto3.Session(), **kwargs
    )


def by_body(messages: list[dict[str, Any]]) -> dict[str, str]:
    """body -> message id, checking that no body arrived twice."""
    counts = collections.Counter(m["Body"] for m in messages)
    assert not [body for body, n in counts.items() if n > 1], "a message was delivered more than once"
    return {m["Body"]: m["MessageId"] for m in messages}


async def test_sends_to_two_queues_all_arrive_with_their_ids(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("sqs", endpoint_url=moto_server.endpoint_url) as admin:
        first, second = await create_queue(admin), await create_queue(admin)
        messages = [SqsMessage(queue_url=(first, second)[i % 3 == 0], body=f"m{i}") for i in range(250)]
        async with sender(moto_server.endpoint_url, session, max_batch_size=25, concurrency=3) as batcher:
            ids = await asyncio.gather(*(batcher.process(m) for m in messages[:200]))
            # batch_key keeps queues apart; process_batch also splits a batch that mixes them (a subclass may
            # override batch_key), in calls of at most 10.
            ids += await batcher.process_batch(batch=messages[200:])
        received = by_body(await receive_all(admin, first)) | by_body(await receive_all(admin, second))
    assert received == {m.body: message_id for m, message_id in zip(messages, ids, strict=True)}
    calls = counter.params["SendMessageBatch"]
    assert all(len(params["Entries"]) <= 10 for params in calls)
    assert sum(len(params["Entries"]) for params in calls) == 250
    for params in calls:  # each call's messages belong to the queue it names
        bodies = {entry["MessageBody"] for entry in params["Entries"]}
        assert all((int(b[1:]) % 3 == 0) == (params["QueueUrl"] == second) for b in bodies)


async def test_calls_respect_the_payload_cap(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("sqs", endpoint_url=moto_server.endpoint_url) as admin:
        queue = await create_queue(admin)
        attributes = {"kind": {"DataType": "String", "StringValue": "big"}}
        messages = [SqsMessage(body=f"{i:04d}" + "x" * 100_000, attributes=attributes) for i in range(12)]
        async with sender(moto_server.endpoint_url, session, queue_url=queue, max_batch_size=12) as batcher:
            await batcher.process_many(messages)
        assert len(await receive_all(admin, queue)) == 12
    calls = counter.params["SendMessageBatch"]
    assert len(calls) == 6  # two ~100 KB messages per call under 256 KiB
    for params in calls:
        payload = sum(
            message_size(SqsMessage(body=e["MessageBody"], attributes=e.get("MessageAttributes")))
            for e in params["Entries"]
        )
        assert payload <= DEFAULT_MAX_BATCH_BYTES


async def test_failed_entries_that_are_not_the_senders_fault_are_retried(moto_server: MotoServer) -> None:
    async with (
        FaultProxy(moto_server.endpoint_url) as proxy,
        aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin,
    ):
        queue = await create_queue(admin)
        # The first 15 calls fail some entries on SQS's side; each call keeps its last entry, so retries progress.
        proxy.rules.append(
            first_calls(
                "SendMessageBatch",
                15,
                lambda body: Withhold([i for i in (0, 4, 9) if i < len(body["Entries"]) - 1], code="InternalError"),
            )
        )
        async with sender(proxy.url, queue_url=queue, concurrency=2) as batcher:
            ids = await asyncio.gather(*(batcher.process(SqsMessage(body=f"m{i}")) for i in range(120)))
        received = by_body(await receive_all(admin, queue))
    assert received == {f"m{i}": message_id for i, message_id in enumerate(ids)}
    assert sum(len(body["Entries"]) for op, body in proxy.forwarded if op == "SendMessageBatch") == 120
    assert sum(len(body["Entries"]) for body in proxy.calls("SendMessageBatch")) > 120


async def test_a_message_at_fault_fails_only_its_caller(moto_server: MotoServer) -> None:
    def refuse_bad(operation: str, body: dict[str, Any]) -> Withhold | None:
        if operation != "SendMessageBatch":
            return None
        bad = [i for i, entry in enumerate(body["Entries"]) if entry["MessageBody"].startswith("bad")]
        return Withhold(bad, code="InvalidMessageContents", sender_fault=True)

    async with (
        FaultProxy(moto_server.endpoint_url) as proxy,
        aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin,
    ):
        queue = await create_queue(admin)
        proxy.rules.append(refuse_bad)
        bodies = [f"bad{i}" if i % 7 == 3 else f"ok{i}" for i in range(30)]
        async with sender(proxy.url, queue_url=queue) as batcher:
            results = await asyncio.gather(
                *(batcher.process(SqsMessage(body=b)) for b in bodies), return_exceptions=True
            )
        received = by_body(await receive_all(admin, queue))
    for body, result in zip(bodies, results, strict=True):
        if body.startswith("bad"):
            assert isinstance(result, SqsEntryError)
            assert result.code == "InvalidMessageContents"
            assert result.sender_fault
        else:
            assert received[body] == result
    assert set(received) == {b for b in bodies if b.startswith("ok")}
    assert len(proxy.calls("SendMessageBatch")) == 3  # refused entries are not retried


async def test_a_message_sqs_keeps_failing_gets_retries_exhausted(moto_server: MotoServer) -> None:
    async with (
        FaultProxy(moto_server.endpoint_url) as proxy,
        aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin,
    ):
        queue = await create_queue(admin)
        proxy.rules.append(first_calls("SendMessageBatch", 10_000, Withhold([0], code="ServiceUnavailable")))
        async with sender(proxy.url, queue_url=queue) as batcher:
            with pytest.raises(RetriesExhaustedError, match="SendMessageBatch: item still left unprocessed"):
                await batcher.process(SqsMessage(body="never"))
        assert await receive_all(admin, queue) == []
    assert len(proxy.calls("SendMessageBatch")) == FAST_RETRY.max_attempts


@pytest.mark.parametrize(
    ("code", "status"), [("RequestThrottled", 400), ("ThrottlingException", 400), ("InternalError", 500)]
)
async def test_throttled_calls_are_retried(moto_server: MotoServer, code: str, status: int) -> None:
    async with (
        FaultProxy(moto_server.endpoint_url) as proxy,
        aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin,
    ):
        queue = await create_queue(admin)
        proxy.rules.append(first_calls("SendMessageBatch", 3, Reply(code, status)))
        async with sender(proxy.url, queue_url=queue) as batcher:
            ids = await batcher.process_many([SqsMessage(body=f"m{i}") for i in range(10)])
        assert by_body(await receive_all(admin, queue)) == {f"m{i}": ids[i] for i in range(10)}
    assert len(proxy.calls("SendMessageBatch")) == 4


async def test_messages_refused_whole_call_are_isolated(moto_server: MotoServer) -> None:
    async with aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin:
        queue, fifo = await create_queue(admin), await create_queue(admin, fifo=True)
        bogus = {"a": {"DataType": "Bogus", "StringValue": "1"}}  # moto refuses the whole call for it
        messages = [SqsMessage(queue_url=queue, body=f"ok{i}") for i in range(9)]
        messages.insert(5, SqsMessage(queue_url=queue, body="bogus", attributes=bogus))
        messages.append(SqsMessage(queue_url=fifo, body="no group id"))  # MissingParameter
        messages.append(SqsMessage(queue_url=queue + "-missing", body="lost"))
        async with sender(moto_server.endpoint_url, max_batch_size=20) as batcher:
            results = await asyncio.gather(*(batcher.process(m) for m in messages), return_exceptions=True)
        received = by_body(await receive_all(admin, queue))
        assert await receive_all(admin, fifo) == []
    assert isinstance(results[5], ClientError)
    assert results[5].response["Error"]["Code"] == "InvalidParameterValue"
    assert isinstance(results[10], ClientError)
    assert results[10].response["Error"]["Code"] == "MissingParameter"
    assert isinstance(results[11], ClientError)
    assert results[11].response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert received == {m.body: r for m, r in zip(messages, results, strict=True) if m.body.startswith("ok")}


async def test_attributes_delay_and_fifo_fields_reach_sqs(moto_server: MotoServer) -> None:
    async with aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin:
        fifo = await create_queue(admin, fifo=True)
        plain = await create_queue(admin)
        messages = [
            SqsMessage(
                queue_url=fifo,
                body=f"g{i % 2}-{i}",
                group_id=f"g{i % 2}",
                deduplication_id=f"d{i}",
                attributes={
                    "n": {"DataType": "Number", "StringValue": str(i)},
                    "raw": {"DataType": "Binary", "BinaryValue": bytes([i])},
                },
            )
            for i in range(14)
        ]
        async with sender(moto_server.endpoint_url) as batcher:
            await batcher.process_many(messages)
            await batcher.process(SqsMessage(queue_url=plain, body="later", delay_seconds=0))
        received = await receive_all(admin, fifo)
        assert [m["Body"] for m in received if m["Body"].startswith("g0")] == [f"g0-{i}" for i in range(0, 14, 2)]
        assert [m["Body"] for m in received if m["Body"].startswith("g1")] == [f"g1-{i}" for i in range(1, 14, 2)]
        for message in received:
            i = int(message["Body"].split("-")[1])
            assert message["MessageAttributes"]["n"]["StringValue"] == str(i)
            assert message["MessageAttributes"]["raw"]["BinaryValue"] == bytes([i])
            assert message["Attributes"]["MessageGroupId"] == f"g{i % 2}"
            assert message["Attributes"]["MessageDeduplicationId"] == f"d{i}"
        assert [m["Body"] for m in await receive_all(admin, plain)] == ["later"]


async def test_a_message_without_a_queue_fails_alone(moto_server: MotoServer) -> None:
    async with aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin:
        queue = await create_queue(admin)
        async with sender(moto_server.endpoint_url) as batcher:
            results = await asyncio.gather(
                batcher.process(SqsMessage(body="nowhere")),
                batcher.process(SqsMessage(queue_url=queue, body="somewhere")),
                return_exceptions=True,
            )
        assert isinstance(results[0], ValueError)
        assert "names no queue_url" in str(results[0])
        assert by_body(await receive_all(admin, queue)) == {"somewhere": results[1]}


def test_messages_and_settings_are_validated_eagerly() -> None:
    with pytest.raises(ValueError, match="body must be a non-empty str"):
        SqsMessage(body="")
    with pytest.raises(ValueError, match="delay_seconds must be an int >= 0, got -1"):
        SqsMessage(body="x", delay_seconds=-1)
    with pytest.raises(ValueError, match="message attribute 'a' must be a mapping with a 'DataType'"):
        SqsMessage(body="x", attributes={"a": {"StringValue": "1"}})
    with pytest.raises(ValueError, match="max_batch_bytes must be an int in"):
        AsyncSqsSendBatcher(max_batch_bytes=0)


def test_batch_key_is_the_queue() -> None:
    batcher = AsyncSqsSendBatcher(queue_url="http://q/default")
    assert batcher.batch_key(SqsMessage(body="x")) == "http://q/default"
    assert batcher.batch_key(SqsMessage(body="x", queue_url="http://q/other")) == "http://q/other"


def test_message_size_counts_body_and_attributes() -> None:
    message = SqsMessage(
        body="héllo",  # 6 bytes in UTF-8
        attributes={
            "k": {"DataType": "String", "StringValue": "vv"},
            "b": {"DataType": "Binary", "BinaryValue": b"123"},
        },
    )
    assert message_size(message) == 6 + (1 + 6 + 2) + (1 + 6 + 3)


async def test_a_server_that_dies_mid_run_fails_callers_promptly() -> None:
    with MotoServer() as server:
        session = aioboto3.Session()
        async with session.client("sqs", endpoint_url=server.endpoint_url) as admin:
            queue = await create_queue(admin)
        batcher = sender(server.endpoint_url, session, queue_url=queue, max_queue_time=0.001)
        messages = [SqsMessage(body=f"m{i}") for i in range(1500)]
        outcomes = await kill_mid_run(server, batcher, messages, SqsMessage(body="late"))
    assert all(isinstance(o, str | Exception) for o in outcomes)


async def test_fifo_a_repeated_deduplication_id_is_accepted_and_dropped(moto_server: MotoServer) -> None:
    """What docs/guides/aws.md says of deduplication ids: SQS answers a message whose id it saw in the last
    5 minutes with a message id, and does not queue it. One id per distinct message."""
    async with aioboto3.Session().client("sqs", endpoint_url=moto_server.endpoint_url) as admin:
        fifo = await create_queue(admin, fifo=True)
        messages = [
            SqsMessage(queue_url=fifo, body=body, group_id="g", deduplication_id="same") for body in ("first", "second")
        ]
        async with sender(moto_server.endpoint_url) as batcher:
            ids = await batcher.process_many(messages)
        received = await receive_all(admin, fifo)
    assert all(isinstance(message_id, str) for message_id in ids)
    assert [m["Body"] for m in received] == ["first"]
