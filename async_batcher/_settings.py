"""The settings of a batcher and their validation (private).

:class:`Settings` holds the settings a batcher keeps across runs, each a property whose setter validates the new
value (a bad value raises ``ValueError`` or ``TypeError`` naming it, and the old value stays) and then tells the
batcher, through :meth:`Settings._settings_changed`, so that a running batcher applies it from its next batch.

Beside each setting it keeps the limit the dispatcher compares against, with "no limit" as a number the hot path
can compare without a branch (``sys.maxsize``, ``inf``).
"""

from __future__ import annotations

import concurrent.futures
import math
import sys
from collections.abc import Iterable
from typing import Final

from async_batcher._checks import count, executor, flag, is_finite, is_real, seconds
from async_batcher.adaptive import AdaptiveWait, AdaptiveWaitState

__all__: list[str] = []

UNLIMITED: Final = sys.maxsize


class Settings:
    """The live settings of a batcher, validated; the base of :class:`~async_batcher.AsyncBatcher`."""

    # -- The limits the dispatcher reads (derived from the settings by their setters).
    _batch_limit: int  # max_batch_size, or UNLIMITED
    _size_trigger: int  # the size at which a batch goes at once: _batch_limit, or the adaptive wait's target
    _slot_limit: int  # concurrency, or UNLIMITED
    _room_limit: int  # max_queue_size, or UNLIMITED
    _weight_limit: float  # max_batch_weight, or inf
    _adaptive: AdaptiveWait | None  # the adaptive wait, when max_latency is set
    _preferred: tuple[int, ...]  # preferred_batch_sizes, smallest first; () when none
    _stall_limit: float  # stream_stall_timeout, or inf

    def _settings_changed(self, *, weights: bool = False, room: bool = False, stall: bool = False) -> None:
        """Overridden by the batcher: a setting changed; ``weights``: weights came into play; ``room``: the queue
        may hold more; ``stall``: the stall timeout changed, for the streaming batches waiting on it too."""

    @property
    def max_batch_size(self) -> int:
        """The most items in one batch; ``-1`` for no limit."""
        return self._max_batch_size

    @max_batch_size.setter
    def max_batch_size(self, value: int) -> None:
        limit = count("max_batch_size", value)
        if limit != -1 and self._preferred and self._preferred[-1] > limit:
            raise ValueError(
                f"max_batch_size={value!r} is smaller than the preferred batch size {self._preferred[-1]}: lower "
                "preferred_batch_sizes first"
            )
        self._max_batch_size = limit
        self._batch_limit = UNLIMITED if limit == -1 else limit
        self._size_trigger = self._preferred[0] if self._preferred else self._batch_limit
        self._settings_changed()

    @property
    def preferred_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes the model runs best at (a compiled engine's profiles, padding buckets), smallest first.

        When a slot is free and items wait, the batch goes out at the largest preferred size available; while
        none is reached it waits for the next one, at most until the oldest item's ``max_queue_time``, then sends
        what it has. Empty: any size up to ``max_batch_size``.
        """
        return self._preferred

    @preferred_batch_sizes.setter
    def preferred_batch_sizes(self, value: Iterable[int]) -> None:
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise TypeError(f"preferred_batch_sizes must be an iterable of ints, got {value!r}")
        given = list(value)
        name = f"each size of preferred_batch_sizes={given!r}"
        sizes = tuple(sorted({count(name, size, unlimited=False) for size in given}))
        if sizes and self._max_batch_size != -1 and sizes[-1] > self._max_batch_size:
            raise ValueError(f"preferred_batch_sizes={given!r} has a size above max_batch_size={self._max_batch_size}")
        self._preferred = sizes
        self._size_trigger = sizes[0] if sizes else self._batch_limit
        self._settings_changed()

    @property
    def max_queue_time(self) -> float:
        """The most seconds the oldest waiting item waits for its batch to fill, once a slot is free."""
        return self._max_queue_time

    @max_queue_time.setter
    def max_queue_time(self, value: float) -> None:
        self._max_queue_time = seconds("max_queue_time", value)
        self._settings_changed()

    @property
    def concurrency(self) -> int:
        """The most batches processed at once; ``-1`` for no limit."""
        return self._concurrency

    @concurrency.setter
    def concurrency(self, value: int) -> None:
        self._concurrency = count("concurrency", value)
        self._slot_limit = UNLIMITED if self._concurrency == -1 else self._concurrency
        self._settings_changed()

    @property
    def max_queue_size(self) -> int:
        """The most items waiting (batches in flight not counted); ``-1`` or ``0`` for no limit."""
        return self._max_queue_size

    @max_queue_size.setter
    def max_queue_size(self, value: int) -> None:
        self._max_queue_size = count("max_queue_size", value, zero_means_unlimited=True)
        self._room_limit = UNLIMITED if self._max_queue_size <= 0 else self._max_queue_size
        self._settings_changed(room=True)

    @property
    def max_batch_weight(self) -> float | None:
        """The most total ``item_weight`` in one batch; ``None`` for no limit."""
        return self._max_batch_weight

    @max_batch_weight.setter
    def max_batch_weight(self, value: float | None) -> None:
        if value is not None and (not is_real(value) or not is_finite(value) or value <= 0):
            raise ValueError(f"max_batch_weight must be None or a finite number > 0, got {value!r}")
        self._max_batch_weight = None if value is None else float(value)
        self._weight_limit = math.inf if value is None else float(value)
        self._settings_changed(weights=value is not None)

    @property
    def max_hold_time(self) -> float:
        """The most seconds, from a batch's end, that a free slot waits for the callers the batch answered to come
        back with their next items, while they are a closed loop (its last batch held them all); ``0``: never."""
        return self._max_hold_time

    @max_hold_time.setter
    def max_hold_time(self, value: float) -> None:
        self._max_hold_time = seconds("max_hold_time", value)
        self._settings_changed()

    @property
    def max_priority_wait(self) -> float:
        """The most seconds an item is passed over for items of a better priority."""
        return self._max_priority_wait

    @max_priority_wait.setter
    def max_priority_wait(self, value: float) -> None:
        self._max_priority_wait = seconds("max_priority_wait", value)

    @property
    def max_latency(self) -> float | None:
        """The latency budget of the adaptive wait (see :mod:`async_batcher.adaptive`); ``None``: fixed wait.

        When set, the batcher chooses how long batches wait from what it measures, and ``max_queue_time`` is not
        used.
        """
        return None if self._adaptive is None else self._adaptive.max_latency

    @max_latency.setter
    def max_latency(self, value: float | None) -> None:
        if value is None:
            self._adaptive = None
            self._size_trigger = self._preferred[0] if self._preferred else self._batch_limit
        else:
            budget = seconds("max_latency", value, positive=True)
            if self._adaptive is None:
                self._adaptive = AdaptiveWait(budget)
            else:
                self._adaptive.max_latency = budget  # keep what it has learned
        self._settings_changed()

    @property
    def adaptive_state(self) -> AdaptiveWaitState | None:
        """What the adaptive wait believes now (cost model, arrival rate, target size), or ``None`` when off."""
        return None if self._adaptive is None else self._adaptive.state(self._concurrency)

    @property
    def default_timeout(self) -> float | None:
        """Seconds an item may take at most (from its call, waiting for room included) when its call gives no
        ``timeout=`` of its own; ``None``: no limit. A call's own ``timeout=`` overrides it."""
        return self._default_timeout

    @default_timeout.setter
    def default_timeout(self, value: float | None) -> None:
        self._default_timeout = None if value is None else seconds("default_timeout", value)
        self._settings_changed()

    @property
    def stream_buffer(self) -> int:
        """The most parts a stream buffers for its consumer before its batch waits for it (streaming only)."""
        return self._stream_buffer

    @stream_buffer.setter
    def stream_buffer(self, value: int) -> None:
        self._stream_buffer = count("stream_buffer", value, unlimited=False)

    @property
    def stream_stall_timeout(self) -> float | None:
        """The most seconds a step of a streaming batch waits for a consumer whose buffer is full (it has taken none
        of its ``stream_buffer`` parts); that consumer is then treated as having left, its stream ending with
        ``TimeoutError`` after the parts buffered, and the batch goes on without it. ``None``: wait for it as long
        as it takes. Changed live, it applies to the waits in progress too, counted from when each began."""
        return self._stream_stall_timeout

    @stream_stall_timeout.setter
    def stream_stall_timeout(self, value: float | None) -> None:
        limit = math.inf if value is None else seconds("stream_stall_timeout", value)
        self._stream_stall_timeout = None if value is None else limit
        self._stall_limit = limit
        self._settings_changed(stall=True)

    @property
    def executor(self) -> concurrent.futures.Executor | None:
        """Where a plain ``def process_batch`` runs; the loop's default executor if ``None``."""
        return self._executor

    @executor.setter
    def executor(self, value: concurrent.futures.Executor | None) -> None:
        self._executor = executor(value)

    @property
    def wait_when_full(self) -> bool:
        """On a full queue, wait for room instead of raising :class:`~async_batcher.QueueFullException`."""
        return self._wait_when_full

    @wait_when_full.setter
    def wait_when_full(self, value: bool) -> None:
        self._wait_when_full = flag("wait_when_full", value)
