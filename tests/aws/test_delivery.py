"""Delivery: retries of partial results and throttling, bisection of refusals, exhaustion, transport errors.

The "service" here is a small scripted function; the real services are exercised in test_dynamodb_* and
test_sqs_* through a fault-injecting proxy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from async_batcher.aws._delivery import Delivery, splitter
from async_batcher.aws.errors import RetriesExhaustedError
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
