"""Tell "sent", "not sent" and "unknown" apart, and resend safely after a stop.

A forced stop can come while a batch is under way. Each caller then learns what
became of its message: sent, not sent (safe to send again), or unknown (it may be
in the queue). Sending the unknown ones again is safe here because each carries a
deduplication id: a FIFO queue drops a message whose id it saw in the last 5 minutes.

``AWS_ENDPOINT_URL_SQS`` points it at a local server.
"""

import asyncio

import aioboto3

from async_batcher import OutcomeUnknownError
from async_batcher.aws.errors import AbandonedBatchError
from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage

REGION = "eu-west-1"


async def create_queue() -> str:
    async with aioboto3.Session().client("sqs", region_name=REGION) as client:
        queue = await client.create_queue(
            QueueName="async-batcher-orders.fifo", Attributes={"FifoQueue": "true"}
        )
    return queue["QueueUrl"]


def order(i: int, queue_url: str) -> SqsMessage:
    # The deduplication id names the order: sending it twice cannot queue it twice.
    return SqsMessage(
        queue_url=queue_url,
        body=f"order {i}",
        group_id="orders",
        deduplication_id=f"order-{i}",
    )


def to_resend(message: SqsMessage, outcome: object) -> bool:
    """Whether to send ``message`` again: not sent, or unknown: its id makes it safe."""
    if isinstance(outcome, AbandonedBatchError):  # a stop cut its batch off
        return outcome.outcome_of(message).state != "applied"
    if isinstance(outcome, OutcomeUnknownError):  # the connection was lost mid-call
        return True
    return isinstance(outcome, Exception)  # any other error: it was not sent


async def receive_all(queue_url: str) -> list[str]:
    bodies: list[str] = []
    async with aioboto3.Session().client("sqs", region_name=REGION) as client:
        while True:
            answer = await client.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10
            )
            messages = answer.get("Messages", [])
            if not messages:
                return bodies
            bodies += [message["Body"] for message in messages]
            done = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(messages)
            ]
            await client.delete_message_batch(QueueUrl=queue_url, Entries=done)


async def main() -> None:
    queue_url = await create_queue()
    orders = [order(i, queue_url) for i in range(30)]
    async with AsyncSqsSendBatcher(region_name=REGION, max_queue_time=0.001) as sqs:
        calls = [asyncio.ensure_future(sqs.process(message)) for message in orders]
        await asyncio.sleep(0.01)  # the first batches leave...
        await sqs.stop(force=True)  # ...and the stop comes while some are under way
        outcomes = await asyncio.gather(*calls, return_exceptions=True)

    again = [
        m for m, outcome in zip(orders, outcomes, strict=True) if to_resend(m, outcome)
    ]
    async with AsyncSqsSendBatcher(region_name=REGION) as sqs:
        await sqs.process_many(again)
    print(len(orders) - len(again), "sent before the stop,", len(again), "sent again")

    bodies = await receive_all(queue_url)
    assert sorted(bodies) == sorted(m.body for m in orders), "each order exactly once"


if __name__ == "__main__":
    asyncio.run(main())
