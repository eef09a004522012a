"""What the metrics and tracing integrations look at: a batcher, or a shared batcher's batcher in the process that
owns it, followed from owner to owner (private; used by :mod:`async_batcher.metrics`,
:mod:`async_batcher.metrics_multiprocess` and :mod:`async_batcher.opentelemetry`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from async_batcher.batcher import AsyncBatcher
from async_batcher.shared._batcher import SharedBatcher

__all__ = ["Follower", "Source", "exported", "source_of"]

Source = AsyncBatcher[Any, Any] | SharedBatcher[Any, Any]


def source_of(obj: object, what: str) -> Source:
    """A batcher or a shared batcher, or the one of a ``@batch`` function (``shared=`` or not); ``what`` names the
    function that refuses anything else."""
    source = obj if isinstance(obj, AsyncBatcher | SharedBatcher) else getattr(obj, "batcher", obj)
    if not isinstance(source, AsyncBatcher | SharedBatcher):
        raise TypeError(f"{what} takes an AsyncBatcher, a SharedBatcher or a @batch function, got {obj!r}")
    return source


def exported(source: Source) -> AsyncBatcher[Any, Any] | None:
    """The batcher a source has in this process now: a batcher, itself; a shared batcher, its batcher where this
    process owns it (``None`` in a client, and before it starts)."""
    return source.batcher if isinstance(source, SharedBatcher) else source


class Follower:
    """Follows a shared batcher's batcher from owner to owner: ``adopt(batcher)`` when this process starts owning it
    (before its first batch), ``drop(batcher)`` when it stops (its statistics final), through
    :meth:`SharedBatcher.watch <async_batcher.shared.SharedBatcher.watch>`."""

    __slots__ = ("adopt", "batcher", "drop", "unwatch")

    def __init__(
        self, adopt: Callable[[AsyncBatcher[Any, Any]], object], drop: Callable[[AsyncBatcher[Any, Any]], object]
    ) -> None:
        self.adopt = adopt
        self.drop = drop
        self.batcher: AsyncBatcher[Any, Any] | None = None  # while this process owns it
        self.unwatch: Callable[[], None] | None = None

    def follow(self, shared: SharedBatcher[Any, Any]) -> None:
        """Start following (adopting its batcher at once if this process owns it now)."""
        self.unwatch = shared.watch(self)

    def __call__(self, batcher: AsyncBatcher[Any, Any] | None) -> None:
        old, self.batcher = self.batcher, batcher
        if old is not None:
            self.drop(old)
        if batcher is not None:
            self.adopt(batcher)

    def stop(self) -> AsyncBatcher[Any, Any] | None:
        """Stop following; the batcher adopted last and not dropped (for the caller to drop as it sees fit)."""
        if self.unwatch is not None:
            self.unwatch()
            self.unwatch = None
        batcher, self.batcher = self.batcher, None
        return batcher
