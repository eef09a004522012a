"""AWS batchers (extra ``[aws]``, which installs aioboto3).

* :mod:`async_batcher.aws.dynamodb.write`: ``AsyncDynamoDbWriteBatcher`` (``BatchWriteItem``)
* :mod:`async_batcher.aws.dynamodb.get`: ``AsyncDynamoDbGetBatcher`` (``BatchGetItem``)
* :mod:`async_batcher.aws.sqs`: ``AsyncSqsSendBatcher`` (``SendMessageBatch``)
* :mod:`async_batcher.aws.sns`: ``AsyncSnsPublishBatcher`` (``PublishBatch``)
* :mod:`async_batcher.aws.kinesis`: ``AsyncKinesisPutBatcher`` (``PutRecords``)

None of them loses an item silently: throttling and partial results are retried with exponential backoff and
full jitter up to a limit, a call refused because of one bad item is bisected so only that item's caller gets
the error, and every caller gets its own outcome. This package itself imports nothing from aioboto3 (so the
retry policy is usable without it); the batcher modules do, and say which extra to install when it is missing.
"""
