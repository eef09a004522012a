"""How a batch ends: its callers get their results (:meth:`Ending.answer`) or the error (:meth:`Ending.fail`), then
it frees its slot (:meth:`Ending.release`), telling the engine through the callback it gave (private). The half of
the :class:`~async_batcher._core.execution.Runner` that every path of a batch ends in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from async_batcher._core.batch import Batch, Hooks
from async_batcher._core.outcomes import Outcomes, discard
from async_batcher._core.sinks import fail_sinks
from async_batcher.exceptions import AsyncBatchException

if TYPE_CHECKING:
    from async_batcher._core.feedback import Feedback
    from async_batcher._core.recovery import Recovery
    from async_batcher.stats import _Recorder

__all__: list[str] = []

logger = logging.getLogger("async_batcher")


class Ending:
    """The end of a batch, on every path (see the module's docstring)."""

    # The runner's, read here.
    hooks: Hooks
    name: str
    loop: asyncio.AbstractEventLoop
    clock: Callable[[], float]
    recorder: _Recorder
    on_end: Callable[[Batch, int], None]
    recovery: Recovery | None
    feedback: Feedback
    outcomes: Outcomes

    def launch(self, batch: Batch) -> None: ...

    # ------------------------------------------------------------------ the end of a batch

    def end(
        self,
        batch: Batch,
        *,
        results: Any = None,
        error: BaseException | None = None,
        ran: bool,
        cut_off: bool = False,
    ) -> None:
        """A batch has ended with ``results`` or ``error``: answer or fail its callers, then free its slot.

        ``ran``: the batch reached ``process_batch`` (the call counts in the statistics, however it ended).
        ``cut_off``: ``error`` is not ``process_batch``'s but the batcher's, as its task was cancelled from outside.
        With failure handling (a :class:`~async_batcher._core.recovery.Recovery`) the call's end is its: the batch
        may go on with another call of a part of it, keeping its slot.
        A ``KeyboardInterrupt`` or ``SystemExit`` is raised on once the callers have their answer.
        """
        # The batch's task and its context hold the batch (current_batch): let go of them, or they would keep each
        # other, and the batch's items and callers, alive until the cyclic garbage collector runs.
        batch.let_go()
        goes_on = False
        try:
            if ran:
                self.record(batch)
            if batch.abandoned:
                discard(results)
                return
            tree = batch.tree
            recovery = self.recovery if tree is None else tree.recovery
            if recovery is not None and (ran or tree is not None):
                if cut_off:
                    recovery.fold(batch)  # (the parts not called yet fail with it)
                else:
                    # What failed is tried again, split or bisected: the batch may go on, in its slot.
                    goes_on = self.settle(recovery, batch, results, error, ran=ran)
                    return
            if ran:
                self.recorder.processed(batch.size)
            if error is not None:
                batch.answered = self.fail(batch, error, cut_off=cut_off)
            else:
                batch.answered = self.answer(batch, results)
        finally:
            if not goes_on:
                self.release(batch)

    def settle(self, recovery: Recovery, batch: Batch, results: Any, error: BaseException | None, *, ran: bool) -> bool:
        """:meth:`Recovery.settle`, such that even a bug in it cannot leave a caller waiting: every item of the batch
        left without an answer fails, and the batch ends."""
        try:
            if recovery.settle(batch, results, error, ran=ran):
                self.launch(batch)  # its next part, in its slot
                return True
            return False
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            self.loop.call_exception_handler(
                {"message": f"{self.name}: internal error while handling a failed batch", "exception": exc}
            )
            recovery.fold(batch)
            failed = AsyncBatchException(f"{self.name}: internal error while handling a failed batch: {exc!r}")
            tree = batch.tree
            batch.answered = (0 if tree is None else tree.answered) + fail_sinks(batch.sinks, failed, self.recorder)
            batch.tree = None
            return False

    def stopped_error(self, batch: Batch, error: BaseException) -> BaseException:
        """What the callers of a batch cut off by a stop get: ``error`` if ``process_batch`` never started on it,
        else what :meth:`AsyncBatcher.abandoned_error` says (its outcome may be unknown). A hook that fails is
        reported through the loop's exception handler, and ``error`` is used."""
        if not batch.entered:
            return error
        try:
            chosen = self.hooks.abandoned_error(batch.items, error)
            if not isinstance(chosen, BaseException):
                raise TypeError(f"abandoned_error() must return an exception instance, got {chosen!r}")
        except Exception as exc:
            self.loop.call_exception_handler(
                {
                    "message": f"{self.name}: {type(self.hooks).__name__}.abandoned_error() failed; its callers get "
                    f"{error!r}",
                    "exception": exc,
                }
            )
            return error
        if chosen is not error and chosen.__cause__ is None:
            chosen.__cause__ = error
        return chosen

    def abandon(self, batch: Batch, exc: AsyncBatchException) -> None:
        """A forced stop (or an internal error) cuts ``batch`` off: its callers get ``exc`` (or what
        :meth:`stopped_error` says), the parts of it not called yet ``exc``, and its task is cancelled; it answers no
        one from now on (a batch running in a thread runs on to its end unheard)."""
        batch.abandoned = True
        fail_sinks(batch.sinks, self.stopped_error(batch, exc), self.recorder)
        if batch.tree is not None:  # the parts of it not called yet
            fail_sinks(batch.tree.pending_sinks(), exc, self.recorder)
        if isinstance(batch.handle, asyncio.Task):
            batch.handle.cancel()

    def release(self, batch: Batch) -> None:
        """Free the batch's slot (unless a stop already did): the engine looks again, so that a free slot never
        idles while a batch is due."""
        if batch.abandoned or batch.released:
            return
        batch.released = True
        self.on_end(batch, batch.answered)

    def answer(self, batch: Batch, results: Any) -> int:
        """Hand each caller its result (:meth:`Outcomes.answer`); return how many calls that resolved."""
        return self.outcomes.answer(batch, results)

    def fail(self, batch: Batch, error: BaseException, *, cut_off: bool) -> int:
        """Give every caller still waiting the error (:meth:`Outcomes.fail`); return how many calls that resolved."""
        return self.outcomes.fail(batch, error, cut_off=cut_off)

    def record(self, batch: Batch) -> None:
        """The statistics of a call of ``process_batch`` that has ended."""
        # (batch.waited written out: a property is a Python call)
        self.recorder.batch_ended(batch.size, batch.started - batch.oldest, self.clock() - batch.called, batch.reason)
