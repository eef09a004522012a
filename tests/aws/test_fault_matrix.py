"""The fault matrix of the AWS batchers that write or send: DynamoDB writes, SQS, SNS and Kinesis, each against its
real server (DynamoDB Local, moto's server) through the fault proxy, under every fault a call can meet.

Each cell sends one batch of six items through the proxy, reads the table, queue, topic (through a subscribed
queue) or stream back, and asserts from that data (:func:`tests.aws.services.check_outcomes`) that no caller was
told "applied" for what is not there, none "not applied" for what is, and that the callers of each cell got the
outcome it calls for. A stop in the middle of a call is in ``test_stops.py``; a server restart in
``test_restarts.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from async_batcher.aws.errors import AwsOutcomeUnknownError, BatchEntryError, RetriesExhaustedError
from async_batcher.aws.retry import RetryPolicy
from tests.aws.faultproxy import Disconnect, FaultProxy, Reply, Rule, Withhold, first_calls
from tests.aws.services import KIND_PARAMS, KINDS, Service, check_outcomes, server_for, stuck

pytestmark = pytest.mark.single_loop

# Few attempts, tiny waits: a cell that exhausts them stays quick.
RETRY = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.004)

# botocore's own retries, as the batchers set them by default (2 attempts, standard mode), with short timeouts.
BOTOCORE_RETRIES = AioConfig(retries={"mode": "standard", "total_max_attempts": 2}, connect_timeout=2, read_timeout=20)


@pytest.fixture(params=KIND_PARAMS)
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


@dataclass(frozen=True)
class Cell:
    """One fault: the proxy's rules for it, the outcome each caller must get, and the botocore settings."""

    name: str
    rules: Callable[[Service], list[Rule]]
    expect: Callable[[Service, str, object], bool]
    """(service, key, outcome) -> whether that caller got what the cell calls for."""
    config: AioConfig | None = None
    duplicates: bool = False
    kinds: tuple[str, ...] = tuple(KINDS)


def applied(service: Service, key: str, outcome: object) -> bool:
    return not isinstance(outcome, BaseException)


def of_type(kind: type[BaseException]) -> Callable[[Service, str, object], bool]:
    return lambda service, key, outcome: isinstance(outcome, kind)


def client_error(code: str) -> Callable[[Service, str, object], bool]:
    return lambda service, key, outcome: isinstance(outcome, ClientError) and outcome.response["Error"]["Code"] == code


def stuck_ones(
    stuck_outcome: Callable[[Service, str, object], bool],
) -> Callable[[Service, str, object], bool]:
    return lambda service, key, outcome: (
        stuck_outcome(service, key, outcome) if stuck(key) else applied(service, key, outcome)
    )


def cause_is(kind: type[BaseException]) -> Callable[[Service, str, object], bool]:
    return lambda service, key, outcome: (
        isinstance(outcome, AwsOutcomeUnknownError) and isinstance(outcome.__cause__, kind)
    )


CELLS = [
    # The whole call refused, with an answer.
    Cell("throttled, then answered", lambda s: [first_calls(s.operation, 2, Reply(s.THROTTLED[s.kind]))], applied),
    Cell("5xx, then answered", lambda s: [first_calls(s.operation, 2, Reply(s.FAILING[s.kind], 500))], applied),
    Cell(
        "throttled every time",
        lambda s: [first_calls(s.operation, 100, Reply(s.THROTTLED[s.kind]))],
        of_type(RetriesExhaustedError),
    ),
    # A 5xx does not say whether the service applied the call before failing: the batcher gives up "unknown".
    Cell(
        "5xx every time",
        lambda s: [first_calls(s.operation, 100, Reply(s.FAILING[s.kind], 503))],
        cause_is(RetriesExhaustedError),
    ),
    Cell(
        "refused for good (not retryable)",
        lambda s: [first_calls(s.operation, 100, Reply("AccessDenied", 403))],
        client_error("AccessDenied"),
    ),
    # The connection cut in the middle of the call: before the server saw it, or after it applied it.
    Cell(
        "connection cut before the server",
        lambda s: [first_calls(s.operation, 1, Disconnect())],
        of_type(AwsOutcomeUnknownError),
    ),
    Cell(
        "connection cut after the server applied it",
        lambda s: [first_calls(s.operation, 1, Disconnect(after_forwarding=True))],
        of_type(AwsOutcomeUnknownError),
    ),
    # botocore retries a lost answer itself: the call goes out twice. Each caller is told "applied", rightly;
    # the messages and records are there twice (a DynamoDB put, once).
    Cell(
        "answer lost, botocore retries",
        lambda s: [first_calls(s.operation, 1, Disconnect(after_forwarding=True))],
        applied,
        config=BOTOCORE_RETRIES,
        duplicates=True,
    ),
    # Partial failure: some entries failed on the service's side (UnprocessedItems, a Failed entry, a record
    # with an ErrorCode), the others applied.
    Cell(
        "some entries failed by the service, then applied",
        lambda s: [first_calls(s.operation, 2, lambda body: Withhold(s.entries_where(stuck)(body)))],
        applied,
    ),
    Cell(
        "some entries failed by the service every time",
        lambda s: [first_calls(s.operation, 100, lambda body: Withhold(s.entries_where(stuck)(body)))],
        stuck_ones(of_type(RetriesExhaustedError)),
    ),
    Cell(
        "some entries refused as the sender's fault",
        lambda s: [
            first_calls(
                s.operation,
                100,
                lambda body: Withhold(s.entries_where(stuck)(body), code=s.ENTRY_REFUSED[s.kind], sender_fault=True),
            )
        ],
        stuck_ones(of_type(BatchEntryError)),
        kinds=("sqs", "sns", "kinesis"),
    ),
]


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.name)
async def test_each_caller_is_told_what_the_data_says(kind: str, cell: Cell, request: pytest.FixtureRequest) -> None:
    if kind not in cell.kinds:
        pytest.skip(f"{kind} has no such fault")
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        proxy.rules.extend(cell.rules(service))
        items = service.items(6)
        settings: dict[str, Any] = {"retry": RETRY, "max_batch_size": 6}
        if cell.config is not None:
            settings["config"] = cell.config
        async with service.batcher(proxy.url, **settings) as batcher:
            outcomes = await asyncio.gather(*(batcher.process(item) for item in items), return_exceptions=True)
        stored = await service.stored()
    check_outcomes(service, items, outcomes, stored, duplicates=cell.duplicates)
    wrong = {
        service.key(item): outcome
        for item, outcome in zip(items, outcomes, strict=True)
        if not cell.expect(service, service.key(item), outcome)
    }
    assert not wrong, f"{cell.name}: callers told otherwise: {wrong}"
    if cell.name == "connection cut after the server applied it":
        assert sum(stored.counts.values()) == 6  # the test cut what it meant to: the server applied all six
    if cell.name == "connection cut before the server":
        assert not stored.counts
