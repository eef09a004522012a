"""AsyncDynamoDbWriteBatcher against moto's server and DynamoDB Local (the ``dynamodb`` fixture), with faults injected
by a proxy between client and server.

Every test reads the tables back with a consistent scan: a write that a caller was told succeeded is there,
and one that failed is not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError

from async_batcher.aws._chunking import json_size
from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher, WriteOperation
from async_batcher.aws.errors import RetriesExhaustedError
from tests.aws.faultproxy import FaultProxy, Reply, Withhold, first_calls
from tests.aws.helpers import FAST_RETRY, NO_BOTOCORE_RETRY, create_table, kill_mid_run, scan_all
from tools.aws import ApiCallCounter, DynamoDBLocal
from tools.servers import LocalServer

pytestmark = pytest.mark.single_loop


def put(table: str, **data: Any) -> WriteOperation:
    return WriteOperation(operation="PUT", table_name=table, data=data)


def writer(endpoint: str, session: aioboto3.Session | None = None, **kwargs: Any) -> AsyncDynamoDbWriteBatcher:
    kwargs.setdefault("retry", FAST_RETRY)
    return AsyncDynamoDbWriteBatcher(
        endpoint_url=endpoint, config=NO_BOTOCORE_RETRY, aioboto3_session=session or aioboto3.Session(), **kwargs
    )


def batch_write_calls(counter: ApiCallCounter) -> list[list[tuple[str, dict[str, Any]]]]:
    """The (table, request) pairs of each BatchWriteItem call the batcher made."""
    return [
        [(table, request) for table, requests in params["RequestItems"].items() for request in requests]
        for params in counter.params["BatchWriteItem"]
    ]


def count_requests(bodies: Iterable[dict[str, Any]]) -> int:
    return sum(len(requests) for body in bodies for requests in body["RequestItems"].values())


async def test_concurrent_writes_to_two_tables_all_land(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        simple = await create_table(admin)
        composite = await create_table(admin, range_key="sk")
        async with writer(dynamodb.endpoint_url, session, max_batch_size=25, concurrency=4) as batcher:
            results = await asyncio.gather(
                *(batcher.process(put(simple, pk=f"k{i}", value=i)) for i in range(150)),
                *(batcher.process(put(composite, pk=f"p{i % 7}", sk=i, blob=b"\x00" * i)) for i in range(130)),
            )
            stats = batcher.stats
        assert results == [None] * 280
        assert sorted(int(item["value"]) for item in await scan_all(admin, simple)) == list(range(150))
        rows = await scan_all(admin, composite)
        assert sorted(int(item["sk"]) for item in rows) == list(range(130))
        assert all(bytes(item["blob"]) == b"\x00" * int(item["sk"]) for item in rows)
    calls = batch_write_calls(counter)
    assert sum(len(call) for call in calls) == 280
    assert all(len(call) <= 25 for call in calls)
    assert len(calls) == stats.batches  # one call per batch of <= 25
    assert counter.calls["DescribeTable"] == 2  # once per table, not per batch


async def test_a_batch_larger_than_25_is_cut_into_calls_of_25(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin)
        async with writer(dynamodb.endpoint_url, session, max_batch_size=200) as batcher:
            await batcher.process_many([put(table, pk=str(i)) for i in range(120)])
        assert len(await scan_all(admin, table)) == 120
    assert sorted(len(call) for call in batch_write_calls(counter)) == [20, 25, 25, 25, 25]


async def test_calls_respect_the_request_size_cap(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    cap = 1024 * 1024  # a small cap so the test stays light; the default is the service's 16 MB
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin)
        async with writer(dynamodb.endpoint_url, session, max_batch_size=40, max_request_bytes=cap) as batcher:
            await batcher.process_many([put(table, pk=str(i), payload="x" * 150_000) for i in range(40)])
        assert len(await scan_all(admin, table)) == 40
    calls = counter.params["BatchWriteItem"]
    assert all(json_size(params["RequestItems"]) <= cap for params in calls)
    assert len(calls) >= 40 * 150_000 // cap


async def test_deletes_and_puts_mix(dynamodb: LocalServer) -> None:
    async with aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin, range_key="sk")
        async with writer(dynamodb.endpoint_url) as batcher:
            await batcher.process_many([put(table, pk="a", sk=i) for i in range(10)])
            deletes = [
                WriteOperation(operation="DELETE", table_name=table, data={"pk": "a", "sk": i}) for i in range(0, 10, 2)
            ]
            assert await batcher.process_many(deletes) == [None] * 5
        assert sorted(int(item["sk"]) for item in await scan_all(admin, table)) == [1, 3, 5, 7, 9]


async def test_unprocessed_items_are_retried_until_written(dynamodb: LocalServer) -> None:
    async with (
        FaultProxy(dynamodb.endpoint_url) as proxy,
        aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin,
    ):
        table = await create_table(admin)
        # The first 12 calls each leave out every third request but the last (so retries progress); the
        # left-out requests never reach the server.
        proxy.rules.append(
            first_calls("BatchWriteItem", 12, lambda body: Withhold(range(0, count_requests([body]) - 1, 3)))
        )
        async with writer(proxy.url, concurrency=3) as batcher:
            results = await asyncio.gather(*(batcher.process(put(table, pk=f"k{i}", n=i)) for i in range(200)))
        assert results == [None] * 200
        assert sorted(int(item["n"]) for item in await scan_all(admin, table)) == list(range(200))
    # Each write reached the server exactly once, and the client had to send some of them again.
    assert count_requests(body for op, body in proxy.forwarded if op == "BatchWriteItem") == 200
    assert count_requests(proxy.calls("BatchWriteItem")) > 200


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ProvisionedThroughputExceededException", 400),
        ("ThrottlingException", 400),
        ("RequestLimitExceeded", 400),
        ("InternalServerError", 500),
        ("ServiceUnavailable", 503),
    ],
)
async def test_throttled_calls_are_retried(dynamodb: LocalServer, code: str, status: int) -> None:
    async with (
        FaultProxy(dynamodb.endpoint_url) as proxy,
        aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin,
    ):
        table = await create_table(admin)
        proxy.rules.append(first_calls("BatchWriteItem", 4, Reply(code, status)))
        async with writer(proxy.url) as batcher:
            results = await batcher.process_many([put(table, pk=str(i)) for i in range(30)])
        assert results == [None] * 30
        assert len(await scan_all(admin, table)) == 30
        assert len(proxy.calls("BatchWriteItem")) == 4 + 2  # 4 refused, then 25 + 5


async def test_a_write_left_unprocessed_too_long_fails_alone(dynamodb: LocalServer) -> None:
    def hold_stuck(operation: str, body: dict[str, Any]) -> Withhold | None:
        if operation != "BatchWriteItem":
            return None
        requests = [r for reqs in body["RequestItems"].values() for r in reqs]
        return Withhold([i for i, r in enumerate(requests) if r["PutRequest"]["Item"]["pk"]["S"].startswith("stuck")])

    async with (
        FaultProxy(dynamodb.endpoint_url) as proxy,
        aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin,
    ):
        table = await create_table(admin)
        proxy.rules.append(hold_stuck)
        keys = [f"stuck{i}" if i in (3, 17) else f"ok{i}" for i in range(25)]
        async with writer(proxy.url) as batcher:
            results = await asyncio.gather(
                *(batcher.process(put(table, pk=key)) for key in keys), return_exceptions=True
            )
        for key, result in zip(keys, results, strict=True):
            if key.startswith("stuck"):
                assert isinstance(result, RetriesExhaustedError)
                assert result.attempts == FAST_RETRY.max_attempts
                assert "it was not applied" in str(result)
            else:
                assert result is None
        assert sorted(item["pk"] for item in await scan_all(admin, table)) == sorted(
            k for k in keys if k.startswith("ok")
        )
        assert len(proxy.calls("BatchWriteItem")) == FAST_RETRY.max_attempts


async def test_exhausted_throttling_reports_the_last_error(dynamodb: LocalServer) -> None:
    async with (
        FaultProxy(dynamodb.endpoint_url) as proxy,
        aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin,
    ):
        table = await create_table(admin)
        proxy.rules.append(first_calls("BatchWriteItem", 10_000, Reply("ProvisionedThroughputExceededException")))
        async with writer(proxy.url) as batcher:
            with pytest.raises(RetriesExhaustedError, match=r"throttled \(ProvisionedThroughputExceededException\)"):
                await batcher.process(put(table, pk="a"))
        assert await scan_all(admin, table) == []


async def test_writes_to_one_key_in_one_batch_land_in_order(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin, range_key="sk")
        operations = [
            put(table, pk="same", sk=1, version=1),
            put(table, pk="other", sk=1, version=1),
            put(table, pk="same", sk=1, version=2),
            WriteOperation(operation="DELETE", table_name=table, data={"pk": "gone", "sk": Decimal("2.0")}),
            put(table, pk="gone", sk=2, version=1),  # same key as the delete: "2.0" and 2 are one number
            put(table, pk="same", sk=1, version=3),
        ]
        async with writer(dynamodb.endpoint_url, session) as batcher:
            assert await batcher.process_many(operations) == [None] * 6
        rows = {(item["pk"], int(item["sk"])): int(item["version"]) for item in await scan_all(admin, table)}
        assert rows == {("same", 1): 3, ("other", 1): 1, ("gone", 2): 1}
    calls = batch_write_calls(counter)
    assert len(calls) == 3  # rounds: "same" is written three times
    for call in calls:
        keys = [
            (t, r.get("PutRequest", {}).get("Item", r.get("DeleteRequest", {}).get("Key"))["pk"]["S"]) for t, r in call
        ]
        assert len(keys) == len(set(keys))


async def test_one_invalid_item_fails_only_its_caller(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin)
        operations = [put(table, pk=f"k{i}", n=i) for i in range(25)]
        operations[6] = put(table, pk="", n=6)  # an empty string key: ValidationException
        operations[19] = put(table, pk="big", payload="x" * 420_000)  # over 400 KB: ValidationException
        async with writer(dynamodb.endpoint_url, session) as batcher:
            results = await asyncio.gather(*(batcher.process(op) for op in operations), return_exceptions=True)
        for index, result in enumerate(results):
            if index in (6, 19):
                assert isinstance(result, ClientError)
                assert result.response["Error"]["Code"] == "ValidationException"
            else:
                assert result is None
        stored = sorted(int(item["n"]) for item in await scan_all(admin, table))
        assert stored == [i for i in range(25) if i not in (6, 19)]
    # Bisection: a bounded number of extra calls, not one call per item.
    assert len(counter.params["BatchWriteItem"]) <= 1 + 2 * 2 * 5


async def test_writes_to_a_missing_table_fail_alone(dynamodb: LocalServer) -> None:
    async with aioboto3.Session().client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin)
        async with writer(dynamodb.endpoint_url) as batcher:
            results = await asyncio.gather(
                batcher.process(put(table, pk="a")),
                batcher.process(put("no-such-table", pk="b")),
                return_exceptions=True,
            )
        assert results[0] is None
        assert isinstance(results[1], ClientError)
        assert results[1].response["Error"]["Code"] == "ResourceNotFoundException"
        assert [item["pk"] for item in await scan_all(admin, table)] == ["a"]


async def test_unstorable_items_fail_before_any_call(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin, range_key="sk")
        async with writer(dynamodb.endpoint_url, session) as batcher:
            with pytest.raises(TypeError, match="attribute 'price': Float types are not supported"):
                await batcher.process(put(table, pk="a", sk=1, price=1.5))
            with pytest.raises(ValueError, match=f"item for table '{table}' lacks key attribute 'sk'"):
                await batcher.process(put(table, pk="a"))
    assert counter.calls["BatchWriteItem"] == 0


def test_operations_are_validated_eagerly() -> None:
    with pytest.raises(ValueError, match="operation must be 'PUT' or 'DELETE', got 'UPDATE'"):
        WriteOperation(operation="UPDATE", table_name="t", data={})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="table_name must be a non-empty str"):
        WriteOperation(operation="PUT", table_name="", data={})
    with pytest.raises(ValueError, match="max_request_bytes must be an int in"):
        AsyncDynamoDbWriteBatcher(max_request_bytes=17 * 1024 * 1024)


async def test_table_keys_given_up_front_cost_no_describe(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session)
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin)
        async with writer(dynamodb.endpoint_url, session, table_keys={table: ["pk"]}) as batcher:
            await batcher.process(put(table, pk="a"))
        assert len(await scan_all(admin, table)) == 1
    assert counter.calls["DescribeTable"] == 0


async def test_one_client_per_run_of_the_batcher(dynamodb: LocalServer) -> None:
    session = aioboto3.Session()
    created: list[str] = []
    session.events.register("creating-client-class.dynamodb", lambda **kwargs: created.append("dynamodb"))
    async with session.client("dynamodb", endpoint_url=dynamodb.endpoint_url) as admin:
        table = await create_table(admin)
    created.clear()
    batcher = writer(dynamodb.endpoint_url, session, max_batch_size=5)
    async with batcher:
        await batcher.process_many([put(table, pk=str(i)) for i in range(40)])
        assert batcher.stats.batches == 8
    assert created == ["dynamodb"]
    with pytest.raises(RuntimeError, match="open only while the batcher runs"):
        _ = batcher.client
    async with batcher:  # a restart opens a new client
        await batcher.process(put(table, pk="again"))
    assert created == ["dynamodb", "dynamodb"]


@pytest.mark.usefixtures("dynamodb_local_jar")
async def test_a_server_that_dies_mid_run_fails_callers_promptly() -> None:
    with DynamoDBLocal() as server:
        session = aioboto3.Session()
        async with session.client("dynamodb", endpoint_url=server.endpoint_url) as admin:
            table = await create_table(admin)
        batcher = writer(server.endpoint_url, session, max_batch_size=10, max_queue_time=0.001)
        outcomes = await kill_mid_run(server, batcher, [put(table, pk=str(i)) for i in range(2000)], put(table, pk="x"))
    assert all(o is None or isinstance(o, Exception) for o in outcomes)
