"""What the owner of a shared batcher (:mod:`async_batcher.shared`) asks of its batcher: items submitted without a
coroutine, and the callers whose items went into a batch (private).

The owner submits the items of other processes as they come off its sockets; a task per item would cost more than
the rest of the item's way. :meth:`Handoff.submit` is :meth:`AsyncBatcher.process
<async_batcher.AsyncBatcher.process>` without its coroutine: the item's future itself on the short path
(:meth:`Engine.put <async_batcher._core.engine.Engine.put>`); on the long paths (a timeout, a priority, keys, weights,
dedup, late refusal, a full queue, a batcher not running) a task of admission's, which honours them all. Either way,
cancelling the future withdraws the item as cancelling a caller of ``process()`` does.

:meth:`Handoff.watch` tells the owner, as each batch goes, the contexts its callers submitted from (and those of items
that join a running batch: a streaming one's, or a row in flight by ``dedup_key``): the owner tells its clients which
items have gone, so that when it dies they can tell "outcome unknown" from "never sent, safe to send again".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import Context
from functools import partial
from threading import get_ident
from typing import TYPE_CHECKING, Any, Final

from async_batcher._core.dedup import Shared

if TYPE_CHECKING:
    from async_batcher._core.admission import Admission
    from async_batcher._core.batch import Batch
    from async_batcher._core.engine import Engine
    from async_batcher._core.lifecycle import Lifecycle

__all__: list[str] = []

_ZERO: Final = 0


class Handoff:
    """A batcher's submissions without a coroutine, and its batches watched (see the module's docstring)."""

    __slots__ = ("admission", "life")

    def __init__(self, life: Lifecycle, admission: Admission) -> None:
        self.life = life
        self.admission = admission

    def submit(self, item: Any, timeout: float | None, priority: float) -> asyncio.Future[Any]:
        """Submit ``item`` from the running loop, which must be the batcher's (or the batcher not yet bound); return
        the future of its outcome. Cancelling it withdraws the item if it has not been sent."""
        run = self.life.run
        engine = run.fast
        if engine is not None and timeout is None and priority is _ZERO and get_ident() == run.ident:
            fut = engine.put(item)
            if fut is not None:
                fut.add_done_callback(partial(_left, engine))
                return fut
        return asyncio.ensure_future(self.admission.submit(item, timeout=timeout, priority=priority))

    def in_own_batch(self) -> bool:
        """Whether the running task is one of this batcher's batches (its ``process_batch``): a stop awaited there
        would wait for itself (as :meth:`AsyncBatcher.stop <async_batcher.AsyncBatcher.stop>` checks)."""
        engine = self.life.run.engine
        task = asyncio.current_task()
        return engine is not None and any(batch.handle is task for batch in engine.dispatcher.batches)

    def watch(
        self, sent: Callable[[list[Context]], None], ended: Callable[[list[Context]], None] | None = None
    ) -> Callable[[], None]:
        """Call ``sent`` with the callers' contexts of each batch of the current run as it goes (before
        ``process_batch`` is called), and of the items that join a running batch (a streaming one's new items, the
        callers that join a row in flight); ``ended`` with them as it ends (its callers' futures resolved: their
        callbacks run in the loop's next turn). Return what stops it."""
        engine = self.life.run.engine
        if engine is None:
            raise RuntimeError(f"{self.life.name} is not started: no batch to watch")

        def on_sent(batch: Batch) -> None:
            sent(_contexts(batch))

        def on_ended(batch: Batch) -> None:
            if ended is not None:
                ended(_contexts(batch))

        pair = (on_sent, on_ended if ended is not None else _ignore)
        dispatcher = engine.dispatcher
        dispatcher.watchers.append(pair)
        dispatcher.joiners.append(sent)

        def unwatch() -> None:
            if pair in dispatcher.watchers:
                dispatcher.watchers.remove(pair)
            if sent in dispatcher.joiners:
                dispatcher.joiners.remove(sent)

        return unwatch


def _contexts(batch: Batch) -> list[Context]:
    """The contexts of a batch's callers: one per item, and those of the callers that share a row (``dedup_key``)."""
    contexts: list[Context] = batch.contexts
    joined = [context for sink in batch.sinks if sink.__class__ is Shared for context in sink.contexts[1:]]
    return [*contexts, *joined] if joined else contexts


def _left(engine: Engine, fut: asyncio.Future[Any]) -> None:
    if fut.cancelled():
        engine.left_sink(fut)


def _ignore(batch: Batch) -> None:
    pass
