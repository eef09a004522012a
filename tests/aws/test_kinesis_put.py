"""AsyncKinesisPutBatcher against moto's server, with failed records and throttling injected by a proxy.

Every test reads the streams back: a record whose caller got a (shard, sequence number) is there exactly once,
at that place, and one whose caller got an error is not there.

moto numbers a shard's records without a lock: two PutRecords calls to one shard at the same time can get the
same sequence number, and one record then replaces the other. The batcher sends a batch's calls one after the
other, and these tests keep ``concurrency=1`` (the default), so that moto never sees two at once.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError

from async_batcher.aws.errors import KinesisRecordError, RetriesExhaustedError
from async_batcher.aws.kinesis import AsyncKinesisPutBatcher, KinesisPutResult, KinesisRecord
from async_batcher.aws.kinesis.put import MAX_REQUEST_BYTES
from tests.aws.faultproxy import FaultProxy, Reply, Withhold, first_calls
from tests.aws.helpers import FAST_RETRY, NO_BOTOCORE_RETRY, create_stream, kill_mid_run, read_stream
from tools.aws import ApiCallCounter, MotoServer

pytestmark = pytest.mark.single_loop


def putter(endpoint: str, session: aioboto3.Session | None = None, **kwargs: Any) -> AsyncKinesisPutBatcher:
    kwargs.setdefault("retry", FAST_RETRY)
    return AsyncKinesisPutBatcher(
        endpoint_url=endpoint, config=NO_BOTOCORE_RETRY, aioboto3_session=session or aioboto3.Session(), **kwargs
    )


def admin(endpoint: str) -> Any:
    return aioboto3.Session().client("kinesis", endpoint_url=endpoint)


async def stored(client: Any, stream: str) -> dict[bytes, KinesisPutResult]:
    """data -> where it is, checking that no record is there twice."""
    records = await read_stream(client, stream)
    counts = collections.Counter(record["Data"] for _, record in records)
    assert not [data for data, n in counts.items() if n > 1], "a record was put more than once"
    return {record["Data"]: KinesisPutResult(shard, record["SequenceNumber"]) for shard, record in records}


def records(count: int, prefix: str = "r", **kwargs: Any) -> list[KinesisRecord]:
    return [KinesisRecord(data=f"{prefix}{i}".encode(), partition_key=f"k{i % 7}", **kwargs) for i in range(count)]


async def test_puts_to_two_streams_all_land_where_the_callers_were_told(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with admin(moto_server.endpoint_url) as kinesis:
        first, second = await create_stream(kinesis), await create_stream(kinesis, shards=1)
        batch = records(1200)
        for record in batch[::4]:
            record.stream_name = second
        async with putter(moto_server.endpoint_url, session, stream_name=first, max_batch_size=700) as batcher:
            results = await asyncio.gather(*(batcher.process(r) for r in batch[:1000]))
            results += await batcher.process_batch(batch=batch[1000:])  # a batch that mixes streams is split
        where = await stored(kinesis, first) | await stored(kinesis, second)
    assert where == {r.data: result for r, result in zip(batch, results, strict=True)}
    calls = counter.params["PutRecords"]
    assert all(len(params["Records"]) <= 500 for params in calls)
    assert sum(len(params["Records"]) for params in calls) == 1200


async def test_calls_respect_the_size_cap(moto_server: MotoServer) -> None:
    session = aioboto3.Session()
    counter = ApiCallCounter(session, record=True)
    async with admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        big = [KinesisRecord(data=bytes([i]) * 900_000, partition_key=f"k{i}") for i in range(12)]
        async with putter(moto_server.endpoint_url, session, stream_name=stream) as batcher:
            await batcher.process_many(big)
        assert len(await stored(kinesis, stream)) == 12
    calls = counter.params["PutRecords"]
    assert [len(params["Records"]) for params in calls] == [5, 5, 2]
    for params in calls:
        assert sum(len(r["Data"]) + len(r["PartitionKey"]) for r in params["Records"]) <= MAX_REQUEST_BYTES


async def test_records_kinesis_fails_are_retried_until_they_land(moto_server: MotoServer) -> None:
    async with FaultProxy(moto_server.endpoint_url) as proxy, admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        failing = ("ProvisionedThroughputExceededException", "InternalFailure")
        count = 0

        def fail_some(body: dict[str, Any]) -> Withhold:
            nonlocal count
            count += 1  # each call keeps its last record, so retries progress
            return Withhold([i for i in (0, 2, 5, 11) if i < len(body["Records"]) - 1], code=failing[count % 2])

        proxy.rules.append(first_calls("PutRecords", 12, fail_some))
        batch = records(300)
        async with putter(proxy.url, stream_name=stream, max_batch_size=50) as batcher:
            results = await asyncio.gather(*(batcher.process(r) for r in batch))
        where = await stored(kinesis, stream)
    assert where == {r.data: result for r, result in zip(batch, results, strict=True)}
    assert sum(len(body["Records"]) for op, body in proxy.forwarded if op == "PutRecords") == 300
    assert sum(len(body["Records"]) for body in proxy.calls("PutRecords")) > 300


async def test_a_record_kinesis_keeps_failing_gets_retries_exhausted(moto_server: MotoServer) -> None:
    async with FaultProxy(moto_server.endpoint_url) as proxy, admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        code = "ProvisionedThroughputExceededException"
        proxy.rules.append(first_calls("PutRecords", 10_000, Withhold([0], code=code)))
        async with putter(proxy.url, stream_name=stream) as batcher:
            # The first record of every call fails.
            results = await asyncio.gather(*(batcher.process(r) for r in records(3)), return_exceptions=True)
        where = await stored(kinesis, stream)
    # One batch of 3: record 0 fails in the first call and in each retry, alone, until the attempts run out.
    assert isinstance(results[0], RetriesExhaustedError)
    assert "PutRecords: item still left unprocessed after 8 attempt(s)" in str(results[0])
    assert where == {b"r1": results[1], b"r2": results[2]}
    assert len(proxy.calls("PutRecords")) == FAST_RETRY.max_attempts


async def test_a_record_refused_for_good_fails_only_its_caller(moto_server: MotoServer) -> None:
    def refuse_bad(operation: str, body: dict[str, Any]) -> Withhold | None:
        if operation != "PutRecords":
            return None
        bad = [i for i, record in enumerate(body["Records"]) if record["PartitionKey"] == "bad"]
        return Withhold(bad, code="KMSAccessDeniedException")

    async with FaultProxy(moto_server.endpoint_url) as proxy, admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        proxy.rules.append(refuse_bad)
        batch = [KinesisRecord(data=f"r{i}", partition_key="bad" if i % 9 == 4 else "good") for i in range(40)]
        async with putter(proxy.url, stream_name=stream) as batcher:
            results = await asyncio.gather(*(batcher.process(r) for r in batch), return_exceptions=True)
        where = await stored(kinesis, stream)
    for record, result in zip(batch, results, strict=True):
        if record.partition_key == "bad":
            assert isinstance(result, KinesisRecordError)
            assert result.code == "KMSAccessDeniedException"
        else:
            assert isinstance(record.data, str) and where[record.data.encode()] == result
    assert len(where) == sum(r.partition_key == "good" for r in batch)


@pytest.mark.parametrize(
    ("code", "status"), [("ProvisionedThroughputExceededException", 400), ("InternalFailureException", 500)]
)
async def test_throttled_calls_are_retried(moto_server: MotoServer, code: str, status: int) -> None:
    async with FaultProxy(moto_server.endpoint_url) as proxy, admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        proxy.rules.append(first_calls("PutRecords", 3, Reply(code, status)))
        batch = records(20)
        async with putter(proxy.url, stream_name=stream) as batcher:
            results = await batcher.process_many(batch)
        assert await stored(kinesis, stream) == {r.data: result for r, result in zip(batch, results, strict=True)}
    assert len(proxy.calls("PutRecords")) == 4


async def test_records_refused_whole_call_are_isolated(moto_server: MotoServer) -> None:
    def refuse_bad(operation: str, body: dict[str, Any]) -> Reply | None:
        if operation == "PutRecords" and any(r["PartitionKey"] == "bad" for r in body["Records"]):
            return Reply("ValidationException")
        return None

    async with FaultProxy(moto_server.endpoint_url) as proxy, admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        proxy.rules.append(refuse_bad)
        batch = records(15)
        batch.insert(6, KinesisRecord(data=b"x", partition_key="bad"))
        batch.append(KinesisRecord(data=b"lost", partition_key="k", stream_name=stream + "-missing"))
        batch.append(KinesisRecord(data=b"hashed", partition_key="k", explicit_hash_key="0"))
        async with putter(proxy.url, stream_name=stream, max_batch_size=30) as batcher:
            results = await asyncio.gather(*(batcher.process(r) for r in batch), return_exceptions=True)
        where = await stored(kinesis, stream)
    assert isinstance(results[6], ClientError)
    assert results[6].response["Error"]["Code"] == "ValidationException"
    assert isinstance(results[-2], ClientError)
    assert results[-2].response["Error"]["Code"] == "ResourceNotFoundException"
    assert where == {r.data: res for r, res in zip(batch, results, strict=True) if isinstance(res, KinesisPutResult)}
    assert len(where) == 16
    assert where[b"hashed"].shard_id == "shardId-000000000000"  # hash key 0 is the first shard's


MAX_HASH_KEY = 2**128 - 1  # Kinesis hash keys are 128-bit


@pytest.mark.parametrize(
    "key",
    [
        "²",  # str.isdigit() accepts superscripts
        "١٢٣",  # and Arabic-Indic digits (str.isdecimal() too)
        "\uff11\uff12",  # and fullwidth digits
        "12²",
        "",
        " 1",
        "1 ",
        "1\n",
        "+1",
        "-1",
        "1_000",  # int() accepts underscores
        "01",  # the service's pattern is 0|([1-9]\d{0,38}): no leading zero
        "0x1",
        str(MAX_HASH_KEY + 1),
        "9" * 39,
        "1" + "0" * 39,
    ],
)
def test_an_explicit_hash_key_that_is_not_a_128_bit_decimal_is_refused_when_the_record_is_made(key: str) -> None:
    with pytest.raises(ValueError, match="explicit_hash_key must be") as refused:
        KinesisRecord(data=b"x", partition_key="k", explicit_hash_key=key)
    assert repr(key) in str(refused.value)  # the error names the bad value


@pytest.mark.parametrize("key", ["0", "1", "42", str(2**127), str(MAX_HASH_KEY)])
def test_an_explicit_hash_key_in_range_is_kept_as_given(key: str) -> None:
    assert KinesisRecord(data=b"x", partition_key="k", explicit_hash_key=key).entry()["ExplicitHashKey"] == key


def test_an_explicit_hash_key_that_is_not_a_str_is_refused() -> None:
    with pytest.raises(ValueError, match="explicit_hash_key must be"):
        KinesisRecord(data=b"x", partition_key="k", explicit_hash_key=5)  # type: ignore[arg-type]


async def test_a_high_hash_key_reaches_the_last_shard(moto_server: MotoServer) -> None:
    # moto treats a shard's ending hash key as exclusive (AWS: inclusive), so it has no shard for 2**128 - 1
    # itself and answers 500: the top key is checked above, and one below it here.
    high = str(MAX_HASH_KEY - 1)
    async with admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        async with putter(moto_server.endpoint_url, stream_name=stream) as batcher:
            first, last = await batcher.process_many(
                [
                    KinesisRecord(data=b"low", partition_key="k", explicit_hash_key="0"),
                    KinesisRecord(data=b"high", partition_key="k", explicit_hash_key=high),
                ]
            )
        assert await stored(kinesis, stream) == {b"low": first, b"high": last}
    assert (first.shard_id, last.shard_id) == ("shardId-000000000000", "shardId-000000000001")


def test_records_and_settings_are_validated_eagerly() -> None:
    with pytest.raises(ValueError, match="partition_key must be a str of 1 to 256 characters"):
        KinesisRecord(data=b"x", partition_key="")
    with pytest.raises(TypeError, match="data must be bytes or str, got int"):
        KinesisRecord(data=1, partition_key="k")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="explicit_hash_key must be None or a str of ASCII digits"):
        KinesisRecord(data=b"x", partition_key="k", explicit_hash_key="0x1")
    with pytest.raises(ValueError, match="the most is 1 MiB"):
        KinesisRecord(data=b"x" * (1024 * 1024), partition_key="k")
    with pytest.raises(ValueError, match="stream_name must be a non-empty str or None"):
        AsyncKinesisPutBatcher(stream_name="")
    assert KinesisRecord(data="é", partition_key="k").size == 3
    assert KinesisRecord(data="é", partition_key="k").entry()["Data"] == "é".encode()


async def test_a_record_without_a_stream_fails_alone(moto_server: MotoServer) -> None:
    async with admin(moto_server.endpoint_url) as kinesis:
        stream = await create_stream(kinesis)
        async with putter(moto_server.endpoint_url) as batcher:
            results = await asyncio.gather(
                batcher.process(KinesisRecord(data=b"nowhere", partition_key="k")),
                batcher.process(KinesisRecord(data=b"somewhere", partition_key="k", stream_name=stream)),
                return_exceptions=True,
            )
        assert isinstance(results[0], ValueError)
        assert "names no stream_name" in str(results[0])
        assert await stored(kinesis, stream) == {b"somewhere": results[1]}


async def test_a_server_that_dies_mid_run_fails_callers_promptly() -> None:
    with MotoServer() as server:
        async with admin(server.endpoint_url) as kinesis:
            stream = await create_stream(kinesis)
        batcher = putter(server.endpoint_url, stream_name=stream, max_batch_size=20, max_queue_time=0.001)
        outcomes = await kill_mid_run(server, batcher, records(3000), KinesisRecord(data=b"late", partition_key="k"))
    assert all(isinstance(o, KinesisPutResult | Exception) for o in outcomes)
