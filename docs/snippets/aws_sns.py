"""Publish to an SNS topic through the batcher (``AWS_ENDPOINT_URL_SNS`` for a local server)."""

import asyncio

import aioboto3
from botocore.exceptions import ClientError

from async_batcher.aws.sns import AsyncSnsPublishBatcher, SnsMessage

REGION = "eu-west-1"


async def main() -> None:
    async with aioboto3.Session().client("sns", region_name=REGION) as client:
        topic_arn = (await client.create_topic(Name="async-batcher-example"))["TopicArn"]
        fifo_arn = (await client.create_topic(Name="async-batcher-example.fifo", Attributes={"FifoTopic": "true"}))[
            "TopicArn"
        ]

    async with AsyncSnsPublishBatcher(topic_arn=topic_arn, region_name=REGION) as publisher:
        # 25 concurrent publishes become 3 PublishBatch calls; each caller gets its message id.
        ids = await asyncio.gather(*(publisher.process(SnsMessage(message=f"event {i}")) for i in range(25)))
        # A message can name another topic; a FIFO topic needs a group id (and a deduplication id unless the
        # topic deduplicates by content).
        ordered = SnsMessage(message="first", topic_arn=fifo_arn, group_id="customer-1", deduplication_id="e-1")
        ids.append(await publisher.process(ordered))
        try:
            await publisher.process(SnsMessage(message="no group", topic_arn=fifo_arn))
        except ClientError as error:  # SNS refused the call for this message: only its caller gets the error
            print("refused:", error.response["Error"]["Code"])  # InvalidParameter
    print(len(set(ids)), "messages published")
    assert len(set(ids)) == 26


if __name__ == "__main__":
    asyncio.run(main())
