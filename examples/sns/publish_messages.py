"""Publish N messages to SNS through AsyncSnsPublishBatcher, then with one Publish call each, and compare.

From this folder, after ``pip install -r requirements.txt``:

    python publish_messages.py               # against moto, started in this process (moto[server])
    python publish_messages.py --endpoint-url http://127.0.0.1:5000  # a server of yours: moto_server, LocalStack
    python publish_messages.py --aws         # AWS, with your credentials: a temporary topic and queue, deleted after

``--callers 50``: 50 concurrent callers instead of N (each waits for its answer before publishing the next).
Prints messages/s and the API calls made each way (counted with a botocore event hook), and checks that every
message reached the SQS queue subscribed to the topic.
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

from async_batcher.aws.sns import AsyncSnsPublishBatcher, SnsMessage


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


async def create_topic_and_queue(sns: Any, sqs: Any) -> tuple[str, str]:
    """A fresh topic with a fresh queue subscribed to it (raw delivery)."""
    name = f"async-batcher-example-{uuid.uuid4().hex[:8]}"
    topic = str((await sns.create_topic(Name=name))["TopicArn"])
    queue = str((await sqs.create_queue(QueueName=name))["QueueUrl"])
    arn = (await sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"]))["Attributes"]["QueueArn"]
    await sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    return topic, queue


async def count_messages(client: Any, queue_url: str) -> int:
    answer = await client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(answer["Attributes"]["ApproximateNumberOfMessages"])


async def batched(url: str | None, topic: str, n: int, callers: int) -> tuple[float, int]:
    """n messages through the batcher: (seconds, PublishBatch calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with AsyncSnsPublishBatcher(topic_arn=topic, endpoint_url=url, aioboto3_session=session) as publisher:
        seconds = await drive(n, callers, lambda i: publisher.process(SnsMessage(message=body(i))))
    return seconds, calls.counts["PublishBatch"]


async def one_call_each(url: str | None, topic: str, n: int, callers: int) -> tuple[float, int]:
    """n Publish calls on one client: (seconds, Publish calls)."""
    session = aioboto3.Session()
    calls = ApiCalls(session)
    async with session.client("sns", endpoint_url=url) as client:
        seconds = await drive(n, callers, lambda i: client.publish(TopicArn=topic, Message=body(i)))
    return seconds, calls.counts["Publish"]


async def main(args: argparse.Namespace, url: str | None) -> None:
    print("| way | messages | seconds | messages/s | API calls |\n|---|--:|--:|--:|--:|")
    session = aioboto3.Session()
    for way, run in [("batched", batched), ("one call each", one_call_each)]:
        async with session.client("sns", endpoint_url=url) as sns, session.client("sqs", endpoint_url=url) as sqs:
            topic, queue = await create_topic_and_queue(sns, sqs)
            try:
                seconds, api_calls = await run(url, topic, args.n, args.callers or args.n)
                stored = await count_messages(sqs, queue)
            finally:
                await sns.delete_topic(TopicArn=topic)
                await sqs.delete_queue(QueueUrl=queue)
        print(f"| {way} | {args.n} | {seconds:.2f} | {args.n / seconds:,.0f} | {api_calls} |")
        # SQS's count is approximate on AWS, exact on a local server.
        if stored < args.n and url is not None:
            raise SystemExit(f"{way}: {stored} messages reached the queue, expected {args.n}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300, help="messages each way")
    parser.add_argument("--callers", type=int, default=0, help="concurrent callers (default: n, all at once)")
    parser.add_argument("--endpoint-url", help="an SNS and SQS endpoint of yours (default: moto, started here)")
    parser.add_argument("--aws", action="store_true", help="use AWS, with your configured credentials and region")
    arguments = parser.parse_args()
    with endpoint(arguments) as url:
        asyncio.run(main(arguments, url))
