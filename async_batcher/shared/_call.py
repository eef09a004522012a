"""One call of a shared batcher's client: what it carries, and where it is on its route (private; under
:mod:`~async_batcher.shared._client`, which routes the calls)."""

from __future__ import annotations

import sys
from collections import deque
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import asyncio

__all__: list[str] = []

ITEM, MANY, STREAM, ASK_STATS = range(4)
HELD, SENT, LOCAL = range(3)
#: A stream's end, as its consumer's queue holds it.
END: Final = object()


class Call:
    """One call of this process: an item, a process_many call, a stream, or a request for statistics."""

    __slots__ = (
        "deadline",
        "expiry",
        "extra",
        "fut",
        "gone",
        "id",
        "item",
        "kind",
        "local",
        "parts",
        "priority",
        "since",
        "state",
        "trace",
        "waiter",
    )

    def __init__(
        self, id: int, kind: int, item: Any, deadline: float | None, priority: float, extra: Any, fut: Any
    ) -> None:
        self.id = id
        self.kind = kind
        self.item = item
        self.deadline = deadline
        self.priority = priority
        self.extra = extra  # process_many's return_exceptions
        self.trace = _trace()
        self.fut: asyncio.Future[Any] = fut
        self.expiry: list[Any] | None = None
        self.state = HELD
        self.since = 0.0  # held since
        self.gone = False
        self.local: asyncio.Future[Any] | None = None
        self.parts: deque[Any] = deque()  # a stream's parts received and not yet taken
        self.waiter: asyncio.Future[None] | None = None


def _trace() -> tuple[int, int, int] | None:
    """The caller's span, when OpenTelemetry is in use in this process (imported: never imported here)."""
    module = sys.modules.get("opentelemetry.trace")
    if module is None:
        return None
    span = module.get_current_span().get_span_context()
    return (span.trace_id, span.span_id, int(span.trace_flags)) if span.is_valid else None
