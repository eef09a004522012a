"""Send N messages to SQS through AsyncSqsSendBatcher, then with one SendMessage call each, and compare.

From this folder, after ``pip install -r requirements.txt``:

    python send_messages.py                  # against moto, started in this process (moto[server])
    python send_messages.py --endpoint-url http://127.0.0.1:5000     # a server of yours: moto_server, LocalStack
    python send_messages.py --aws            # AWS, with your credentials: a temporary queue, deleted after

``--callers 50``: 50 concurrent callers instead of N (each waits for its answer before sending the next). Prints
messages/s and the API calls made each way (counted with a botocore event hook), and checks that every message
is in the queue.
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

from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage


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


def body(index: int) -> str:
    return f'{{"index": {index}, "payload": "{"x" * 100}"}}'


async def count_messages(client: Any, queue_url: str) -> int:
    answer = await client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(answer["Attributes"]["ApproximateNumberOfMessages"])


async def batched(url: str | None, queue_url: str, n: int, callers: int) -> tuple[float, int]:
    """n messages through the batcher: (seconds, SendMessageBatch calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with AsyncSqsSendBatcher(queue_url=queue_url, endpoint_url=url, aioboto3_session=session) as sqs:
        seconds = await drive(n, callers, lambda i: sqs.process(SqsMessage(body=body(i))))
    return seconds, calls.counts["SendMessageBatch"]


async def one_call_each(url: str | None, queue_url: str, n: int, callers: int) -> tuple[float, int]:
    """n SendMessage calls on one client: (seconds, SendMessage calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with session.client("sqs", endpoint_url=url) as client:
        seconds = await drive(n, callers, lambda i: client.send_message(QueueUrl=queue_url, MessageBody=body(i)))
    return seconds, calls.counts["SendMessage"]


async def main(args: argparse.Namespace, url: str | None) -> None:
    print("| way | messages | seconds | messages/s | API calls |\n|---|--:|--:|--:|--:|")
    session = aioboto3.Session()
    for way, run in [("batched", batched), ("one call each", one_call_each)]:
        async with session.client("sqs", endpoint_url=url) as admin:
            name = f"async-batcher-example-{uuid.uuid4().hex[:8]}"
            queue_url = (await admin.create_queue(QueueName=name))["QueueUrl"]
            try:
                seconds, api_calls = await run(url, queue_url, args.n, args.callers or args.n)
                stored = await count_messages(admin, queue_url)
            finally:
                await admin.delete_queue(QueueUrl=queue_url)
        print(f"| {way} | {args.n} | {seconds:.2f} | {args.n / seconds:,.0f} | {api_calls} |")
        # SQS's count is approximate on AWS, exact on a local server.
        if stored < args.n and url is not None:
            raise SystemExit(f"{way}: {stored} messages in the queue, expected {args.n}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300, help="messages each way")
    parser.add_argument("--callers", type=int, default=0, help="concurrent callers (default: n, all at once)")
    parser.add_argument("--endpoint-url", help="an SQS endpoint of yours (default: moto, started here)")
    parser.add_argument("--aws", action="store_true", help="use AWS, with your configured credentials and region")
    arguments = parser.parse_args()
    with endpoint(arguments) as url:
        asyncio.run(main(arguments, url))
