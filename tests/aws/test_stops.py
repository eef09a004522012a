"""A stop that cuts a batch off (``stop(force=True)``, an expired ``stop(timeout=...)``) at every moment of its
calls, for the four AWS batchers that write or send, against their real servers through the fault proxy.

Issue 26, item 8: with ``SendMessageBatch`` in flight, a forced stop told five callers ``BatcherStoppedError``
("not processed": a client retries) though all five messages were in the queue. Now a caller of a batch any item
of which may have been applied gets an :class:`AbandonedBatchError` (an ``OutcomeUnknownError``) whose
``outcome_of(item)`` says what became of that caller's item; a batch none of whose items can have been applied
still gives the plain ``BatcherStoppedError``. Every test reads the data back and checks each caller against it
(:func:`tests.aws.services.check_outcomes`); every wait is bounded, so a hang fails.

The moments: the first call under way (its request held by the proxy before or after the server applied it);
the wait before a retry, after a partial failure (some items applied and answered), after a throttled call
(nothing applied), after a 5xx (unknown); a retry under way; for DynamoDB, the key schema still being read, and
a second round of writes to one key not yet sent; for a FIFO queue, a later call not yet sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aioboto3
import pytest

from async_batcher import BatcherStoppedError, OutcomeUnknownError
from async_batcher.aws.base import AwsBatcher
from async_batcher.aws.dynamodb.get import AsyncDynamoDbGetBatcher, GetItem
from async_batcher.aws.dynamodb.write import WriteOperation
from async_batcher.aws.errors import AbandonedBatchError, AwsOutcomeUnknownError, EntryOutcome
from async_batcher.aws.retry import RetryPolicy
from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage
from tests.aws.faultproxy import FaultProxy, Hold, Reply, Rule, Withhold, first_calls
from tests.aws.helpers import NO_BOTOCORE_RETRY, create_queue, receive_all
from tests.aws.services import KIND_PARAMS, SESSION, Service, Stored, check_outcomes, server_for, state_of, stuck

pytestmark = pytest.mark.single_loop

RETRY = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.004)
WAIT = 20.0  # seconds: the most any step may take before the test fails as hung


class Gate:
    """Replaces a batcher's wait between attempts: ``waiting`` is set when a retry is due, and the wait never
    ends (until the stop cancels it)."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self._never = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.waiting.set()
        await self._never.wait()


def nth_call(operation: str, n: int, fault: Any) -> Rule:
    """A rule that injects ``fault`` into the ``n``-th call of ``operation`` only."""
    seen = 0

    def rule(op: str, body: dict[str, Any]) -> Any:
        nonlocal seen
        if op != operation:
            return None
        seen += 1
        return fault if seen == n else None

    return rule


async def stopped_when(
    batcher: AwsBatcher[Any, Any],
    items: list[Any],
    ready: asyncio.Event,
    *,
    gate: Gate | None = None,
    stop: Callable[[AwsBatcher[Any, Any]], Awaitable[None]] = lambda b: b.stop(force=True),
) -> list[object]:
    """Submit ``items`` at once, stop the batcher once ``ready`` is set, and return every caller's outcome."""
    if gate is not None:
        batcher._sleep = gate.sleep
    async with batcher:
        calls = [asyncio.ensure_future(batcher.process(item)) for item in items]
        await asyncio.wait_for(ready.wait(), WAIT)
        assert not any(call.done() for call in calls), "a caller had its outcome before the stop: nothing is tested"
        await asyncio.wait_for(stop(batcher), WAIT)
        return list(await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT))


def states(service: Service, items: list[Any], outcomes: list[object]) -> list[str]:
    return [state_of(service, item, outcome)[0] for item, outcome in zip(items, outcomes, strict=True)]


def assert_abandoned(outcomes: list[object]) -> None:
    """One AbandonedBatchError for every caller of the batch, caused by the stop."""
    assert all(isinstance(o, AbandonedBatchError) for o in outcomes), outcomes
    assert len({id(o) for o in outcomes}) == 1
    error = outcomes[0]
    assert isinstance(error, AbandonedBatchError)
    assert isinstance(error.__cause__, BatcherStoppedError)
    assert not isinstance(error, BatcherStoppedError)  # a client that retries on "stopped" must not retry these


@pytest.fixture(params=KIND_PARAMS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("forward", [True, False], ids=["applied", "not-yet-at-the-server"])
async def test_a_stop_while_the_first_call_is_under_way(
    kind: str, forward: bool, request: pytest.FixtureRequest
) -> None:
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        hold = Hold(forward=forward)
        proxy.rules.append(first_calls(service.operation, 1, hold))
        items = service.items(5)
        outcomes = await stopped_when(service.batcher(proxy.url, retry=RETRY, max_batch_size=5), items, hold.reached)
        if forward:  # (a request held before the server stays so: the proxy drops it when it closes)
            hold.release()
        stored = await service.stored()
    check_outcomes(service, items, outcomes, stored)
    assert_abandoned(outcomes)
    assert states(service, items, outcomes) == ["unknown"] * 5
    assert sum(stored.counts.values()) == (5 if forward else 0)  # issue 26: all five were there


async def test_a_stop_in_the_wait_after_a_partial_failure(kind: str, request: pytest.FixtureRequest) -> None:
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        proxy.rules.append(first_calls(service.operation, 1, lambda body: Withhold(service.entries_where(stuck)(body))))
        items, gate = service.items(6), Gate()
        batcher = service.batcher(proxy.url, retry=RETRY, max_batch_size=6)
        outcomes = await stopped_when(batcher, items, gate.waiting, gate=gate)
        stored = await service.stored()
    check_outcomes(service, items, outcomes, stored)
    assert_abandoned(outcomes)
    # The items the service applied and answered are "applied", with what their callers would have got; those it
    # left unprocessed are "not applied": they may be sent again.
    expected = ["not applied" if stuck(service.key(item)) else "applied" for item in items]
    assert states(service, items, outcomes) == expected
    assert sum(stored.counts.values()) == 4


@pytest.mark.parametrize(("status", "unknown"), [(400, False), (503, True)], ids=["throttled", "5xx"])
async def test_a_stop_in_the_wait_after_a_refused_call(
    kind: str, status: int, unknown: bool, request: pytest.FixtureRequest
) -> None:
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        code = service.THROTTLED[kind] if status == 400 else service.FAILING[kind]
        proxy.rules.append(first_calls(service.operation, 1, Reply(code, status)))
        items, gate = service.items(4), Gate()
        outcomes = await stopped_when(service.batcher(proxy.url, retry=RETRY), items, gate.waiting, gate=gate)
        stored = await service.stored()
    check_outcomes(service, items, outcomes, stored)
    assert not stored.counts
    if unknown:  # a 5xx does not say whether the service applied the call before failing
        assert_abandoned(outcomes)
        assert states(service, items, outcomes) == ["unknown"] * 4
    else:  # throttled: nothing was applied, and the callers may send again
        assert all(type(o) is BatcherStoppedError for o in outcomes), outcomes
        assert "force=True" in str(outcomes[0])


async def test_a_stop_while_a_retry_is_under_way(kind: str, request: pytest.FixtureRequest) -> None:
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        hold = Hold(forward=True)
        proxy.rules.append(nth_call(service.operation, 2, hold))
        proxy.rules.append(first_calls(service.operation, 1, lambda body: Withhold(service.entries_where(stuck)(body))))
        items = service.items(6)
        outcomes = await stopped_when(service.batcher(proxy.url, retry=RETRY, max_batch_size=6), items, hold.reached)
        hold.release()
        stored = await service.stored()
    check_outcomes(service, items, outcomes, stored)
    assert_abandoned(outcomes)
    expected = ["unknown" if stuck(service.key(item)) else "applied" for item in items]
    assert states(service, items, outcomes) == expected
    assert sum(stored.counts.values()) == 6


async def test_an_expired_stop_timeout_is_a_stop_too(kind: str, request: pytest.FixtureRequest) -> None:
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        hold = Hold(forward=True)
        proxy.rules.append(first_calls(service.operation, 1, hold))
        items = service.items(3)
        outcomes = await stopped_when(
            service.batcher(proxy.url, retry=RETRY), items, hold.reached, stop=lambda b: b.stop(timeout=0.05)
        )
        hold.release()
        stored = await service.stored()
    check_outcomes(service, items, outcomes, stored)
    assert_abandoned(outcomes)
    assert "stop(timeout=0.05) expired" in str(outcomes[0].__cause__)  # type: ignore[union-attr]
    assert sum(stored.counts.values()) == 3


SIZES = {"dynamodb": 390_000, "sqs": 120_000, "sns": 120_000, "kinesis": 1_000_000}


async def test_a_stop_with_calls_at_their_size_limit(kind: str, request: pytest.FixtureRequest) -> None:
    """Items so large that a call holds two of them (Kinesis: five); the second call is held when the stop comes.
    The batch's other calls ran concurrently (DynamoDB, a standard queue or topic) and were answered, or, one
    after the other (Kinesis), were never sent."""
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        hold = Hold(forward=True)
        proxy.rules.append(nth_call(service.operation, 2, hold))
        items = [service.item(f"m{i:03d}", size=SIZES[kind]) for i in range(6)]
        settings: dict[str, Any] = {"retry": RETRY, "max_batch_size": 6}
        if kind == "dynamodb":
            settings["max_request_bytes"] = 1_000_000
        # Ready once the held call is at the proxy and the batch's other calls were answered (Kinesis: the one
        # before it; the others: the two that run beside it). botocore's after-call comes once the client has
        # the answer, and the batcher records it before it next yields.
        session = service_session()
        answered: list[str] = []
        ready = asyncio.Event()

        def after_call(event_name: str, **_: Any) -> None:
            if event_name.endswith("." + service.operation):
                answered.append(event_name)
                if len(answered) == (1 if kind == "kinesis" else 2) and hold.reached.is_set():
                    ready.set()

        async def held() -> None:
            await hold.reached.wait()
            if len(answered) == (1 if kind == "kinesis" else 2):
                ready.set()

        session.events.register("after-call", after_call)
        watcher = asyncio.ensure_future(held())
        batcher = service.batcher(proxy.url, aioboto3_session=session, **settings)
        outcomes = await stopped_when(batcher, items, ready)
        hold.release()
        stored = await service.stored()
    check_outcomes(service, items, outcomes, stored)
    assert_abandoned(outcomes)
    found = states(service, items, outcomes)
    assert watcher.done()
    if kind == "kinesis":  # 5 records per 5 MiB call: the first call answered, the second held
        assert found == ["applied"] * 5 + ["unknown"]
    else:  # three calls of two: one held, two answered
        assert sorted(found) == ["applied"] * 4 + ["unknown"] * 2


async def test_dynamodb_a_stop_while_the_key_schema_is_read_sends_nothing(dynamodb_local: Any) -> None:
    endpoint = dynamodb_local.endpoint_url
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service("dynamodb", endpoint).opened() as service:
        hold = Hold(forward=False)
        proxy.rules.append(first_calls("DescribeTable", 1, hold))
        items = service.items(3)
        batcher = service.batcher(proxy.url, retry=RETRY, table_keys=None)
        outcomes = await stopped_when(batcher, items, hold.reached)
        stored = await service.stored()
    assert all(type(o) is BatcherStoppedError for o in outcomes), outcomes
    check_outcomes(service, items, outcomes, stored)
    assert proxy.calls("BatchWriteItem") == []


async def test_dynamodb_a_stop_before_the_second_round_to_a_key(dynamodb_local: Any) -> None:
    """Two writes to one key go in two rounds; the stop comes while the first is under way: the second was never
    sent."""
    endpoint = dynamodb_local.endpoint_url
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service("dynamodb", endpoint).opened() as service:
        hold = Hold(forward=True)
        proxy.rules.append(first_calls("BatchWriteItem", 1, hold))
        first = WriteOperation(operation="PUT", table_name=service.target, data={"pk": "k", "v": 1})
        second = WriteOperation(operation="PUT", table_name=service.target, data={"pk": "k", "v": 2})
        other = WriteOperation(operation="PUT", table_name=service.target, data={"pk": "other", "v": 1})
        outcomes = await stopped_when(service.batcher(proxy.url, retry=RETRY), [first, second, other], hold.reached)
        hold.release()
        admin = service._clients["dynamodb"]
        rows = {r["pk"]["S"]: r["v"]["N"] for r in (await admin.scan(TableName=service.target))["Items"]}
    assert_abandoned(outcomes)
    error = outcomes[0]
    assert isinstance(error, AbandonedBatchError)
    assert [error.outcome_of(op).state for op in (first, second, other)] == ["unknown", "not applied", "unknown"]
    assert rows == {"k": "1", "other": "1"}  # the first round, applied; the second, never sent


async def test_sqs_fifo_a_stop_before_a_later_call_of_the_batch(moto_server: Any) -> None:
    """A FIFO queue's calls go one after the other: with the first held, the second was never sent."""
    endpoint = moto_server.endpoint_url
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service("sqs", endpoint).opened() as service:
        fifo = await create_queue(service._clients["sqs"], fifo=True)
        hold = Hold(forward=True)
        proxy.rules.append(first_calls("SendMessageBatch", 1, hold))
        messages = [
            SqsMessage(queue_url=fifo, body=f"m{i:03d}", group_id="g", deduplication_id=f"d{i}") for i in range(12)
        ]
        batcher = service.batcher(proxy.url, retry=RETRY, max_batch_size=12)
        outcomes = await stopped_when(batcher, messages, hold.reached)
        hold.release()
        received = [m["Body"] for m in await receive_all(service._clients["sqs"], fifo)]
    assert_abandoned(outcomes)
    error = outcomes[0]
    assert isinstance(error, AbandonedBatchError)
    assert [error.outcome_of(m).state for m in messages] == ["unknown"] * 10 + ["not applied"] * 2
    assert received == [f"m{i:03d}" for i in range(10)]


async def test_dynamodb_reads_a_stop_gives_the_plain_stop_error(dynamodb_local: Any) -> None:
    """A read changes nothing: its callers may simply read again."""
    endpoint = dynamodb_local.endpoint_url
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service("dynamodb", endpoint).opened() as service:
        hold = Hold(forward=True)
        proxy.rules.append(first_calls("BatchGetItem", 1, hold))
        reader = AsyncDynamoDbGetBatcher(
            endpoint_url=proxy.url, config=NO_BOTOCORE_RETRY, retry=RETRY, aioboto3_session=SESSION
        )
        reads = [GetItem(table_name=service.target, key={"pk": f"k{i}"}) for i in range(3)]
        outcomes = await stopped_when(reader, reads, hold.reached)  # type: ignore[arg-type]
    assert all(type(o) is BatcherStoppedError for o in outcomes), outcomes


def service_session() -> Any:
    return aioboto3.Session()


async def test_sqs_the_same_message_object_twice_in_a_batch(moto_server: Any) -> None:
    """One SqsMessage object submitted twice: one submission applied, the other left unprocessed when the stop
    comes; outcome_of cannot tell the two callers apart, so it says "unknown"."""
    endpoint = moto_server.endpoint_url
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service("sqs", endpoint).opened() as service:
        proxy.rules.append(first_calls("SendMessageBatch", 1, Withhold([0])))
        twice, once = SqsMessage(body="twice"), SqsMessage(body="once")
        gate = Gate()
        outcomes = await stopped_when(
            service.batcher(proxy.url, retry=RETRY), [twice, twice, once], gate.waiting, gate=gate
        )
        received = [m["Body"] for m in await receive_all(service._clients["sqs"], service.target)]
    assert_abandoned(outcomes)
    error = outcomes[0]
    assert isinstance(error, AbandonedBatchError)
    assert error.outcome_of(twice).state == "unknown"
    assert error.outcome_of(once).state == "applied"
    assert error.outcome_of(once).result is not None
    assert sorted(received) == ["once", "twice"]
    with pytest.raises(ValueError, match="is not an item of this batch"):
        error.outcome_of(SqsMessage(body="once"))  # equal, but not the object submitted


async def test_callers_cancelled_or_timed_out_mid_retry_leave_the_others_right(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A caller that leaves while its batch waits to retry does not take its item back (it is already in a call);
    the others still get their outcomes, which the data bears out, and the batcher stops cleanly."""
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        proxy.rules.append(first_calls(service.operation, 1, lambda body: Withhold(service.entries_where(stuck)(body))))
        items = service.items(6)
        release = asyncio.Event()
        waiting = asyncio.Event()

        async def gated_sleep(seconds: float) -> None:
            waiting.set()
            await release.wait()

        batcher = service.batcher(proxy.url, retry=RETRY, max_batch_size=6)
        batcher._sleep = gated_sleep
        async with batcher:
            calls = [
                asyncio.ensure_future(batcher.process(item, timeout=0.05 if i == 3 else None))
                for i, item in enumerate(items)
            ]
            await asyncio.wait_for(waiting.wait(), WAIT)
            calls[1].cancel()  # a stuck one: in the retry
            calls[2].cancel()  # an applied one
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(calls[3], WAIT)  # an applied one, whose timeout expires in the wait
            release.set()
            outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)
        stored = await service.stored()
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert isinstance(outcomes[2], asyncio.CancelledError)
    assert isinstance(outcomes[3], TimeoutError)
    left = (1, 2, 3)
    kept = [i for i in range(6) if i not in left]
    check_outcomes(
        service, [items[i] for i in kept], [outcomes[i] for i in kept], _without(stored, service, items, left)
    )
    assert all(not isinstance(outcomes[i], BaseException) for i in kept)
    # The items of the callers who left went out all the same: the retry carried the stuck one.
    assert [stored.counts[service.key(items[i])] for i in left] == [1, 1, 1]
    assert not any(isinstance(o, OutcomeUnknownError) for o in outcomes)


def _without(stored: Any, service: Service, items: list[Any], indices: tuple[int, ...]) -> Any:
    """``stored`` without the keys of ``items[indices]`` (whose callers left)."""
    kept = Stored()
    dropped = {service.key(items[i]) for i in indices}
    for key, count in stored.counts.items():
        if key not in dropped:
            kept.counts[key] = count
            kept.results[key] = stored.results[key]
    return kept


async def test_a_batcher_stopped_mid_call_starts_again_and_sends(kind: str, request: pytest.FixtureRequest) -> None:
    endpoint = server_for(kind, request)
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service(kind, endpoint).opened() as service:
        hold = Hold(forward=True)
        proxy.rules.append(first_calls(service.operation, 1, hold))
        first, again = service.items(3, prefix="a"), service.items(3, prefix="b")
        batcher = service.batcher(proxy.url, retry=RETRY)
        cut = await stopped_when(batcher, first, hold.reached)
        hold.release()
        async with batcher:  # a new client; nothing of the batch cut off is left
            later = await asyncio.wait_for(asyncio.gather(*(batcher.process(item) for item in again)), WAIT)
        stored = await service.stored()
    check_outcomes(service, first + again, cut + list(later), stored)
    assert_abandoned(cut)
    assert batcher._batches == {}


async def test_sqs_a_stop_while_a_refused_call_is_bisected(moto_server: Any) -> None:
    """moto refuses a whole call for one message's bogus attribute type; the batcher sends the halves one after
    the other. The stop comes while the first half is under way: the second half was never sent."""
    endpoint = moto_server.endpoint_url
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service("sqs", endpoint).opened() as service:
        hold = Hold(forward=True)
        proxy.rules.append(nth_call("SendMessageBatch", 2, hold))
        messages = service.items(8)
        messages[6] = SqsMessage(body="m006", attributes={"a": {"DataType": "Bogus", "StringValue": "1"}})
        outcomes = await stopped_when(service.batcher(proxy.url, retry=RETRY, max_batch_size=8), messages, hold.reached)
        hold.release()
        stored = await service.stored()
    check_outcomes(service, messages, outcomes, stored)
    assert states(service, messages, outcomes) == ["unknown"] * 4 + ["not applied"] * 4
    assert sorted(stored.counts) == ["m000", "m001", "m002", "m003"]


# ---------------------------------------------------------------- the hook itself, without a server


def test_the_hook_knows_the_items_as_process_batch_was_given_them() -> None:
    """A process_batch that reorders or empties its list does not change which item an outcome belongs to."""
    batcher = AsyncSqsSendBatcher(queue_url="http://q")
    first, second = SqsMessage(body="1"), SqsMessage(body="2")
    batch = [first, second]
    outcomes = batcher._outcomes(2, "SendMessageBatch")
    with batcher._tracking(batch, outcomes):
        outcomes.succeed(0, "id-1")
        outcomes.calls_started([1])
        batch.reverse()
        error = batcher.abandoned_error(batch, BatcherStoppedError("stopped"))
    assert isinstance(error, AbandonedBatchError)
    assert error.outcome_of(first) == EntryOutcome("applied", "id-1")
    assert error.outcome_of(second).state == "unknown"


def test_the_hook_never_falls_back_to_the_plain_stop_for_a_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    batcher = AsyncSqsSendBatcher(queue_url="http://q")
    stopped = BatcherStoppedError("stopped")
    # A batch the class did not track (a subclass's own process_batch): unknown.
    untracked = batcher.abandoned_error([SqsMessage(body="x")], stopped)
    assert isinstance(untracked, AwsOutcomeUnknownError) and untracked.__cause__ is stopped
    # A bug while reading the outcomes: unknown too, not the core's default.
    batch = [SqsMessage(body="x")]
    outcomes = batcher._outcomes(1, "SendMessageBatch")

    def broken(*args: object) -> BaseException:
        raise RuntimeError("bug")

    monkeypatch.setattr(outcomes, "abandoned", broken)
    with batcher._tracking(batch, outcomes):
        assert isinstance(batcher.abandoned_error(batch, stopped), AwsOutcomeUnknownError)
    # A reader's batch: the plain stop, whatever it holds.
    reader = AsyncDynamoDbGetBatcher()
    assert reader.abandoned_error([GetItem(table_name="t", key={"pk": "a"})], stopped) is stopped


async def test_process_many_with_return_exceptions_gets_each_item_its_outcome(moto_server: Any) -> None:
    """A bulk caller holds every item: one AbandonedBatchError in each place, which tells each item apart."""
    endpoint = moto_server.endpoint_url
    async with asyncio.timeout(60), FaultProxy(endpoint) as proxy, Service("sqs", endpoint).opened() as service:
        proxy.rules.append(
            first_calls("SendMessageBatch", 1, lambda body: Withhold(service.entries_where(stuck)(body)))
        )
        messages, gate = service.items(6), Gate()
        batcher = service.batcher(proxy.url, retry=RETRY)
        batcher._sleep = gate.sleep
        async with batcher:
            bulk = asyncio.ensure_future(batcher.process_many(messages, return_exceptions=True))
            await asyncio.wait_for(gate.waiting.wait(), WAIT)
            await asyncio.wait_for(batcher.stop(force=True), WAIT)
            outcomes = list(await asyncio.wait_for(bulk, WAIT))
        stored = await service.stored()
    check_outcomes(service, messages, outcomes, stored)
    assert_abandoned(outcomes)
    assert states(service, messages, outcomes) == [
        "not applied" if stuck(service.key(m)) else "applied" for m in messages
    ]
