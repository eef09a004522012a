"""Write items to DynamoDB and read them back through the batchers.

Run it against AWS (credentials from the standard chain) or a local server:
``AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:8000 python docs/snippets/aws_dynamodb.py``
"""

import asyncio

import aioboto3

from async_batcher.aws.dynamodb import (
    AsyncDynamoDbGetBatcher,
    AsyncDynamoDbWriteBatcher,
    GetItem,
    WriteOperation,
)

REGION = "eu-west-1"
TABLE = "async-batcher-orders"


async def create_table() -> None:
    async with aioboto3.Session().client("dynamodb", region_name=REGION) as client:
        if TABLE not in (await client.list_tables())["TableNames"]:
            await client.create_table(
                TableName=TABLE,
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            await client.get_waiter("table_exists").wait(TableName=TABLE)


def put(i: int) -> WriteOperation:
    return WriteOperation(
        operation="PUT", table_name=TABLE, data={"pk": f"order-{i}", "n": i}
    )


async def main() -> None:
    await create_table()
    async with AsyncDynamoDbWriteBatcher(region_name=REGION) as writer:
        # 100 concurrent writes become 4 BatchWriteItem calls.
        await asyncio.gather(*(writer.process(put(i)) for i in range(100)))
        delete = WriteOperation(
            operation="DELETE", table_name=TABLE, data={"pk": "order-99"}
        )
        await writer.process(delete)

    async with AsyncDynamoDbGetBatcher(region_name=REGION) as reader:
        first, deleted = await asyncio.gather(
            reader.process(GetItem(table_name=TABLE, key={"pk": "order-1"})),
            reader.process(GetItem(table_name=TABLE, key={"pk": "order-99"})),
        )
    print(first, deleted)  # {'n': Decimal('1'), 'pk': 'order-1'} None
    assert first == {"pk": "order-1", "n": 1} and deleted is None


if __name__ == "__main__":
    asyncio.run(main())
