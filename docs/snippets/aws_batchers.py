"""DynamoDB writes and reads and SQS sends, batched: python docs/snippets/aws_batchers.py TABLE QUEUE_URL"""

from __future__ import annotations

import asyncio
import sys

from async_batcher.aws.dynamodb.get import AsyncDynamoDbGetBatcher, GetItem
from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher, WriteOperation
from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage


async def main(table: str, queue_url: str) -> None:
    async with AsyncDynamoDbWriteBatcher() as writer:  # 0.2.2's names and keywords
        puts = [WriteOperation(operation="PUT", table_name=table, data={"pk": f"o{i}", "n": i}) for i in range(100)]
        await asyncio.gather(*(writer.process(put) for put in puts))  # BatchWriteItem calls of up to 25 writes
        await writer.process(WriteOperation(operation="DELETE", table_name=table, data={"pk": "o0"}))

    async with AsyncDynamoDbGetBatcher() as reader:
        keys = [GetItem(table_name=table, key={"pk": f"o{i}"}) for i in range(3)]
        items = await asyncio.gather(*(reader.process(key) for key in keys))  # a dict, or None if absent
        print(items)  # [None, {'n': Decimal('1'), 'pk': 'o1'}, {'n': Decimal('2'), 'pk': 'o2'}]

    async with AsyncSqsSendBatcher(queue_url=queue_url) as sender:
        message_ids = await asyncio.gather(*(sender.process(SqsMessage(body=f"order-{i}")) for i in range(25)))
        print(len(message_ids), "messages sent")  # SendMessageBatch calls of up to 10


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
