"""DynamoDB: batch writes into ``BatchWriteItem`` and reads into ``BatchGetItem``. Needs the ``[aws]`` extra.

The module paths of async-batcher 0.2.2 stay: ``async_batcher.aws.dynamodb.write.AsyncDynamoDbWriteBatcher``
and ``async_batcher.aws.dynamodb.get.AsyncDynamoDbGetBatcher``.
"""

from __future__ import annotations

from async_batcher.aws.dynamodb.get import AsyncDynamoDbGetBatcher, GetItem
from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher, WriteOperation

__all__ = ["AsyncDynamoDbGetBatcher", "AsyncDynamoDbWriteBatcher", "GetItem", "WriteOperation"]
