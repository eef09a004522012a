"""Send messages to an SQS queue through the batcher (``AWS_ENDPOINT_URL_SQS`` for a local server)."""

import asyncio

import aioboto3

from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage

REGION = "eu-west-1"


async def main() -> None:
    async with aioboto3.Session().client("sqs", region_name=REGION) as client:
        queue_url = (await client.create_queue(QueueName="async-batcher-example"))["QueueUrl"]

    async with AsyncSqsSendBatcher(queue_url=queue_url, region_name=REGION) as sender:
        # 25 concurrent sends become 3 SendMessageBatch calls; each caller gets its message id.
        messages = [SqsMessage(body=f"hello {i}", attributes={"n": {"DataType": "Number", "StringValue": str(i)}})
                    for i in range(25)]  # fmt: skip
        ids = await asyncio.gather(*(sender.process(message) for message in messages))
    print(len(set(ids)), "messages sent")
    assert len(set(ids)) == 25


if __name__ == "__main__":
    asyncio.run(main())
