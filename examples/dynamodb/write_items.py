"""Write N items to DynamoDB through AsyncDynamoDbWriteBatcher, then with one PutItem call each, and compare.

From this folder, after ``pip install -r requirements.txt``:

    python write_items.py                    # against moto, started in this process (moto[server])
    python write_items.py --endpoint-url http://127.0.0.1:8000       # DynamoDB Local, or another server of yours
    python write_items.py --aws              # AWS, with your credentials: a temporary table, deleted after

``--callers 50``: 50 concurrent callers instead of N (each waits for its answer before writing the next). Prints
items/s and the API calls made each way (counted with a botocore event hook), and checks that every item is in
the table. DynamoDB Local (Amazon's own emulator, a Java program) is closer to DynamoDB than moto: run its jar
(Java 17) or its container image, and pass its endpoint.
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

from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher, WriteOperation


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


def item(index: int) -> dict[str, Any]:
    return {"pk": f"item-{index}", "index": index, "payload": "x" * 100}


async def create_table(client: Any) -> str:
    name = f"async-batcher-example-{uuid.uuid4().hex[:8]}"
    await client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    await client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    return name


async def count_items(client: Any, table: str) -> int:
    total, kwargs = 0, {"TableName": table, "Select": "COUNT", "ConsistentRead": True}
    while True:
        page = await client.scan(**kwargs)
        total += page["Count"]
        if "LastEvaluatedKey" not in page:
            return total
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


async def batched(url: str | None, table: str, n: int, callers: int) -> tuple[float, int]:
    """n writes through the batcher: (seconds, BatchWriteItem calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with AsyncDynamoDbWriteBatcher(endpoint_url=url, aioboto3_session=session) as writer:
        seconds = await drive(
            n, callers, lambda i: writer.process(WriteOperation(operation="PUT", table_name=table, data=item(i)))
        )
    return seconds, calls.counts["BatchWriteItem"]


async def one_call_each(url: str | None, table: str, n: int, callers: int) -> tuple[float, int]:
    """n PutItem calls on one resource: (seconds, PutItem calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with session.resource("dynamodb", endpoint_url=url) as dynamodb:
        resource_table = await dynamodb.Table(table)
        seconds = await drive(n, callers, lambda i: resource_table.put_item(Item=item(i)))
    return seconds, calls.counts["PutItem"]


async def main(args: argparse.Namespace, url: str | None) -> None:
    print("| way | items | seconds | items/s | API calls |\n|---|--:|--:|--:|--:|")
    session = aioboto3.Session()
    for way, run in [("batched", batched), ("one call each", one_call_each)]:
        async with session.client("dynamodb", endpoint_url=url) as admin:
            table = await create_table(admin)
            try:
                seconds, api_calls = await run(url, table, args.n, args.callers or args.n)
                stored = await count_items(admin, table)
            finally:
                await admin.delete_table(TableName=table)
        print(f"| {way} | {args.n} | {seconds:.2f} | {args.n / seconds:,.0f} | {api_calls} |")
        if stored != args.n:
            raise SystemExit(f"{way}: {stored} items in the table, expected {args.n}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="items each way")
    parser.add_argument("--callers", type=int, default=0, help="concurrent callers (default: n, all at once)")
    parser.add_argument("--endpoint-url", help="a DynamoDB endpoint of yours (default: moto, started here)")
    parser.add_argument("--aws", action="store_true", help="use AWS, with your configured credentials and region")
    arguments = parser.parse_args()
    with endpoint(arguments) as url:
        asyncio.run(main(arguments, url))
