"""Put N records into Kinesis through AsyncKinesisPutBatcher, then with one PutRecord call each, and compare.

From this folder, after ``pip install -r requirements.txt``:

    python put_records.py                    # against moto, started in this process (moto[server])
    python put_records.py --endpoint-url http://127.0.0.1:5000       # a server of yours: moto_server, LocalStack
    python put_records.py --aws              # AWS, with your credentials: a temporary stream, deleted after

``--callers 50``: 50 concurrent callers instead of N (each waits for its answer before putting the next). Prints
records/s and the API calls made each way (counted with a botocore event hook), and reads the stream back.

moto numbers a shard's records without a lock: concurrent puts to one shard can get the same sequence number,
and one record then replaces the other. The batcher sends one call at a time (``concurrency=1``, its default), so
its records all land; one ``PutRecord`` per record from many callers loses some on moto (not on AWS), which this
reports instead of failing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aioboto3

from async_batcher.aws.kinesis import AsyncKinesisPutBatcher, KinesisRecord


class ApiCalls:
    """Counts the API calls of an aioboto3 session's clients, by operation (create it before the clients)."""

    def __init__(self, session: aioboto3.Session) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        session.events.register("before-parameter-build", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        self.counts[event_name.rsplit(".", 1)[-1]] += 1


async def drive(n: int, callers: int, send: Callable[[int], Awaitable[object]]) -> float:
    """``callers`` concurrent tasks send items 0..n-1, each awaiting its answer first; returns the seconds taken."""
    items = iter(range(n))

    async def caller() -> None:
        for index in items:
            await send(index)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(min(callers, n)):
            group.create_task(caller())
    return time.perf_counter() - start


@contextlib.contextmanager
def endpoint(args: argparse.Namespace) -> Iterator[str | None]:
    """Where to send: AWS (None), the given endpoint, or moto's server run in a thread of this process."""
    if args.aws:
        yield None
        return
    # A local server takes any credentials; none are looked up elsewhere (no instance metadata).
    for name, value in [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")]:
        os.environ.setdefault(name, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    if args.endpoint_url:
        yield args.endpoint_url
        return
    from moto.server import ThreadedMotoServer  # pip install 'moto[server]'

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def data(index: int) -> str:
    return f'{{"index": {index}, "payload": "{"x" * 100}"}}'


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


async def batched(url: str | None, stream: str, n: int, callers: int) -> tuple[float, int]:
    """n records through the batcher: (seconds, PutRecords calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with AsyncKinesisPutBatcher(stream_name=stream, endpoint_url=url, aioboto3_session=session) as kinesis:
        seconds = await drive(
            n, callers, lambda i: kinesis.process(KinesisRecord(data=data(i), partition_key=f"k{i % 50}"))
        )
    return seconds, calls.counts["PutRecords"]


async def one_call_each(url: str | None, stream: str, n: int, callers: int) -> tuple[float, int]:
    """n PutRecord calls on one client: (seconds, PutRecord calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with session.client("kinesis", endpoint_url=url) as client:
        seconds = await drive(
            n, callers, lambda i: client.put_record(StreamName=stream, Data=data(i), PartitionKey=f"k{i % 50}")
        )
    return seconds, calls.counts["PutRecord"]


async def main(args: argparse.Namespace, url: str | None) -> None:
    print("| way | records | seconds | records/s | API calls |\n|---|--:|--:|--:|--:|")
    session = aioboto3.Session()
    for way, run in [("batched", batched), ("one call each", one_call_each)]:
        async with session.client("kinesis", endpoint_url=url) as admin:
            stream = await create_stream(admin)
            try:
                seconds, api_calls = await run(url, stream, args.n, args.callers or args.n)
                stored = await count_records(admin, stream)
            finally:
                await admin.delete_stream(StreamName=stream)
        print(f"| {way} | {args.n} | {seconds:.2f} | {args.n / seconds:,.0f} | {api_calls} |")
        if stored < args.n:
            message = f"{way}: {stored} records in the stream, expected {args.n}"
            if way == "batched":
                raise SystemExit(message)
            print(f"note: {message} (concurrent PutRecord calls to one shard race in moto)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="records each way")
    parser.add_argument("--callers", type=int, default=0, help="concurrent callers (default: n, all at once)")
    parser.add_argument("--endpoint-url", help="a Kinesis endpoint of yours (default: moto, started here)")
    parser.add_argument("--aws", action="store_true", help="use AWS, with your configured credentials and region")
    arguments = parser.parse_args()
    with endpoint(arguments) as url:
        asyncio.run(main(arguments, url))
