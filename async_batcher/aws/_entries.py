"""Read the answer of a batch call whose entries come back as ``Successful`` and ``Failed`` lists.

``SendMessageBatch`` (SQS) and ``PublishBatch`` (SNS) answer that way; each entry's ``Id`` is the position of
its item in the call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from async_batcher.aws._delivery import Outcomes
from async_batcher.aws.errors import BatchEntryError


class _Indexed(Protocol):
    @property
    def index(self) -> int: ...


I = TypeVar("I", bound=_Indexed)  # noqa: E741


def numbered(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The entries with their position as ``Id``."""
    return [{"Id": str(number), **entry} for number, entry in enumerate(entries)]


def settle_entries(
    response: Mapping[str, Any], items: Sequence[I], outcomes: Outcomes[str], *, refused: type[BatchEntryError]
) -> list[I]:
    """Record each item the answer settles; return the items to send again.

    A ``Successful`` entry gives its item its ``MessageId``; a ``Failed`` entry with ``SenderFault`` gives
    ``refused(code, message, sender_fault=True)``. A ``Failed`` entry that is the service's fault, and an item
    the answer does not mention, are returned for another try; the latter may have been sent, so its outcome
    stays unknown unless a later call answers it.
    """
    answered: set[int] = set()
    for success in response.get("Successful") or ():
        number = int(success["Id"])
        outcomes.succeed(items[number].index, str(success["MessageId"]))
        answered.add(number)
    left: list[I] = []
    for failure in response.get("Failed") or ():
        number = int(failure["Id"])
        answered.add(number)
        if failure.get("SenderFault"):
            error = refused(failure.get("Code", ""), failure.get("Message", ""), sender_fault=True)
            outcomes.fail(items[number].index, error)
        else:
            left.append(items[number])
    unanswered = [item for number, item in enumerate(items) if number not in answered]
    outcomes.may_have_applied(item.index for item in unanswered)
    left.extend(unanswered)
    return left
