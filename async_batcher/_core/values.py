"""A batcher's settings as small values: :class:`Limits`, :class:`ResultCache`, :class:`Streaming`, :class:`RefuseLate`
(public through
:mod:`async_batcher`; the live :class:`~async_batcher._core.settings.Settings` holds them).

"No limit" is spelled ``None`` everywhere; the spellings of async-batcher 0.2.2 and 1.0's first drafts (``-1``, and
``0`` for ``max_queue_size``) are still accepted, with a ``DeprecationWarning`` that names ``None``, and read back as
``None``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from async_batcher import _checks

__all__ = ["Limits", "RefuseLate", "ResultCache", "Streaming"]


def _limit(name: str, value: object, *, zero: bool = False) -> int | None:
    """A count >= 1, or ``None`` for no limit (``-1``, and ``0`` where ``zero``, are old spellings of it, which
    warn)."""
    if value is None:
        return None
    number = _checks.count(name, value, zero_means_unlimited=zero)
    if number > 0:
        return number
    _checks.deprecated(f"{name}={value!r} for no limit is deprecated: use {name}=None")
    return None


@dataclass(frozen=True, slots=True)
class Limits:
    """How much a batcher takes at once: per batch, in flight, and waiting. ``None``: no limit.

    Args:
        max_batch_size: The most items in one batch.
        max_batch_weight: The most total :meth:`~async_batcher.AsyncBatcher.item_weight` in one batch. A batcher
            given one must override ``item_weight`` (``weight=`` with ``@batch``): without, it is a ``ValueError``.
        concurrency: The most batches processed at once.
        max_queue_size: The most items waiting for a batch (batches in flight not counted); past it a call raises
            :class:`~async_batcher.QueueFullException` or waits (``wait_when_full``).
        max_queue_weight: The most total :meth:`~async_batcher.AsyncBatcher.item_weight` admitted and not yet
            answered (waiting *and* in flight: an item's weight is released when its call resolves); past it a call
            raises :class:`~async_batcher.QueueFullException` or waits its turn (``wait_when_full``). An item
            heavier than the limit alone is refused at once (:class:`~async_batcher.OversizedItemError`). A batcher
            given one must override ``item_weight`` (``weight=`` with ``@batch``): without, it is a ``ValueError``.
    """

    max_batch_size: int | None = None
    max_batch_weight: float | None = None
    concurrency: int | None = 1
    max_queue_size: int | None = None
    max_queue_weight: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "max_batch_size", _limit("max_batch_size", self.max_batch_size))
        set_(self, "concurrency", _limit("concurrency", self.concurrency))
        set_(self, "max_queue_size", _limit("max_queue_size", self.max_queue_size, zero=True))
        for name in ("max_batch_weight", "max_queue_weight"):
            weight = getattr(self, name)
            if weight is not None:
                if not _checks.is_real(weight) or not _checks.is_finite(weight) or weight <= 0:
                    raise ValueError(f"{name} must be None or a finite number > 0, got {weight!r}")
                set_(self, name, float(weight))


@dataclass(frozen=True, slots=True)
class ResultCache:
    """A small cache of the results of deduplicated items (``dedup_key``), by key, for ``ttl`` seconds.

    Off by default. A result is served from it to a later call of the same key for up to ``ttl`` seconds after it
    was computed: **stale** by up to that much if what it was computed from changed meanwhile. Only results are
    kept, never an exception; the cache holds at most ``max_bytes`` (as ``sizeof`` measures each result, least
    recently used first out; a result larger than that is not kept). Each hit is a copy (``copy_result``).

    Args:
        ttl: Seconds a result is served after it was computed (on the event loop's clock).
        max_bytes: The most bytes of results kept.
        sizeof: A result's size in bytes; ``sys.getsizeof`` by default (shallow: give your own for containers).
    """

    ttl: float
    max_bytes: int
    sizeof: Callable[[Any], int] = sys.getsizeof

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl", _checks.seconds("ttl", self.ttl, positive=True))
        object.__setattr__(self, "max_bytes", _checks.count("max_bytes", self.max_bytes, unlimited=False))
        if not callable(self.sizeof):
            raise TypeError(f"sizeof must be a callable of one result, got {self.sizeof!r}")


@dataclass(frozen=True, slots=True)
class Streaming:
    """How a streaming ``process_batch`` (an async generator) waits for its consumers.

    Args:
        buffer: The most parts a stream buffers for its consumer before its batch waits for it.
        stall_timeout: The most seconds a step waits for a consumer whose buffer is full; that consumer is then
            dropped from its batch, its stream ending with ``TimeoutError``. ``None``: wait as long as it takes.
    """

    buffer: int = 16
    stall_timeout: float | None = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "buffer", _checks.count("stream_buffer", self.buffer, unlimited=False))
        if self.stall_timeout is not None:
            object.__setattr__(self, "stall_timeout", _checks.seconds("stream_stall_timeout", self.stall_timeout))


@dataclass(frozen=True, slots=True)
class RefuseLate:
    """How ``refuse_late`` predicts when an item would be answered (``refuse_late=True`` is ``RefuseLate()``).

    The prediction sums the batch times ahead of the item, each from the fit of a batch's time to its size (the
    latency budget's, :class:`~async_batcher.adaptive.AdaptiveWait`, fed every batch that ends), bounded by what the
    recent batches took; an item is refused when that sum, plus a margin, passes its deadline (or the deadline of the
    items ahead of it in its batch).

    Args:
        warmup: Batches measured before anything is refused.
        margin: The margin, in standard deviations of the prediction (the batches' errors taken as independent, each
            the measured relative spread of the batches' times about the fit). Three, not 2.33 (1 % of a normal
            error): the errors come in groups (a batch that runs long makes every item behind it late together); on
            the virtual clock, with a model of 20 % jitter at twice its capacity, 2.33 let 1 % of the answers through
            late, 3 let 0.3 %, for 1 % less goodput.
        recent: The recent batches whose longest (per batch) and dearest (per item) bound the fit: one stall does not
            make every prediction wild.
        spread_decay: The weight of the newest batch in the relative spread of the batches' times (an exponential
            decay: about the last 20 batches count, as in the fit).
    """

    warmup: int = 8
    margin: float = 3.0
    recent: int = 64
    spread_decay: float = 0.05

    def __post_init__(self) -> None:
        object.__setattr__(self, "warmup", _checks.count("RefuseLate(warmup=...)", self.warmup, unlimited=False))
        object.__setattr__(self, "recent", _checks.count("RefuseLate(recent=...)", self.recent, unlimited=False))
        if not _checks.is_real(self.margin) or not _checks.is_finite(self.margin) or self.margin < 0:
            raise ValueError(f"RefuseLate(margin=...) must be a finite number >= 0, got {self.margin!r}")
        decay = self.spread_decay
        if not _checks.is_real(decay) or not 0 < decay <= 1:
            raise ValueError(f"RefuseLate(spread_decay=...) must be a number in (0, 1], got {decay!r}")
        object.__setattr__(self, "margin", float(self.margin))
        object.__setattr__(self, "spread_decay", float(decay))

    @staticmethod
    def of(value: object) -> RefuseLate | None:
        """What ``refuse_late=`` takes: ``True`` (:class:`RefuseLate` as it is by default), a :class:`RefuseLate`, or
        ``False`` (``None``: off)."""
        if isinstance(value, RefuseLate):
            return value
        if not isinstance(value, bool):
            raise TypeError(
                f"refuse_late must be True or False, got {value!r} (or a RefuseLate, to tune how it predicts)"
            )
        return _REFUSE_LATE if value else None


_REFUSE_LATE = RefuseLate()  # refuse_late=True
