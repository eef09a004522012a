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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from async_batcher.aws.errors import RetriesExhaustedError
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


class Outcomes(Generic[R]):
    """The result or error of each item of a batch, recorded once (the first outcome stands)."""

    def __init__(self, size: int) -> None:
        self._values: list[Any] = [_PENDING] * size

    def succeed(self, index: int, value: R) -> None:
        if self._values[index] is _PENDING:
            self._values[index] = value

    def fail(self, index: int, error: Exception) -> None:
        if self._values[index] is _PENDING:
            self._values[index] = error

    def fail_pending(self, error: Exception) -> None:
        """Give ``error`` to every item that has no outcome yet."""
        for index, value in enumerate(self._values):
            if value is _PENDING:
                self._values[index] = error

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
    """

    send: Callable[[list[E]], Awaitable[Sequence[E]]]
    fail: Callable[[E, Exception], None]
    policy: RetryPolicy
    operation: str
    split: Splitter[E]
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)

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
                left = list(await self.send(group))
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
                    self.fail(entry, RetriesExhaustedError(self.operation, attempt, last_error))
                return
            await self.sleep(self.policy.backoff(attempt))
            attempt += 1
            group = left
