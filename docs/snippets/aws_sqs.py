"""Send messages to an SQS queue through the batcher.

``AWS_ENDPOINT_URL_SQS`` points it at a local server.
"""

import asyncio

import aioboto3

from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage

REGION = "eu-west-1"


async def create_queue() -> str:
    async with aioboto3.Session().client("sqs", region_name=REGION) as client:
        queue = await client.create_queue(QueueName="async-batcher-example")
    return queue["QueueUrl"]


def hello(i: int) -> SqsMessage:
    n = {"DataType": "Number", "StringValue": str(i)}
    return SqsMessage(body=f"hello {i}", attributes={"n": n})


async def main() -> None:
    queue_url = await create_queue()
    async with AsyncSqsSendBatcher(queue_url=queue_url, region_name=REGION) as sqs:
        # 25 concurrent sends become 3 SendMessageBatch calls;
        # each caller gets its message id.
        ids = await asyncio.gather(*(sqs.process(hello(i)) for i in range(25)))
    print(len(set(ids)), "messages sent")
    assert len(set(ids)) == 25


if __name__ == "__main__":
    asyncio.run(main())
