"""Delivery: retries of partial results and throttling, bisection of refusals, exhaustion, transport errors.

The "service" here is a small scripted function; the real services are exercised in test_dynamodb_* and
test_sqs_* through a fault-injecting proxy.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from async_batcher import BatcherStoppedError
from async_batcher.aws._delivery import Delivery, Outcomes, record_attempt, splitter
from async_batcher.aws.base import never_sent
from async_batcher.aws.errors import AbandonedBatchError, AwsOutcomeUnknownError, EntryOutcome, RetriesExhaustedError
from async_batcher.aws.retry import RetryPolicy


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


class Service:
    """Records calls; ``script`` decides each call's answer: a ClientError to raise, or the entries left over."""

    def __init__(self, script: Callable[[int, list[str]], Sequence[str] | BaseException]) -> None:
        self.script = script
        self.calls: list[list[str]] = []
        self.done: list[str] = []
        self.failed: dict[str, BaseException] = {}
        self.waits: list[float] = []

    async def send(self, entries: list[str]) -> Sequence[str]:
        self.calls.append(list(entries))
        answer = self.script(len(self.calls), entries)
        if isinstance(answer, BaseException):
            raise answer
        self.done.extend(e for e in entries if e not in answer)
        return answer

    def fail(self, entry: str, error: BaseException) -> None:
        assert entry not in self.failed, f"{entry} failed twice"
        self.failed[entry] = error

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)

    def delivery(self, max_attempts: int = 5) -> Delivery[str]:
        return Delivery(
            send=self.send,
            fail=self.fail,
            policy=RetryPolicy(max_attempts=max_attempts, base_delay=1.0, max_delay=100.0, jitter=lambda: 0.5),
            operation="Op",
            # Entries "<group>:<name>" or plain names (group "").
            split=splitter(
                bisect_codes={"ValidationException"},
                group_codes={"ResourceNotFoundException"},
                group_of=lambda entry: entry.partition(":")[0] if ":" in entry else "",
            ),
            sleep=self.sleep,
        )


ENTRIES = [f"e{i}" for i in range(8)]


async def test_unprocessed_entries_are_retried_with_growing_waits() -> None:
    # The service takes only the first two entries of each call.
    service = Service(lambda n, entries: entries[2:])
    await service.delivery(max_attempts=10).run(ENTRIES)
    assert service.done == ENTRIES
    assert [len(c) for c in service.calls] == [8, 6, 4, 2]
    assert service.waits == [0.5, 1.0, 2.0]  # jitter 0.5 * (1, 2, 4)
    assert service.failed == {}


async def test_throttled_calls_are_retried_whole() -> None:
    service = Service(lambda n, entries: client_error("ThrottlingException") if n <= 2 else [])
    await service.delivery().run(ENTRIES)
    assert service.calls == [ENTRIES] * 3
    assert service.done == ENTRIES


async def test_exhaustion_fails_only_the_left_over_entries() -> None:
    # e0..e5 go through on the first call; e6 and e7 are never processed.
    service = Service(lambda n, entries: [e for e in entries if e in ("e6", "e7")])
    await service.delivery(max_attempts=3).run(ENTRIES)
    assert service.done == ENTRIES[:6]
    assert set(service.failed) == {"e6", "e7"}
    error = service.failed["e6"]
    assert isinstance(error, RetriesExhaustedError)
    assert error.attempts == 3
    assert error.last_error is None
    assert "left unprocessed after 3 attempt(s)" in str(error)
    assert len(service.calls) == 3
    assert len(service.waits) == 2


async def test_exhaustion_by_throttling_keeps_the_last_error() -> None:
    service = Service(lambda n, entries: client_error("ProvisionedThroughputExceededException"))
    await service.delivery(max_attempts=2).run(ENTRIES[:2])
    error = service.failed["e0"]
    assert isinstance(error, RetriesExhaustedError)
    assert "throttled (ProvisionedThroughputExceededException)" in str(error)
    assert service.failed["e0"] is not service.failed["e1"]  # one exception object per caller


async def test_one_bad_entry_is_isolated_by_bisection() -> None:
    bad = client_error("ValidationException")
    service = Service(lambda n, entries: bad if "e5" in entries else [])
    await service.delivery().run(ENTRIES)
    assert sorted(service.done) == sorted(e for e in ENTRIES if e != "e5")
    assert service.failed == {"e5": bad}
    assert len(service.calls) <= 1 + 2 * 3  # one call, then two per level of a log2(8) = 3 deep bisection


async def test_several_bad_entries_each_get_the_error() -> None:
    bad = client_error("ValidationException")
    service = Service(lambda n, entries: bad if {"e0", "e7"} & set(entries) else [])
    await service.delivery().run(ENTRIES)
    assert set(service.failed) == {"e0", "e7"}
    assert len(service.done) == 6


async def test_413_is_bisected_too() -> None:
    too_big = client_error("RequestEntityTooLarge", status=413)
    service = Service(lambda n, entries: too_big if "e1" in entries else [])
    await service.delivery().run(ENTRIES[:4])
    assert list(service.failed) == ["e1"]


async def test_other_refusals_fail_the_whole_call_without_bisection() -> None:
    denied = client_error("AccessDeniedException")
    service = Service(lambda n, entries: denied)
    await service.delivery().run(ENTRIES)
    assert service.failed == dict.fromkeys(ENTRIES, denied)
    assert len(service.calls) == 1


async def test_refusal_after_partial_progress_only_touches_what_is_left() -> None:
    bad = client_error("ValidationException")

    def script(n: int, entries: list[str]) -> Sequence[str] | BaseException:
        if n == 1:
            return entries[4:]  # e0..e3 done, e4..e7 left
        return bad if "e6" in entries else []

    service = Service(script)
    await service.delivery().run(ENTRIES)
    assert list(service.failed) == ["e6"]
    assert sorted(service.done) == sorted(e for e in ENTRIES if e != "e6")


async def test_a_refusal_of_one_group_is_split_by_group() -> None:
    missing = client_error("ResourceNotFoundException")
    entries = ["good:a", "gone:b", "good:c", "gone:d", "good:e"]
    service = Service(lambda n, entries: missing if any(e.startswith("gone") for e in entries) else [])
    await service.delivery().run(entries)
    assert service.failed == {"gone:b": missing, "gone:d": missing}
    assert service.done == ["good:a", "good:c", "good:e"]
    assert len(service.calls) == 3  # the whole call, then one per group: no bisection inside a group


async def test_transport_errors_propagate_for_the_batcher_to_report() -> None:
    service = Service(lambda n, entries: EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    with pytest.raises(EndpointConnectionError):
        await service.delivery().run(ENTRIES)
    assert len(service.calls) == 1  # botocore already retried it: no second layer of retries
    assert service.failed == {}


async def test_nothing_to_deliver_makes_no_call() -> None:
    service = Service(lambda n, entries: [])
    await service.delivery().run([])
    assert service.calls == []


# ---------------------------------------------------------------- what a call may have applied (issue 26, item 8)


def tracked(
    service: Service, size: int, *, max_attempts: int = 3, observed: bool = True
) -> tuple[Delivery[str], Outcomes[str]]:
    """A delivery of entries "e0".."e<size-1>" that records into batch outcomes (entry i is item i)."""
    outcomes: Outcomes[str] = Outcomes(size, operation="Op")
    delivery = service.delivery(max_attempts=max_attempts)
    delivery.outcomes = outcomes
    delivery.indices_of = lambda entry: (int(entry[1:]),)
    delivery.observed = observed
    delivery.fail = lambda entry, error: outcomes.fail(int(entry[1:]), error)
    return delivery, outcomes


def attempts(*verdicts: bool) -> Callable[[], None]:
    """What botocore reports for the HTTP attempts of one call (True: it may have applied the call)."""
    return lambda: [record_attempt("response-received.svc.Op", verdict) for verdict in verdicts] and None


async def test_a_5xx_every_time_ends_unknown_a_throttle_every_time_not_applied() -> None:
    for error, unknown in ((client_error("InternalError", 500), True), (client_error("ThrottlingException"), False)):
        service = Service(lambda n, entries, error=error: error)  # type: ignore[misc]
        delivery, outcomes = tracked(service, 2)
        await delivery.run(["e0", "e1"])
        results = outcomes.results()
        if unknown:
            assert all(isinstance(r, AwsOutcomeUnknownError) for r in results), results
            assert isinstance(results[0].__cause__, RetriesExhaustedError)  # type: ignore[union-attr]
            assert "may or may not have been applied" in str(results[0])
        else:
            assert all(type(r) is RetriesExhaustedError for r in results), results


async def test_a_5xx_then_success_is_applied() -> None:
    service = Service(lambda n, entries: client_error("InternalError", 500) if n == 1 else [])
    delivery, outcomes = tracked(service, 2)
    await delivery.run(["e0", "e1"])
    assert service.done == ["e0", "e1"]  # the retry applied them
    assert outcomes.is_maybe([0, 1])  # and the 5xx before may have too: they may be there twice
    outcomes.succeed(0, "id-0")  # (what a batcher's send records for an entry applied)
    assert outcomes.outcome(0) == EntryOutcome("applied", "id-0")
    assert outcomes.outcome(1).state == "unknown"  # no result yet, and may have been applied


def scripted_attempts(verdicts: tuple[bool, ...], error: BaseException | None) -> Service:
    """A service whose first call reports ``verdicts`` for its HTTP attempts, then raises ``error`` (or leaves
    every entry unprocessed); later calls apply everything."""

    def script(n: int, entries: list[str]) -> Sequence[str] | BaseException:
        if n == 1:
            attempts(*verdicts)()
            return error if error is not None else list(entries)
        return []

    return Service(script)


@pytest.mark.parametrize(
    ("verdicts", "observed", "maybe"),
    [
        ((False,), True, False),  # the connection was refused: nothing left
        ((True,), True, True),  # lost mid-call
        ((True, False), True, True),  # lost, then botocore's retry refused: the first may have been applied
        ((False, False), True, False),  # refused twice
        ((), True, False),  # no attempt at all (an error before sending)
        ((), False, True),  # attempts not observed: a transport error may be anything
    ],
)
async def test_a_call_without_an_answer_is_unknown_unless_no_request_left(
    verdicts: tuple[bool, ...], observed: bool, maybe: bool
) -> None:
    lost = EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    service = scripted_attempts(verdicts, lost)
    delivery, outcomes = tracked(service, 2, observed=observed)
    with pytest.raises(EndpointConnectionError):
        await delivery.run(["e0", "e1"])
    outcomes.fail_pending(lost)
    results = outcomes.results()
    if maybe:
        assert all(isinstance(r, AwsOutcomeUnknownError) and r.__cause__ is lost for r in results), results
    else:
        assert results == [lost, lost]


async def test_entries_left_unprocessed_after_an_earlier_attempt_that_may_have_applied_them_stay_unknown() -> None:
    # botocore's first attempt got a 5xx (may have applied the call), its second an answer leaving both entries
    # unprocessed; then the batcher gives up.
    service = Service(lambda n, entries: (attempts(True, True)(), list(entries))[1])
    delivery, outcomes = tracked(service, 2, max_attempts=2)
    await delivery.run(["e0", "e1"])
    assert all(isinstance(r, AwsOutcomeUnknownError) for r in outcomes.results())
    # The same with only 4xx before: certainly not applied.
    service = Service(lambda n, entries: (attempts(False, True)(), list(entries))[1])
    delivery, outcomes = tracked(service, 2, max_attempts=2)
    await delivery.run(["e0", "e1"])
    assert all(type(r) is RetriesExhaustedError for r in outcomes.results())


async def test_reads_are_never_unknown() -> None:
    service = Service(lambda n, entries: client_error("InternalError", 500))
    outcomes: Outcomes[str] = Outcomes(1, operation="Op", effects=False)
    delivery = service.delivery(max_attempts=2)
    delivery.outcomes, delivery.indices_of = outcomes, lambda entry: (0,)
    delivery.fail = lambda entry, error: outcomes.fail(0, error)
    await delivery.run(["e0"])
    assert type(outcomes.results()[0]) is RetriesExhaustedError
    assert outcomes.abandoned(["x"], stopped := BatcherStoppedError("stopped")) is stopped


def test_what_a_stop_reports_depends_on_what_may_have_been_applied() -> None:
    stopped = BatcherStoppedError("stopped with force=True")
    items = [object() for _ in range(4)]
    outcomes: Outcomes[str] = Outcomes(4, operation="Op")
    assert outcomes.abandoned(items, stopped) is stopped  # nothing sent
    outcomes.fail(3, ValueError("refused"))
    outcomes.may_have_applied([])  # (nothing)
    assert outcomes.abandoned(items, stopped) is stopped  # refused and not sent: still nothing applied
    outcomes.calls_started([0, 1])
    outcomes.succeed(0, "id-0")
    error = outcomes.abandoned(items, stopped)
    assert isinstance(error, AbandonedBatchError)
    assert error.__cause__ is stopped
    assert [error.outcome_of(item).state for item in items] == ["applied", "unknown", "not applied", "not applied"]
    assert error.outcome_of(items[0]).result == "id-0"
    assert isinstance(error.outcome_of(items[3]).error, ValueError)
    assert "1 applied, 1 unknown, 2 not applied" in str(error)
    outcomes.calls_ended([0, 1])
    assert outcomes.abandoned(items, stopped).outcome_of(items[1]).state == "not applied"  # type: ignore[attr-defined]
    outcomes.may_have_applied([1])
    assert outcomes.abandoned(items, stopped).outcome_of(items[1]).state == "unknown"  # type: ignore[attr-defined]


def test_outcome_of_finds_the_item_by_identity() -> None:
    same, other = {"k": 1}, {"k": 1}
    error = AbandonedBatchError(
        "Op", [same, same, other], [EntryOutcome("applied", "a"), EntryOutcome("applied", "b"), EntryOutcome("unknown")]
    )
    assert error.outcome_of(other).state == "unknown"
    assert error.outcome_of(same) == EntryOutcome("applied")  # both applied, with different results
    with pytest.raises(ValueError, match="is not an item of this batch"):
        error.outcome_of({"k": 1})
    mixed = AbandonedBatchError("Op", [same, same], [EntryOutcome("applied", "a"), EntryOutcome("not applied")])
    assert mixed.outcome_of(same).state == "unknown"


def test_which_transport_errors_say_the_request_never_left() -> None:
    key = ConnectionKey("127.0.0.1", 1, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))
    assert never_sent(EndpointConnectionError(endpoint_url="u", error=refused))
    assert never_sent(ConnectTimeoutError(endpoint_url="u", error=TimeoutError()))
    assert never_sent(EndpointConnectionError(endpoint_url="u", error=socket.gaierror(-2, "Name unknown")))
    # aiobotocore raises EndpointConnectionError for a reset mid-call too: that one may have been received.
    reset = aiohttp.ClientOSError(104, "Connection reset by peer")
    assert not never_sent(EndpointConnectionError(endpoint_url="u", error=reset))
    assert not never_sent(ConnectionClosedError(endpoint_url="u", error=aiohttp.ServerDisconnectedError()))
    assert not never_sent(ReadTimeoutError(endpoint_url="u", error=TimeoutError()))
    assert not never_sent(RuntimeError("anything else"))
