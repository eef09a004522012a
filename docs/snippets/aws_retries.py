"""How many requests an item may cost, and how to change it.

The batcher retries what botocore never retries (``UnprocessedItems``, ``Failed``
entries, failed records) and throttling that outlasted botocore; botocore retries
inside each call. Unless the ``config`` you give sets its own ``retries``, the
batchers use botocore's standard mode with 2 attempts.
"""

import asyncio

from aiobotocore.config import AioConfig

from async_batcher.aws.base import BOTOCORE_RETRIES
from async_batcher.aws.retry import RetryPolicy
from async_batcher.aws.sqs import AsyncSqsSendBatcher

QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


async def main() -> None:
    assert BOTOCORE_RETRIES == {"mode": "standard", "total_max_attempts": 2}
    default = AsyncSqsSendBatcher(queue_url=QUEUE_URL, region_name="eu-west-1")
    # RetryPolicy(max_attempts=10, base_delay=0.05, max_delay=5.0): 2 x 10 requests
    print(default.retry)

    # Fewer, longer waits, and botocore's adaptive mode (client-side rate limiting)
    # with 3 attempts per call: at most 3 x 5 = 15 requests for an item.
    patient = AsyncSqsSendBatcher(
        queue_url=QUEUE_URL,
        region_name="eu-west-1",
        retry=RetryPolicy(max_attempts=5, base_delay=0.2, max_delay=10.0),
        config=AioConfig(
            retries={"mode": "adaptive", "total_max_attempts": 3}, read_timeout=10
        ),
    )
    print(patient.retry.max_attempts * 3, "requests per item at most")


if __name__ == "__main__":
    asyncio.run(main())
