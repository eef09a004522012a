"""Put records into a Kinesis stream through the batcher.

``AWS_ENDPOINT_URL_KINESIS`` points it at a local server.
"""

import asyncio
import json

import aioboto3

from async_batcher.aws.kinesis import AsyncKinesisPutBatcher, KinesisRecord

REGION = "eu-west-1"
STREAM = "async-batcher-example"


async def create_stream() -> None:
    async with aioboto3.Session().client("kinesis", region_name=REGION) as client:
        if STREAM not in (await client.list_streams())["StreamNames"]:
            await client.create_stream(StreamName=STREAM, ShardCount=1)
            await client.get_waiter("stream_exists").wait(StreamName=STREAM)


def click(i: int) -> KinesisRecord:
    return KinesisRecord(data=json.dumps({"click": i}), partition_key=f"user-{i % 10}")


async def main() -> None:
    await create_stream()
    async with AsyncKinesisPutBatcher(stream_name=STREAM, region_name=REGION) as putter:
        # 1000 concurrent puts become 2 PutRecords calls;
        # each caller learns its record's shard and sequence number.
        results = await asyncio.gather(*(putter.process(click(i)) for i in range(1000)))
    print(results[0])  # KinesisPutResult(shard_id='shardId-000000000000', ...)
    assert len({result.sequence_number for result in results}) == 1000


if __name__ == "__main__":
    asyncio.run(main())
