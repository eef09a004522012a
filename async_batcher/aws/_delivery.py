"""Deliver the entries of one batch call until each one is done or has its own error.

``BatchWriteItem``, ``BatchGetItem`` and ``SendMessageBatch`` share one shape: a call carries many entries,
and the answer can be

* success for some entries and "not now" for the others (``UnprocessedItems``, ``UnprocessedKeys``, a
  ``Failed`` entry that is not the sender's fault): retry those, with backoff;
* a throttling or 5xx error for the whole call: retry the whole call, with backoff;
* a refusal of the whole call because of *one* bad entry (``ValidationException``): the other entries are
  fine, so split the call in halves and send each, down to the single bad entry, whose caller alone gets the
  service's error (bisection: about ``2 * log2(n)`` extra calls per bad entry);
* a refusal because of one *group* of entries (a table that does not exist, in a call that spans several
  tables): split the call by group, so only that group's callers get the error;
* any other service error: every entry of the call gets it;
* no answer at all (connection refused, timeout): botocore has already retried; :meth:`Delivery.run` raises it
  and the batcher gives it to every entry that has no outcome yet.

The service-specific part is the ``send`` function: it makes one call, records the outcome of each entry the
service processed, and returns the entries to try again.

What may have been applied. Each entry's :class:`Outcomes` slot also knows whether a call carrying it is under
way, and whether one may already have applied it without saying so: a call that got no answer after its request
may have left (a connection lost mid-call, a read timeout), one answered HTTP 5xx (the service failed on its side
and does not say whether before or after applying it), one whose earlier HTTP attempt (botocore's own retry)
was such, one whose answer does not mention the entry. Such an entry never gets a "not applied" error
afterwards: if it ends without a success, its caller gets :class:`AwsOutcomeUnknownError`; and a stop that cuts
the batch off reports it as "unknown" (:meth:`Outcomes.abandoned`). An answer of HTTP 4xx (throttling, a
refusal) and a connection that could not be opened say that nothing was applied.

botocore tells how each HTTP attempt of a call ended through an event the batcher listens to
(:func:`record_attempt`); :class:`Attempts`, found through a context variable, collects them for the call under
way in the current task.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from async_batcher.aws.errors import (
    AbandonedBatchError,
    AwsOutcomeUnknownError,
    EntryOutcome,
    RetriesExhaustedError,
)
from async_batcher.aws.retry import RetryPolicy, is_retryable_error

E = TypeVar("E")
R = TypeVar("R")


def error_code(error: BaseException) -> str | None:
    """The service's error code of a botocore ``ClientError``, or None for any other exception."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


Splitter = Callable[[list[E], BaseException], list[list[E]]]
"""Given a refused call's entries and the error: the parts to send separately, or [] when every entry is at fault."""


def splitter(
    *,
    bisect_codes: Collection[str],
    group_codes: Collection[str] = (),
    group_of: Callable[[E], Hashable] | None = None,
) -> Splitter[E]:
    """How to split a refused call to find who is at fault.

    An error in ``group_codes`` (one table missing) splits a call that spans several groups by ``group_of``;
    an error in ``bisect_codes`` (one bad item), or HTTP 413 (too large), splits it in halves; any other error
    is every entry's.
    """

    def split(entries: list[E], error: BaseException) -> list[list[E]]:
        code = error_code(error)
        if group_of is not None and code in group_codes:
            groups: dict[Hashable, list[E]] = {}
            for entry in entries:
                groups.setdefault(group_of(entry), []).append(entry)
            if len(groups) > 1:
                return list(groups.values())
        response = getattr(error, "response", None)
        too_large = isinstance(response, dict) and response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 413
        if (code in bisect_codes or too_large) and len(entries) > 1:
            middle = len(entries) // 2
            return [entries[:middle], entries[middle:]]
        return []

    return split


_PENDING: Any = object()


def http_status(error: BaseException) -> int | None:
    """The HTTP status of a botocore ``ClientError`` (an answered call), or None."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def answer_may_have_applied(status: int | None) -> bool:
    """Whether an answer with this HTTP status leaves open that the call was applied: only a 4xx (throttled,
    refused, too large) says it was not; a 5xx says the service failed without saying before or after applying."""
    return status is None or not 400 <= status < 500


class Attempts:
    """The HTTP attempts of one API call (botocore retries inside a call), as botocore reports them: for each,
    whether it may have applied the call."""

    __slots__ = ("operation", "verdicts")

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.verdicts: list[bool] = []


current_attempts: contextvars.ContextVar[Attempts | None] = contextvars.ContextVar(
    "async_batcher_aws_attempts", default=None
)
"""The :class:`Attempts` of the call under way in this task (set by :class:`Delivery` around each call)."""


def record_attempt(event_name: str, verdict: bool) -> None:
    """Note how one HTTP attempt of ``event_name``'s operation ended, for the call under way in this task."""
    attempts = current_attempts.get()
    if attempts is not None and event_name.endswith("." + attempts.operation):
        attempts.verdicts.append(verdict)


class Outcomes(Generic[R]):
    """The result or error of each item of a batch, recorded once (the first outcome stands), and what is known of
    the items still without one: whether a call carrying them is under way, and whether one may have applied them.

    ``operation`` names the API in errors; ``effects`` is False for a batch that only reads (nothing it does can
    be "applied" twice: its items never get an :class:`AwsOutcomeUnknownError`).
    """

    def __init__(self, size: int, *, operation: str = "batch call", effects: bool = True) -> None:
        self._values: list[Any] = [_PENDING] * size
        self._in_flight = [0] * size
        self._maybe = [False] * size
        self.operation = operation
        self.effects = effects

    def succeed(self, index: int, value: R) -> None:
        if self._values[index] is _PENDING:
            self._values[index] = value

    def fail(self, index: int, error: Exception) -> None:
        if self._values[index] is _PENDING:
            self._values[index] = error

    def fail_pending(self, error: Exception) -> None:
        """Give every item that has no outcome yet ``error``, or an :class:`AwsOutcomeUnknownError` caused by it
        for an item that a call may have applied."""
        for index, value in enumerate(self._values):
            if value is _PENDING:
                self._values[index] = self.unknown_if_maybe([index], error)

    def unknown_if_maybe(self, indices: Iterable[int], error: Exception) -> Exception:
        """``error`` (which says "not applied"), or an :class:`AwsOutcomeUnknownError` caused by it when a call may
        have applied one of ``indices``."""
        if not self.effects or not any(self._maybe[index] for index in indices):
            return error
        if isinstance(error, RetriesExhaustedError):
            reason = f"gave up after {error.attempts} attempt(s), after a call that may have applied it"
        else:
            reason = f"no answer ({type(error).__name__}) to a call whose request may have reached the service"
        unknown = AwsOutcomeUnknownError(self.operation, reason)
        unknown.__cause__ = error
        return unknown

    def calls_started(self, indices: Iterable[int]) -> None:
        for index in indices:
            self._in_flight[index] += 1

    def calls_ended(self, indices: Iterable[int]) -> None:
        for index in indices:
            self._in_flight[index] -= 1

    def may_have_applied(self, indices: Iterable[int]) -> None:
        """A call may have applied these items without saying so (it stays so: see the module docstring)."""
        for index in indices:
            self._maybe[index] = True

    def is_maybe(self, indices: Iterable[int]) -> bool:
        return any(self._maybe[index] for index in indices)

    def outcome(self, index: int) -> EntryOutcome:
        """What is known of item ``index`` now."""
        value = self._values[index]
        if value is _PENDING:
            if self.effects and (self._in_flight[index] or self._maybe[index]):
                return EntryOutcome("unknown")
            return EntryOutcome("not applied")
        if isinstance(value, AwsOutcomeUnknownError):
            return EntryOutcome("unknown", error=value)
        if isinstance(value, BaseException):
            return EntryOutcome("not applied", error=value)
        return EntryOutcome("applied", result=value)

    def abandoned(self, items: Sequence[object], stopped: BaseException) -> BaseException:
        """What the callers of this batch get when a stop cuts it off: ``stopped`` when none of its items can have
        been applied, else an :class:`AbandonedBatchError` that knows each item's outcome."""
        outcomes = [self.outcome(index) for index in range(len(self._values))]
        if all(outcome.state == "not applied" for outcome in outcomes):
            return stopped
        error = AbandonedBatchError(self.operation, items, outcomes)
        error.__cause__ = stopped
        return error

    def results(self) -> list[R | Exception]:
        """The outcomes in batch order; an item left without one would be a bug, and gets an error saying so."""
        self.fail_pending(RuntimeError("async_batcher.aws: no outcome was recorded for this item"))
        return list(self._values)


class _Refused(Exception):
    """The service refused a call with an error that waiting will not cure."""

    def __init__(self, remaining: list[object], error: Exception) -> None:
        super().__init__()
        self.remaining = remaining
        self.error = error


@dataclass
class Delivery(Generic[E]):
    """Send entries through ``send`` until each is processed or failed (see the module docstring).

    Args:
        send: makes one call for the given entries, records the outcome of those the service processed, and
            returns those it left unprocessed. It raises the botocore error when the call failed.
        fail: records an error as the outcome of one entry.
        policy: the backoff and the attempt limit.
        operation: the API name, for error messages.
        split: how a refused call is split to find the entries at fault (see :func:`splitter`).
        sleep: waits between attempts (tests inject their own).
        outcomes: the batch's outcomes, which learn which entries are under way and which a call may have
            applied; with ``indices_of`` (the batch positions of an entry's callers). Without them nothing is
            tracked and exhaustion is always :class:`RetriesExhaustedError`.
        observed: whether botocore reports each HTTP attempt (:func:`record_attempt`); when it does not, an error
            that is not an answer (a transport error) is taken to mean the request may have reached the service.
    """

    send: Callable[[list[E]], Awaitable[Sequence[E]]]
    fail: Callable[[E, Exception], None]
    policy: RetryPolicy
    operation: str
    split: Splitter[E]
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)
    outcomes: Outcomes[Any] | None = None
    indices_of: Callable[[E], Iterable[int]] = field(default=lambda entry: ())
    observed: bool = False

    async def run(self, entries: Sequence[E]) -> None:
        """Deliver ``entries``; raises only what is not a service answer (transport errors, cancellation)."""
        if entries:
            await self._isolate(list(entries))

    async def _isolate(self, group: list[E]) -> None:
        try:
            await self._retry(group)
        except _Refused as refused:
            remaining: list[E] = refused.remaining  # type: ignore[assignment]
            parts = self.split(remaining, refused.error)
            if all(0 < len(part) < len(remaining) for part in parts) and parts:
                for part in parts:  # one after the other: cheap, and in submission order
                    await self._isolate(part)
            else:
                for entry in remaining:
                    self.fail(entry, refused.error)

    async def _retry(self, group: list[E]) -> None:
        attempt = 1
        while True:
            last_error: BaseException | None = None
            try:
                left = list(await self._call(group))
            except Exception as error:
                if error_code(error) is None:
                    raise  # no answer from the service: the batcher's to report
                if not is_retryable_error(error):
                    raise _Refused(list(group), error) from None
                left, last_error = group, error
            if not left:
                return
            if attempt >= self.policy.max_attempts:
                for entry in left:
                    exhausted = RetriesExhaustedError(self.operation, attempt, last_error)
                    if self.outcomes is not None:
                        self.fail(entry, self.outcomes.unknown_if_maybe(self.indices_of(entry), exhausted))
                    else:
                        self.fail(entry, exhausted)
                return
            await self.sleep(self.policy.backoff(attempt))
            attempt += 1
            group = left

    async def _call(self, group: list[E]) -> Sequence[E]:
        """One call through ``send``, noting in ``outcomes`` that it is under way and, after it, which entries it
        may have applied without saying so."""
        outcomes = self.outcomes
        if outcomes is None:
            return await self.send(group)
        indices = [index for entry in group for index in self.indices_of(entry)]
        attempts = Attempts(self.operation)
        token = current_attempts.set(attempts)
        outcomes.calls_started(indices)
        try:
            left = await self.send(group)
        except Exception as error:
            if self._may_have_applied(attempts, error):
                outcomes.may_have_applied(indices)
            raise
        except BaseException:
            outcomes.may_have_applied(indices)  # cancelled mid-call (a stop): the request may be out
            raise
        finally:
            outcomes.calls_ended(indices)
            current_attempts.reset(token)
        if any(attempts.verdicts[:-1]):  # an earlier attempt (botocore's retry) may have applied all of them
            outcomes.may_have_applied(index for entry in left for index in self.indices_of(entry))
        return left

    def _may_have_applied(self, attempts: Attempts, error: Exception) -> bool:
        """Whether a call that raised ``error`` may have applied its entries."""
        if attempts.verdicts:
            return any(attempts.verdicts)
        if error_code(error) is not None:  # an answer, whose attempts were not reported
            return answer_may_have_applied(http_status(error))
        # No attempt reported: none was made (an error before sending, such as missing credentials), unless
        # botocore's reports are not observed.
        return not self.observed
