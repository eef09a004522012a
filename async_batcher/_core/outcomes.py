"""How a batch's callers get their outcome: the results ``process_batch`` returned, checked and handed out, or an error
given to every caller still waiting, logged as what it is (private; the execution layer's). The runner ends its
batches through an :class:`Outcomes`, and so does the failure handling (:mod:`~async_batcher._core.recovery`), which
is given the runner's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import TYPE_CHECKING, Any

from async_batcher._checks import plural
from async_batcher._core.sinks import as_results, deliver, fail_sinks
from async_batcher.exceptions import AsyncBatchException, BatcherStoppedError, ProcessBatchCancelledError

if TYPE_CHECKING:
    from async_batcher._core.batch import Batch
    from async_batcher.stats import _Recorder

__all__: list[str] = []

logger = logging.getLogger("async_batcher")


class Outcomes:
    """The outcomes of one batcher's batches: ``name`` for the log, ``recorder`` for the statistics."""

    __slots__ = ("name", "recorder")

    def __init__(self, name: str, recorder: _Recorder) -> None:
        self.name = name
        self.recorder = recorder

    def answer(self, batch: Batch, results: Any) -> int:
        """Hand each caller its result; if the results do not fit the batch, each caller gets why. Return how many
        calls that resolved."""
        try:
            checked = as_results(results, batch.size)
        except Exception as exc:  # the wrong number of results, or not a sequence
            logger.warning("%s: %s", self.name, exc)
            discard(results)
            return fail_sinks(batch.sinks, exc, self.recorder)
        return deliver(batch.sinks, checked, self.recorder, futures_only=batch.futures_only)

    def fail(self, batch: Batch, error: BaseException, *, cut_off: bool) -> int:
        """Give every caller of the batch still waiting the error (a ``KeyboardInterrupt`` or ``SystemExit`` is
        raised on after); return how many calls that resolved.

        A ``CancelledError`` becomes :class:`ProcessBatchCancelledError`, so that a caller is never mistaken for
        cancelled; a ``BaseException`` that is not an ``Exception`` reaches the callers wrapped. ``cut_off``: the
        error is the batcher's, not ``process_batch``'s: the batch's task was cancelled from outside (the event loop
        shutting down), and the log says so.
        """
        name, items = self.name, plural(batch.size, "item")
        reported: BaseException = error
        if cut_off:
            logger.warning(
                "%s: a batch of %s was cut off, its task cancelled (the event loop shutting down); its callers get %s",
                name,
                items,
                type(error).__name__,
            )
            return fail_sinks(batch.sinks, error, self.recorder)
        if isinstance(error, asyncio.CancelledError):
            reported = ProcessBatchCancelledError(f"{name}: process_batch raised CancelledError on a batch of {items}")
        elif isinstance(error, KeyboardInterrupt | SystemExit):
            reported = BatcherStoppedError(f"{name}: batch interrupted by {type(error).__name__}")
        elif not isinstance(error, Exception):  # GeneratorExit, or a BaseException of the user's
            reported = AsyncBatchException(
                f"{name}: process_batch raised {type(error).__name__}, which is not an Exception, on a batch of {items}"
            )
            reported.__cause__ = error
        if not batch.entered:  # on_start() failed, or the executor refused the batch: not process_batch's doing
            logger.warning("%s: a batch of %s failed before process_batch: %s", name, items, type(error).__name__)
        elif reported is error:
            logger.warning("%s: process_batch raised %s on a batch of %s", name, type(error).__name__, items)
        else:
            logger.warning("%s", reported)  # its message names the batcher
        resolved = fail_sinks(batch.sinks, reported, self.recorder)
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise error
        return resolved


def discard(results: Any) -> None:
    """Results no one will read: a coroutine among them must not warn that it was never awaited."""
    if inspect.iscoroutine(results):
        results.close()
