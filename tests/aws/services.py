"""The four AWS batchers that write or send, behind one interface for the fault tests: make items, read the data
back, and check every caller's outcome against it.

Each :class:`Service` opens admin clients on the real server (DynamoDB Local or moto's server), makes a fresh
table, queue, topic (with an SQS queue subscribed) or stream, and reads it back: DynamoDB with a consistent scan,
SQS with ReceiveMessage, SNS through the subscribed queue, Kinesis with GetRecords from every shard.

:func:`check_outcomes` is the rule every fault test asserts, from the data read back: a caller told "applied" (a
result) has its item there, one told "not applied" (any exception but an ``OutcomeUnknownError``) has not, and
one told "unknown" may have either; an :class:`AbandonedBatchError` is checked item by item through its
``outcome_of``.
"""

from __future__ import annotations

import base64
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aioboto3
import pytest

from async_batcher import OutcomeUnknownError
from async_batcher.aws.base import AwsBatcher
from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher, WriteOperation
from async_batcher.aws.errors import AbandonedBatchError, EntryState
from async_batcher.aws.kinesis import AsyncKinesisPutBatcher, KinesisPutResult, KinesisRecord
from async_batcher.aws.sns import AsyncSnsPublishBatcher, SnsMessage
from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage
from tests.aws.helpers import (
    FAST_RETRY,
    NO_BOTOCORE_RETRY,
    create_queue,
    create_stream,
    create_table,
    create_topic_to_queue,
    read_stream,
    receive_all,
    scan_all,
)
from tools.aws import DynamoDBLocal, MotoServer

KINDS = ["dynamodb", "sqs", "sns", "kinesis"]
# The kinds as fixture parameters: DynamoDB's run on DynamoDB Local, a server beyond Python (the full tier's).
KIND_PARAMS = [pytest.param(kind, marks=pytest.mark.integration) if kind == "dynamodb" else kind for kind in KINDS]

# One session for the admin clients and batchers of these tests: each new session parses the service models
# again (a tenth of a second per client on this machine). A test that registers event handlers makes its own.
SESSION = aioboto3.Session()


def server_for(kind: str, request: pytest.FixtureRequest) -> str:
    """The endpoint of the session's server for ``kind``: DynamoDB Local, or moto's server."""
    server: DynamoDBLocal | MotoServer = request.getfixturevalue(
        "dynamodb_local" if kind == "dynamodb" else "moto_server"
    )
    return server.endpoint_url


def stuck(key: str) -> bool:
    """The keys the partial-failure faults pick: the service fails them, the others it applies."""
    return key in ("m001", "m004")


@dataclass
class Stored:
    """What the service holds: how many times each key is there, and what the service calls each (a message id,
    a shard and sequence number)."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    results: dict[str, set[object]] = field(default_factory=lambda: collections.defaultdict(set))


@dataclass
class Service:
    """One batcher under test, on one server: ``kind`` names it (``"dynamodb"``, ``"sqs"``, ``"sns"``,
    ``"kinesis"``)."""

    kind: str
    endpoint: str
    target: str = ""
    _queue: str = ""  # SNS: the SQS queue subscribed to the topic
    _clients: dict[str, Any] = field(default_factory=dict)

    OPERATIONS: ClassVar[dict[str, str]] = {
        "dynamodb": "BatchWriteItem",
        "sqs": "SendMessageBatch",
        "sns": "PublishBatch",
        "kinesis": "PutRecords",
    }
    THROTTLED: ClassVar[dict[str, str]] = {
        "dynamodb": "ProvisionedThroughputExceededException",
        "sqs": "ThrottlingException",
        "sns": "Throttling",
        "kinesis": "ProvisionedThroughputExceededException",
    }
    FAILING: ClassVar[dict[str, str]] = {
        "dynamodb": "InternalServerError",
        "sqs": "InternalError",
        "sns": "InternalError",
        "kinesis": "InternalFailure",
    }
    # A Failed entry that is the sender's fault (BatchWriteItem has none: it refuses whole calls).
    ENTRY_REFUSED: ClassVar[dict[str, str]] = {
        "sqs": "InvalidMessageContents",
        "sns": "InvalidParameter",
        "kinesis": "InvalidArgumentException",
    }

    @property
    def operation(self) -> str:
        return self.OPERATIONS[self.kind]

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Service]:
        """Admin clients and a fresh target, for the duration."""
        session = SESSION
        async with contextlib.AsyncExitStack() as stack:
            names = {"dynamodb": ["dynamodb"], "sqs": ["sqs"], "sns": ["sns", "sqs"], "kinesis": ["kinesis"]}
            for name in names[self.kind]:
                self._clients[name] = await stack.enter_async_context(session.client(name, endpoint_url=self.endpoint))
            await self.create()
            yield self

    async def create(self) -> None:
        """A fresh table, queue, topic or stream (or, after a server restart, the same name made again)."""
        c = self._clients
        if self.kind == "dynamodb":
            self.target = await create_table(c["dynamodb"])
        elif self.kind == "sqs":
            self.target = await create_queue(c["sqs"])
        elif self.kind == "sns":
            self.target, self._queue = await create_topic_to_queue(c["sns"], c["sqs"])
        else:
            self.target = await create_stream(c["kinesis"], shards=1)

    async def create_again(self) -> None:
        """The same table, queue, topic or stream (same names, so the same URL or ARN), on a server restarted
        without its data."""
        c = self._clients
        if self.kind == "dynamodb":
            raise NotImplementedError("the DynamoDB restart keeps its data (-dbPath)")
        if self.kind in ("sqs", "sns"):
            queue = self.target if self.kind == "sqs" else self._queue
            url = (await c["sqs"].create_queue(QueueName=queue.rsplit("/", 1)[1]))["QueueUrl"]
            assert url == queue
        if self.kind == "sns":
            topic = (await c["sns"].create_topic(Name=self.target.rsplit(":", 1)[1]))["TopicArn"]
            assert topic == self.target
            attributes = await c["sqs"].get_queue_attributes(QueueUrl=self._queue, AttributeNames=["QueueArn"])
            await c["sns"].subscribe(
                TopicArn=topic,
                Protocol="sqs",
                Endpoint=attributes["Attributes"]["QueueArn"],
                Attributes={"RawMessageDelivery": "true"},
            )
        if self.kind == "kinesis":
            await c["kinesis"].create_stream(StreamName=self.target, ShardCount=1)

    def batcher(self, endpoint: str, **kwargs: Any) -> AwsBatcher[Any, Any]:
        kwargs.setdefault("retry", FAST_RETRY)
        kwargs.setdefault("config", NO_BOTOCORE_RETRY)
        kwargs.setdefault("aioboto3_session", SESSION)
        if self.kind == "dynamodb":
            kwargs.setdefault("table_keys", {self.target: ["pk"]})
            return AsyncDynamoDbWriteBatcher(endpoint_url=endpoint, **kwargs)
        if self.kind == "sqs":
            return AsyncSqsSendBatcher(endpoint_url=endpoint, queue_url=self.target, **kwargs)
        if self.kind == "sns":
            return AsyncSnsPublishBatcher(endpoint_url=endpoint, topic_arn=self.target, **kwargs)
        return AsyncKinesisPutBatcher(endpoint_url=endpoint, stream_name=self.target, **kwargs)

    def item(self, key: str, *, size: int = 0) -> Any:
        """The item whose payload is ``key`` (padded with ``size`` bytes)."""
        pad = "x" * size
        if self.kind == "dynamodb":
            return WriteOperation(operation="PUT", table_name=self.target, data={"pk": key, "pad": pad})
        if self.kind == "sqs":
            return SqsMessage(body=key + pad)
        if self.kind == "sns":
            return SnsMessage(message=key + pad)
        return KinesisRecord(data=(key + pad).encode(), partition_key="k")

    def items(self, count: int, prefix: str = "m") -> list[Any]:
        return [self.item(f"{prefix}{i:03d}") for i in range(count)]

    def key(self, item: Any) -> str:
        if self.kind == "dynamodb":
            return str(item.data["pk"])
        if self.kind == "sqs":
            return str(item.body).rstrip("x")
        if self.kind == "sns":
            return str(item.message).rstrip("x")
        return bytes(item.data).decode().rstrip("x")

    def request_keys(self, body: dict[str, Any]) -> list[str]:
        """The keys of a request's entries, in order, as the fault proxy sees them."""
        if self.kind == "dynamodb":
            return [r["PutRequest"]["Item"]["pk"]["S"] for rs in body["RequestItems"].values() for r in rs]
        if self.kind == "sqs":
            return [e["MessageBody"].rstrip("x") for e in body["Entries"]]
        if self.kind == "sns":
            return [e["Message"].rstrip("x") for e in body["PublishBatchRequestEntries"]]
        return [base64.b64decode(r["Data"]).decode().rstrip("x") for r in body["Records"]]

    def entries_where(self, pick: Callable[[str], bool]) -> Callable[[dict[str, Any]], list[int]]:
        """A function of a request: the positions of the entries whose key ``pick`` selects."""
        return lambda body: [i for i, key in enumerate(self.request_keys(body)) if pick(key)]

    async def stored(self) -> Stored:
        """Read the data back (for SQS and SNS, receiving deletes the messages: read once)."""
        c, stored = self._clients, Stored()
        if self.kind == "dynamodb":
            for item in await scan_all(c["dynamodb"], self.target):
                stored.counts[item["pk"]] += 1
                stored.results[item["pk"]].add(None)
        elif self.kind in ("sqs", "sns"):
            queue = self.target if self.kind == "sqs" else self._queue
            for message in await receive_all(c["sqs"], queue):
                key = message["Body"].rstrip("x")
                stored.counts[key] += 1
                # The SQS message id is what an SQS caller gets; an SNS caller's id is SNS's own, not carried.
                stored.results[key].add(message["MessageId"] if self.kind == "sqs" else None)
        else:
            for shard, record in await read_stream(c["kinesis"], self.target):
                key = bytes(record["Data"]).decode().rstrip("x")
                stored.counts[key] += 1
                stored.results[key].add(KinesisPutResult(shard, record["SequenceNumber"]))
        return stored

    def result_matches(self, result: object, stored: Stored, key: str) -> bool:
        """Whether a caller's result names what is stored (SNS: any message id, since it is not carried)."""
        if self.kind == "sns":
            return isinstance(result, str) and bool(result)
        return result in stored.results[key]


def state_of(service: Service, item: Any, outcome: object) -> tuple[EntryState, object]:
    """What a caller was told of its item, and the result it was given (or the error)."""
    if isinstance(outcome, AbandonedBatchError):
        known = outcome.outcome_of(item)
        return known.state, known.result if known.state == "applied" else known.error
    if isinstance(outcome, OutcomeUnknownError):
        return "unknown", outcome
    if isinstance(outcome, BaseException):
        return "not applied", outcome
    return "applied", outcome


def check_outcomes(
    service: Service, items: list[Any], outcomes: list[object], stored: Stored, *, duplicates: bool = False
) -> dict[str, EntryState]:
    """Assert the rule (module docstring) for every caller against the data read back; return each key's state.

    Without ``duplicates`` no key may be there twice (a fault that makes a call go out twice, as botocore's own
    retry after a lost answer does, allows it).
    """
    assert len(items) == len(outcomes)
    states: dict[str, EntryState] = {}
    keys = [service.key(item) for item in items]
    for item, key, outcome in zip(items, keys, outcomes, strict=True):
        state, detail = state_of(service, item, outcome)
        if state == "applied":
            assert stored.counts[key] >= 1, f"{key}: the caller was told it was applied ({detail!r}); it is not there"
            assert service.result_matches(detail, stored, key), f"{key}: {detail!r} is not what is stored"
        elif state == "not applied":
            assert stored.counts[key] == 0, f"{key}: the caller was told {detail!r}, but it is there"
        states[key] = state
    unknown_keys = set(stored.counts) - set(keys)
    assert not unknown_keys, f"the service holds items no caller submitted: {sorted(unknown_keys)[:5]}"
    if not duplicates:
        twice = [key for key, n in stored.counts.items() if n > 1]
        assert not twice, f"stored more than once: {twice[:5]}"
    return states
