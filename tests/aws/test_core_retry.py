"""The core's retry policy (``retry=RetryPolicy(...)`` and ``Retry`` result elements, issue 45) on AWS batch APIs,
against moto's server with the service's faults injected by the proxy: throttling of a whole ``BatchWriteItem``
(``ProvisionedThroughputExceededException``), ``UnprocessedItems``, and ``SendMessageBatch``'s ``Failed`` entries.

The batchers here are what a user of plain ``AsyncBatcher`` writes: one call per batch, a ``Retry`` element for each
item the service left out, the throttle classified by ``retry_on``. Every item arrives exactly once, and the calls
after a partial failure carry only what failed (with what came meanwhile).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import aioboto3
import pytest

from async_batcher import AsyncBatcher
from async_batcher.aws.retry import is_retryable_error
from async_batcher.failures import Retry, RetryPolicy
from tests.aws.faultproxy import FaultProxy, Reply, Withhold, first_calls
from tests.aws.helpers import NO_BOTOCORE_RETRY, create_queue, create_table, receive_all, scan_all
from tools.aws import MotoServer

pytestmark = pytest.mark.single_loop

FAST = RetryPolicy(attempts=6, backoff=0.002, cap=0.02, retry_on=(is_retryable_error,))


class WithClient(AsyncBatcher[Any, Any]):
    """A batcher with an aioboto3 client of ``service``, open from ``on_start`` to ``on_stop``; ``target`` is what
    its calls name (a table, a queue URL)."""

    service: str

    def __init__(self, endpoint: str, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.endpoint, self.target = endpoint, target
        self.client: Any = None

    async def on_start(self) -> None:
        client = aioboto3.Session().client(self.service, endpoint_url=self.endpoint, config=NO_BOTOCORE_RETRY)
        self.client = await client.__aenter__()

    async def on_stop(self) -> None:
        await self.client.__aexit__(None, None, None)


class PutItems(WithClient):
    """``BatchWriteItem`` of the batch's items (25 at most) into one table; ``Retry`` for each item left out."""

    service = "dynamodb"

    async def process_batch(self, batch: list[dict[str, Any]]) -> list[Any]:
        requests = [{"PutRequest": {"Item": {"pk": {"S": item["pk"]}, "n": {"N": str(item["n"])}}}} for item in batch]
        answer = await self.client.batch_write_item(RequestItems={self.target: requests})
        left = {r["PutRequest"]["Item"]["pk"]["S"] for r in answer.get("UnprocessedItems", {}).get(self.target, [])}
        return [Retry() if item["pk"] in left else None for item in batch]


async def test_throttled_and_unprocessed_items_are_written_exactly_once(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    async with session.client("dynamodb", endpoint_url=moto_server.endpoint_url) as admin:
        table = await create_table(admin)
        withheld = first_calls("BatchWriteItem", 3, Withhold([0, 2, 5, 11]))
        throttled = first_calls("BatchWriteItem", 2, Reply("ProvisionedThroughputExceededException"))
        async with FaultProxy(moto_server.endpoint_url, rules=[throttled, withheld]) as proxy:
            items = [{"pk": f"k{i:03d}", "n": i} for i in range(100)]
            async with PutItems(proxy.url, table, max_batch_size=25, retry=FAST, max_queue_time=0.01) as batcher:
                assert await asyncio.gather(*(batcher.process(item) for item in items)) == [None] * 100
                stats = batcher.stats
        written = await scan_all(admin, table)
    assert sorted((item["pk"], item["n"]) for item in written) == [(f"k{i:03d}", i) for i in range(100)]
    calls = proxy.calls("BatchWriteItem")
    sent = collections.Counter(
        request["PutRequest"]["Item"]["pk"]["S"] for call in calls for request in call["RequestItems"][table]
    )
    # Every item was sent at least once; only the throttled calls' items and the withheld ones more than once.
    assert set(sent) == {item["pk"] for item in items}
    retried = {pk for pk, n in sent.items() if n > 1}
    assert stats.retried >= len(retried) > 0
    assert len(calls) < 2 * (100 // 25) + 8  # the calls after a failure carry what failed, not whole batches again
    assert stats.failed == 0 and stats.succeeded == 100


async def test_a_table_throttled_for_good_ends_in_the_throttle(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    async with session.client("dynamodb", endpoint_url=moto_server.endpoint_url) as admin:
        table = await create_table(admin)

        def always(operation: str, body: dict[str, Any]) -> Reply | None:
            return Reply("ProvisionedThroughputExceededException") if operation == "BatchWriteItem" else None

        async with FaultProxy(moto_server.endpoint_url, rules=[always]) as proxy:
            async with PutItems(proxy.url, table, max_batch_size=25, retry=FAST, max_queue_time=0.01) as batcher:
                results = await asyncio.gather(
                    *(batcher.process({"pk": f"k{i}", "n": i}) for i in range(5)), return_exceptions=True
                )
        assert await scan_all(admin, table) == []
    assert all(is_retryable_error(r) for r in results)
    assert len(proxy.calls("BatchWriteItem")) == FAST.attempts


class SendMessages(WithClient):
    """``SendMessageBatch`` of the batch's bodies (10 at most); ``Retry`` for an entry failed on the service's side,
    the error for one failed on the sender's."""

    service = "sqs"

    async def process_batch(self, batch: list[str]) -> list[Any]:
        entries = [{"Id": str(i), "MessageBody": body} for i, body in enumerate(batch)]
        answer = await self.client.send_message_batch(QueueUrl=self.target, Entries=entries)
        results: list[Any] = [None] * len(batch)
        for ok in answer.get("Successful", []):
            results[int(ok["Id"])] = ok["MessageId"]
        for failed in answer.get("Failed", []):
            error = RuntimeError(f"{failed['Code']}: {failed.get('Message', '')}")
            results[int(failed["Id"])] = error if failed["SenderFault"] else Retry(error)
        return results


async def test_sqs_partial_batch_failures_are_sent_again_alone(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=moto_server.endpoint_url) as admin:
        queue = await create_queue(admin)
        partial = first_calls("SendMessageBatch", 2, Withhold([1, 4], code="InternalError"))
        async with FaultProxy(moto_server.endpoint_url, rules=[partial]) as proxy:
            bodies = [f"m{i}" for i in range(30)]
            async with SendMessages(proxy.url, queue, max_batch_size=10, retry=FAST, max_queue_time=0.01) as batcher:
                ids = await asyncio.gather(*(batcher.process(body) for body in bodies))
                stats = batcher.stats
        received = await receive_all(admin, queue)
    by_body = collections.Counter(message["Body"] for message in received)
    assert by_body == collections.Counter(bodies)  # each exactly once
    assert {message["Body"]: message["MessageId"] for message in received} == dict(zip(bodies, ids, strict=True))
    assert stats.retried == 4
    # Only the entries that failed went again, each once, without those answered with them.
    sent = collections.Counter(
        entry["MessageBody"] for call in proxy.calls("SendMessageBatch") for entry in call["Entries"]
    )
    assert sorted(sent.values()) == [1] * 26 + [2] * 4
