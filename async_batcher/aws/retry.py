"""Backoff for AWS batch calls: which errors are worth another try, and how long to wait before it.

The batch APIs of DynamoDB and SQS can succeed for part of a request (``UnprocessedItems``,
``UnprocessedKeys``, ``Failed`` entries) or refuse all of it because the table or the account is over its
throughput. Both mean "the same request, later". AWS advises exponential backoff with *full jitter*: wait a
uniform random time in ``[0, min(max_delay, base_delay * 2**n))`` so that many clients that were throttled
together do not all come back together.

botocore has retries of its own inside each call (they also cover connection errors, which this layer leaves
to botocore). This layer sits on top: it retries what botocore never retries (partial results) and the
throttling errors that outlasted botocore's attempts. ``RetryPolicy.max_attempts`` bounds the calls made for
one item by this layer; each call may itself make up to botocore's ``total_max_attempts`` HTTP requests. The
batchers give botocore 2 attempts in its ``standard`` mode unless their ``config`` says otherwise (see
:data:`async_batcher.aws.base.BOTOCORE_RETRIES`): with the default ``RetryPolicy`` an item costs at most
2 x 10 = 20 HTTP requests, where botocore's ``legacy`` default for DynamoDB (10 attempts) would allow 100.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "RETRYABLE_ERROR_CODES",
    "RETRYABLE_STATUS_CODES",
    "RetryPolicy",
    "is_retryable_error",
]

#: Error codes that mean "the service is fine, try again later": throughput limits and transient service faults.
#: Compared case-sensitively with the ``Error.Code`` botocore parses. The first group is botocore's own (its
#: standard retry mode's throttling and transient codes, and the codes of ``botocore/data/_retry.json`` for the
#: services here), copied so that this module imports no SDK; tests/aws/test_retry.py fails when botocore's
#: lists gain a code this set lacks. The second group is what the services batched here answer when throttled or
#: failing on their side and botocore leaves to the status code.
RETRYABLE_ERROR_CODES: frozenset[str] = frozenset(
    {
        # botocore: retries.standard (throttled + transient) and _retry.json (general, dynamodb, sqs, kinesis)
        "BandwidthLimitExceeded",
        "EC2ThrottledException",
        "LimitExceededException",
        "PriorRequestNotComplete",
        "ProvisionedThroughputExceededException",
        "ReplicatedWriteConflictException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
        "SlowDown",
        "ThrottledException",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "TransactionInProgressException",
        # the services' own: DynamoDB, SQS, SNS, Kinesis
        "AWS.SimpleQueueService.ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "InternalFailureException",
        "InternalServerError",
        "KMSThrottling",
        "KMSThrottlingException",
        "KmsThrottled",
        "ServiceUnavailable",
        "Throttled",
    }
)

RETRYABLE_STATUS_CODES: frozenset[int] = frozenset({429, 500, 502, 503, 504, 509})
"""HTTP statuses botocore retries whatever the code (``_retry.json`` and the standard mode); any other 5xx is
retried here too."""


def is_retryable_error(error: BaseException) -> bool:
    """Whether ``error`` (a botocore ``ClientError`` or anything else) is a throttling or transient 5xx error.

    Only errors the service answered with count: a connection error or a timeout is botocore's to retry, and
    anything else is a real failure that waiting would not cure.
    """
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    code = response.get("Error", {}).get("Code")
    if code in RETRYABLE_ERROR_CODES:
        return True
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return isinstance(status, int) and (status in RETRYABLE_STATUS_CODES or status >= 500)


@dataclass(frozen=True)
class RetryPolicy:
    """How many calls to make for one item and how long to wait between them.

    Args:
        max_attempts: calls made for an item before its caller gets ``RetriesExhaustedError`` (>= 1; 1 means
            no retry).
        base_delay: seconds; the upper bound of the first wait. The bound doubles with each retry.
        max_delay: seconds; the cap of that bound.
        jitter: a function returning a float in [0, 1); the wait is ``jitter() * bound`` (full jitter).
            Tests pass a fixed function to make the waits exact.
    """

    max_attempts: int = 10
    base_delay: float = 0.05
    max_delay: float = 5.0
    jitter: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        if not self.base_delay >= 0:
            raise ValueError(f"base_delay must be >= 0, got {self.base_delay!r}")
        if not self.max_delay >= 0:
            raise ValueError(f"max_delay must be >= 0, got {self.max_delay!r}")

    def backoff_bound(self, retry: int) -> float:
        """The upper bound of the wait before retry number ``retry`` (1 for the first retry)."""
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, got {retry!r}")
        # Cap the exponent so that 2**n stays a small float for any retry count.
        return min(self.max_delay, self.base_delay * 2.0 ** min(retry - 1, 64))

    def backoff(self, retry: int) -> float:
        """A full-jitter wait before retry number ``retry``: uniform in ``[0, backoff_bound(retry))``."""
        return self.jitter() * self.backoff_bound(retry)
