"""Publish to an SNS topic through the batcher.

``AWS_ENDPOINT_URL_SNS`` points it at a local server.
"""

import asyncio

import aioboto3
from botocore.exceptions import ClientError

from async_batcher.aws.sns import AsyncSnsPublishBatcher, SnsMessage

REGION = "eu-west-1"


async def create_topics() -> tuple[str, str]:
    async with aioboto3.Session().client("sns", region_name=REGION) as client:
        topic = await client.create_topic(Name="async-batcher-example")
        fifo = await client.create_topic(
            Name="async-batcher-example.fifo", Attributes={"FifoTopic": "true"}
        )
    return topic["TopicArn"], fifo["TopicArn"]


async def main() -> None:
    topic_arn, fifo_arn = await create_topics()
    async with AsyncSnsPublishBatcher(topic_arn=topic_arn, region_name=REGION) as sns:
        # 25 concurrent publishes become 3 PublishBatch calls;
        # each caller gets its message id.
        events = [SnsMessage(message=f"event {i}") for i in range(25)]
        ids = await asyncio.gather(*(sns.process(event) for event in events))
        # A message can name another topic. A FIFO topic needs a group id (and a
        # deduplication id unless the topic deduplicates by content).
        ordered = SnsMessage(
            message="first",
            topic_arn=fifo_arn,
            group_id="customer-1",
            deduplication_id="e-1",
        )
        ids.append(await sns.process(ordered))
        try:
            await sns.process(SnsMessage(message="no group", topic_arn=fifo_arn))
        except ClientError as error:  # refused for this message: its caller only
            print("refused:", error.response["Error"]["Code"])  # InvalidParameter
    print(len(set(ids)), "messages published")
    assert len(set(ids)) == 26


if __name__ == "__main__":
    asyncio.run(main())
