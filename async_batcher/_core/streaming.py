"""Streaming results: a ``process_batch`` that is an async generator, and each caller's stream (private).

This is the producer's side, a layer with execution: :class:`StreamSink`, a caller's stream, and
:class:`StreamRunner`, which steps the generator. The consumer's side, ``stream(item)``, is admission's
(:func:`async_batcher._core.admission.submit_stream`).

Each step of the generator yields a sequence with one element per item of the batch, as the batch is at that
step: a part of that item's stream, :data:`~async_batcher.END` (that item's stream is complete), or an
``Exception`` (raised to that item's consumer, whose stream ends). When the generator returns, every stream still
open ends; when it raises, every stream still open ends with that error.

Between two steps the batcher edits the batch list in place: the items whose streams have ended, failed, or
whose consumers left are removed, and, with ``continuous_batching``, items waiting in the queue join it (up to
``max_batch_size``). A generator that keeps state per item keys it by the item, not by its position.

Backpressure: each stream buffers at most ``stream_buffer`` parts its consumer has not taken yet; the generator is
not advanced while a stream's buffer is full, so a batch moves at the pace of its slowest consumer, and memory stays
bounded. A step waits at most ``stream_stall_timeout`` for the consumers whose buffers are full: one that has taken
nothing by then is treated as having left (its stream ends with ``TimeoutError`` after the parts buffered), so that
a consumer that stopped reading without leaving (a ``break`` out of a stream still referenced) holds neither the
other streams of its batch nor a stop for longer.

The generator is closed (its ``finally`` runs) before the batch frees its slot; a generator that fails to close
(its ``finally`` raises, or it ignores ``GeneratorExit``) is logged, and the batch ends all the same.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher._core.batch import Batch, current_batch
from async_batcher._core.execution import Runner
from async_batcher._core.failures import Retry
from async_batcher._core.sinks import END, as_results
from async_batcher.exceptions import BatcherStoppedError
from async_batcher.stats import FAILED, SUCCEEDED, TIMED_OUT

if TYPE_CHECKING:
    from async_batcher.stats import _Recorder

__all__: list[str] = []

logger = logging.getLogger("async_batcher")


class StreamSink(asyncio.Future[None]):
    """One caller's stream: the parts delivered and not yet taken, in order, then its end.

    As a future it is done once the stream is over: complete (result ``None``), failed (its exception), or left by
    its consumer (cancelled). The parts delivered before that are still handed out, then the end or the error.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, recorder: _Recorder) -> None:
        super().__init__(loop=loop)
        self._parts: deque[Any] = deque()
        self.limit = limit  # the most parts buffered (stream_buffer as it was submitted): the producer waits beyond
        self._recorder = recorder
        # What the consumer awaits while nothing is buffered; None while it is not waiting.
        self._signal: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None  # what the producer awaits while the buffer is full

    # -- the producer's side (the batch)

    def put(self, part: Any) -> None:
        if not self.done():
            self._parts.append(part)
            self._wake_consumer()

    def end(self) -> None:
        """The stream is complete: its consumer gets the parts delivered, then the end."""
        if not self.done():
            self.set_result(None)
            self._recorder.resolved(1, SUCCEEDED)

    def set_result(self, result: None) -> None:
        super().set_result(result)
        self._wake_consumer()
        self.wake_producer()

    def set_exception(self, exception: type | BaseException) -> None:
        super().set_exception(exception)
        self.exception()  # handed to the consumer by next(), not left to "exception was never retrieved"
        self._wake_consumer()
        self.wake_producer()

    def cancel(self, msg: Any | None = None) -> bool:
        cancelled = super().cancel(msg)
        self._parts.clear()
        self.wake_producer()
        return cancelled

    def full(self) -> bool:
        return len(self._parts) >= self.limit and not self.done()

    async def room(self, deadline: Callable[[], float]) -> bool:
        """Wait until the consumer has taken a part, or the stream is over: True; False once ``deadline()`` (on the
        loop's clock; ``inf``: none; asked again each time the producer is woken, as a live change of the stall
        timeout does) has come, its buffer still full and its consumer not about to take a part (a consumer woken
        by the last part, which the loop has not run yet, is not stalled)."""
        loop = self.get_loop()
        while self.full():
            self._room = waiter = loop.create_future()
            at = deadline()
            timer = None if at == math.inf else loop.call_at(at, _wake, waiter)
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
            if self.full() and self._signal is None and loop.time() >= deadline():
                return False
        return True

    # -- the consumer's side (stream())

    async def next(self) -> Any:
        """The next part; :data:`END` once the stream is complete; its error once it failed."""
        while not self._parts:
            if self.done():
                if self.cancelled():
                    raise asyncio.CancelledError
                error = self.exception()
                if error is not None:
                    raise error
                return END
            self._signal = self.get_loop().create_future()
            try:
                await self._signal
            finally:
                self._signal = None  # (not waiting any more: see room())
        part = self._parts.popleft()
        self.wake_producer()
        return part

    def _wake_consumer(self) -> None:
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)

    def wake_producer(self) -> None:
        if self._room is not None:
            _wake(self._room)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


# ---------------------------------------------------------------------- the producer's side


class StreamRunner(Runner):
    """The :class:`~async_batcher._core.execution.Runner` of a streaming ``process_batch``: each batch is a task that
    steps the generator, hands out the parts, and edits the batch between steps."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.is_stream = True

    def launch(self, batch: Batch) -> None:
        batch.context = self.context.copy()
        batch.handle = self.loop.create_task(self.run_stream_batch(batch), context=batch.context)

    async def run_stream_batch(self, batch: Batch) -> None:
        """Step the generator, hand out the parts, edit the batch between steps; close the generator, and free the
        slot whatever happens on the way."""
        entered = 0  # items that reached process_batch: those it started with, then those that joined
        steps: Any = None
        try:
            try:
                if self.startup is not None:
                    await self.wait_for_start(self.startup)
                _compact(batch)
                if not batch.items:
                    return
                # Its size: the most items it holds at once (items join and leave a stream batch as it runs).
                entered = batch.size = len(batch.items)
                current_batch.set(batch)
                self.calling(batch)
                batch.entered = True
                steps = self.call(batch.items)
                async for parts in steps:
                    self._deliver(batch, as_results(parts, len(batch.items)))
                    await self._wait_for_consumers(batch)
                    _compact(batch)
                    if self.hooks.continuous_batching:
                        entered += self.join(batch)
                    if not batch.items:
                        return  # every stream has ended (the generator is closed on the way out)
                for sink in batch.sinks:  # the generator returned: the streams still open are complete
                    sink.end()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # a forced stop, or the loop shutting down
                    if not batch.abandoned:  # (a forced stop answered its callers already)
                        stopped = BatcherStoppedError(f"{self.name}: stream batch cancelled")
                        self._fail(batch, self.stopped_error(batch, stopped), cut_off=True)
                    raise
                self._fail(batch, asyncio.CancelledError())
            except BaseException as exc:  # process_batch raised, or its parts did not fit (a KeyboardInterrupt goes on)
                self._fail(batch, exc)
            finally:
                if steps is not None:
                    await self._close(steps)
        finally:
            self._end(batch, entered)

    async def _close(self, steps: Any) -> None:
        """Close the generator: its ``finally`` runs. Every stream of the batch has ended by then; a generator that
        fails to close (its ``finally`` raises, or it ignores ``GeneratorExit`` and yields again) is only logged."""
        try:
            await steps.aclose()
        except Exception as exc:
            logger.warning("%s: process_batch's generator raised %s as it was closed", self.name, type(exc).__name__)

    def _deliver(self, batch: Batch, parts: Any) -> None:
        for sink, part in zip(batch.sinks, parts, strict=True):
            if sink.done():
                continue  # its consumer left, or it already ended: the part is dropped
            if part is END:
                sink.end()
            elif part.__class__ is Retry:  # (a stream's items are not tried again: its error ends the stream)
                self.recorder.resolved(1, FAILED)
                sink.set_exception(part.outcome("a streaming process_batch is not retried"))
            elif isinstance(part, Exception):
                self.recorder.resolved(1, FAILED)
                sink.set_exception(part)
            else:
                sink.put(part)

    async def _wait_for_consumers(self, batch: Batch) -> None:
        """Backpressure: wait while a stream's buffer is full, at most ``stream_stall_timeout`` for the step (as it
        is now: a live change applies to the wait in progress); a consumer that has taken nothing by then is treated
        as having left."""
        deadline = None
        for sink in batch.sinks:
            if sink.full():
                if deadline is None:
                    deadline = partial(self._stall_deadline, self.loop.time())
                if not await sink.room(deadline):
                    self.recorder.resolved(1, TIMED_OUT)
                    sink.set_exception(
                        TimeoutError(
                            f"{self.name}: the stream's consumer took none of its {sink.limit} buffered parts within "
                            f"stream_stall_timeout={self.stall_limit} s; it was dropped from its batch"
                        )
                    )

    def _stall_deadline(self, since: float) -> float:
        return since + self.stall_limit

    def _fail(self, batch: Batch, error: BaseException, *, cut_off: bool = False) -> None:
        """The streams still open end with ``error``, logged (unless a forced stop answered them already)."""
        if not batch.abandoned:
            self.fail(batch, error, cut_off=cut_off)

    def _end(self, batch: Batch, entered: int) -> None:
        """The batch is over: its statistics (if it reached process_batch), then its slot."""
        batch.let_go()  # (it answers no callers: a stream's consumer comes back on its own, no hold is for it)
        if entered:
            self.record(batch)
            if not batch.abandoned:
                self.recorder.processed(entered)
        self.release(batch)


def _compact(batch: Batch) -> None:
    """Keep, in place, only the items whose streams are still open (and their weights and deadlines)."""
    if any(sink.done() for sink in batch.sinks):
        kept = [i for i, sink in enumerate(batch.sinks) if not sink.done()]
        batch.items[:] = [batch.items[i] for i in kept]
        batch.sinks[:] = [batch.sinks[i] for i in kept]
        batch.contexts[:] = [batch.contexts[i] for i in kept]
        if batch.weights is not None:
            batch.weights[:] = [batch.weights[i] for i in kept]
        if batch.deadlines is not None:
            batch.deadlines[:] = [batch.deadlines[i] for i in kept]
