"""The engine of one run: it composes what waits (the :class:`~async_batcher._core.queue.Queue`, the
:class:`~async_batcher._core.room.Room`, the callers' :class:`~async_batcher._core.deadlines.Deadlines`), the
:class:`~async_batcher._core.dispatcher.Dispatcher` (the slots, the pump, the timer: when batches go), the run's
:class:`~async_batcher._core.execution.Runner` (how they run) and its
:class:`~async_batcher._core.feedback.RunFeedback` (what a failed call leads to) (private).

Items come in through :meth:`Engine.put` (the common case: the default lane, priority 0) and
:meth:`Engine.put_entry`: queue it, tell the dispatcher (:meth:`Dispatcher.arrived
<async_batcher._core.dispatcher.Dispatcher.arrived>`), as CPython's ``Queue.put`` is "wait while full, then
``put_nowait``" (the wait for room is admission's). Items leave without a batch (a caller gone, a deadline past)
through the engine, which tells the room and the dispatcher; a stop drains or aborts the run. Each part is told of the
others through the callbacks the engine gave it: the dispatcher's ``on_idle`` and ``on_fault``, the runner's
``on_end`` (the dispatcher's), the feedback's ``requeue``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from contextvars import copy_context
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher._checks import plural
from async_batcher._core.batch import Batch, Watcher, current_batch
from async_batcher._core.deadlines import Deadlines
from async_batcher._core.deadlines import violations as deadline_violations
from async_batcher._core.dispatcher import Dispatcher
from async_batcher._core.execution import Runner
from async_batcher._core.feedback import RunFeedback
from async_batcher._core.lane import Entry, Lane, WeightedEntry
from async_batcher._core.layers import keeps
from async_batcher._core.policy import DispatchPolicy
from async_batcher._core.queue import Queue
from async_batcher._core.queue import violations as queue_violations
from async_batcher._core.retrying import sink_of
from async_batcher._core.room import Room
from async_batcher._core.room import violations as room_violations
from async_batcher._core.sinks import Bulk, fail_sinks
from async_batcher._core.state import DISPATCHING, UNLIMITED, State
from async_batcher.exceptions import AsyncBatchException, BatcherStoppedError, ReentrantCallError
from async_batcher.stats import CANCELLED, FAILED, TIMED_OUT

if TYPE_CHECKING:
    from async_batcher._core.recovery import Recovery
    from async_batcher.stats import _Recorder

__all__: list[str] = []


def _ignore() -> None:
    pass


class Engine:
    """One run's queue, room, deadlines, dispatcher, runner and feedback (see the module's docstring).

    Invariants (checked by the property test through :func:`violations`): the queue's, the room's, the deadlines' and
    the dispatcher's.
    """

    __slots__ = (
        "clock",
        "deadlines",
        "dispatcher",
        "feedback",
        "keyed",
        "loop",
        "name",
        "new_future",
        "on_drained",
        "queue",
        "recorder",
        "room",
        "runner",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        recorder: _Recorder,
        runner: Callable[..., Runner],
        policy: DispatchPolicy,
        *,
        name: str,
        keyed: bool,
        weighted: bool,
        watchers: list[Watcher] | None = None,
    ) -> None:
        self.loop = loop
        self.name = name
        self.recorder = recorder
        # The loop's clock and its futures: for the standard loop, time.monotonic and the C Future class directly,
        # to spare a Python frame per item; a loop with a clock of its own (a test's virtual clock, uvloop) is asked.
        self.clock: Callable[[], float] = loop.time
        if type(loop).time is asyncio.BaseEventLoop.time:
            import time

            self.clock = time.monotonic
        self.new_future: Callable[[], asyncio.Future[Any]] = (
            partial(asyncio.Future, loop=loop)
            if type(loop).create_future is asyncio.BaseEventLoop.create_future
            else loop.create_future
        )
        self.keyed = keyed  # batch_key is overridden: each item is asked its key
        self.queue = Queue(recorder, weighted=weighted)
        self.queue.expire = self.expire_late
        self.room = Room(self.queue, name)
        self.deadlines = Deadlines(loop)  # the callers' timeouts: one timer for all of them
        self.dispatcher = Dispatcher(
            loop,
            self.queue,
            self.room,
            recorder,
            policy,
            name=name,
            watchers=[] if watchers is None else watchers,
            on_idle=self.check_drained,
            on_fault=self.abort,
            clock=self.clock,
        )
        # How this run's batches run: made here, told of their end, of how items join a streaming batch, and of what
        # a failed call leads to (the run's feedback: retries, backoffs, ceilings).
        self.feedback = RunFeedback(loop, self.queue, self.requeue, self.dispatcher.part_sent)
        self.runner = runner(on_end=self.dispatcher.batch_ended, join=self.dispatcher.join, feedback=self.feedback)
        self.dispatcher.runner = self.runner
        self.runner.clock = self.clock
        self.on_drained: Callable[[], None] = _ignore  # the stop's: called once, as the drain ends

    @property
    def state(self) -> State:
        """Where the run is in its life (its dispatcher's: RUNNING, STOPPING, then STOPPED)."""
        return self.dispatcher.state

    # ------------------------------------------------------------------ settings

    def configure(
        self,
        *,
        batch_limit: int,
        slot_limit: int,
        room_limit: int,
        queue_size: int | None,
        queue_weight_limit: float,
        weight_limit: float,
        priority_wait: float,
        policy: DispatchPolicy,
        stall_limit: float,
        recovery: Recovery | None = None,
    ) -> None:
        """The settings as they are now: they apply from the next batch (:meth:`Dispatcher.repump` to look again)."""
        self.runner.stall_limit = stall_limit
        self.runner.recover_with(recovery)
        self.feedback.configure(
            None if recovery is None else recovery.retry, None if recovery is None else recovery.split
        )
        dispatcher = self.dispatcher
        dispatcher.batch_limit, dispatcher.slot_limit, dispatcher.weight_limit = batch_limit, slot_limit, weight_limit
        self.room.set_limit(room_limit, queue_size, queue_weight_limit)
        dispatcher.priority_wait = priority_wait
        if policy is not dispatcher.policy:
            policy.bind(dispatcher)  # (before it is switched in: one whose bind() raises is not)
            old, dispatcher.policy = dispatcher.policy, policy
            try:
                if not keeps(policy, old):  # (one the new policy wraps goes on)
                    old.replaced(policy, self.queue.lanes.values(), self.loop.time())
            except Exception as exc:  # (the new policy is in place: the batcher serves on)
                message = f"{self.name}: {type(old).__name__}.replaced() raised"
                self.loop.call_exception_handler({"message": message, "exception": exc})
        if self.room.putters:
            self.room.wake()

    # ------------------------------------------------------------------ coming in

    def put(self, item: Any) -> asyncio.Future[Any] | None:
        """Queue ``item`` in the default lane at priority 0, tell the dispatcher, and return the future its caller
        awaits (:meth:`left` if the caller leaves); ``None`` if it must wait for room (or be refused). The common
        case, kept short: the item joins the column at the end of the default level
        (:class:`~async_batcher._core.lane.Column`: no object of its own), and the dispatcher is told only when it
        may act (a slot free, no pump to come)."""
        queue = self.queue
        room = self.room
        if room.putters or (room.limited and queue.waiting + room.reserved >= room.limit):
            return None
        col = queue.col
        if col is None:
            col = queue.open_column()
        sink = self.new_future()
        col.items.append(item)
        col.sinks.append(sink)
        col.contexts.append(copy_context())
        col.arrivals.append(self.clock())
        lane = queue.lane0
        lane.count += 1
        queue.waiting += 1
        dispatcher = self.dispatcher
        if dispatcher.in_flight < dispatcher.slot_limit:
            if dispatcher.pump_handle is None:  # (else the pump to come looks at it)
                try:
                    dispatcher.arrived(lane)
                except RuntimeError:  # its loop is closed: as if the item had never come (the long path starts anew)
                    self.unsubmit(sink)
                    return None
        elif current_batch.get() is not None:  # (even with a pump to come: it finds no free slot either)
            self.refuse_queued_if_reentrant(sink)
        return sink

    def put_entry(self, entry: Entry, priority: float) -> None:
        """Queue a single item's entry (any lane, weight, priority) and tell the dispatcher."""
        self.queue.push(entry, priority)
        self.dispatcher.arrived(entry.lane)  # type: ignore[arg-type]

    def put_bulk(self, bulk: Bulk, priority: float) -> None:
        """Queue a ``process_many`` call: one entry of the default lane, or an entry per item in its lane; tell the
        dispatcher."""
        if bulk.entries is None:
            self.queue.push_bulk(bulk, priority)
            self.dispatcher.arrived(self.queue.lane0)
            return
        for entry in bulk.entries:
            self.queue.push(entry, priority)
        for lane in dict.fromkeys(entry.lane for entry in bulk.entries):
            self.dispatcher.arrived(lane)  # type: ignore[arg-type]

    def lane(self, key: Hashable) -> Lane:
        return self.queue.lane(key)

    # ------------------------------------------------------------------ leaving without a batch

    def left(self, entry: Entry) -> None:
        """The caller of ``entry`` was cancelled: if its future was (its own cancellation, not an error of
        ``process_batch``), it counts as cancelled, and its item is withdrawn if it has not been sent."""
        if entry.sink.cancelled():
            self.recorder.resolved(1, CANCELLED)
            self.withdraw(entry)

    def left_sink(self, sink: asyncio.Future[Any]) -> None:
        """:meth:`left` for an item :meth:`put` queued (its future, ``sink``)."""
        if sink.cancelled():
            self.recorder.resolved(1, CANCELLED)
            if self.queue.withdraw_sink(sink):
                self._withdrawn()

    def withdraw(self, entry: Entry) -> None:
        """Take an item out of the queue if it is still there: it will never be sent."""
        if self.queue.withdraw(entry):
            self._withdrawn()

    def withdraw_bulk(self, bulk: Bulk) -> None:
        """Take what is still queued of a ``process_many`` call out of the queue."""
        if self.queue.withdraw_bulk(bulk):
            self._withdrawn()

    def unsubmit(self, sink: asyncio.Future[Any]) -> None:
        """Take back an item :meth:`put` queued (its future, ``sink``) on a loop that turned out not to be the running
        one: as if it had never been submitted (it is submitted again, on the long path)."""
        if self.queue.withdraw_sink(sink):
            self.recorder.returned(1)

    def _withdrawn(self) -> None:
        # Items left without a batch: room for those in line, the dispatcher told, and perhaps the end of a drain.
        if self.room.putters:
            self.room.wake()
        self.dispatcher.withdrawn()
        self.check_drained()

    def expire_late(self, entry: Any) -> None:
        """An item whose caller's deadline has passed left the queue as its batch formed: it is never sent; its
        caller gets ``TimeoutError`` (a ``process_many`` call's: the whole call, as its own timeout does)."""
        bulk = entry if entry.__class__ is Bulk else entry.sink if entry.sink.__class__ is Bulk else None
        if bulk is None:
            sink = entry.sink
            if not sink.done():
                self.recorder.resolved(1, TIMED_OUT)
                sink.set_exception(TimeoutError(f"{self.name}: no result within the timeout"))
            return
        if not bulk.future.done():
            self.recorder.resolved(len(bulk.items), TIMED_OUT)
            bulk.future.set_exception(TimeoutError(f"{self.name}: no results within the timeout"))
        self.queue.withdraw_bulk(bulk)

    def refuse_queued_if_reentrant(self, sink: asyncio.Future[Any]) -> None:
        """:meth:`put` found every slot taken: an item queued (its future, ``sink``) from inside one of this engine's
        batches would wait for its own batch forever. Take it back and fail it, its one outcome."""
        if not self.inside_own_batch():
            return
        self.queue.withdraw_sink(sink)
        self.recorder.resolved(1, FAILED)
        sink.set_exception(self.reentrant_error())

    def inside_own_batch(self) -> bool:
        """Whether the running code is inside one of this run's batches still in flight (its task, or its
        thread's)."""
        inside = current_batch.get()
        return inside is not None and inside.owner is self.dispatcher and inside.is_live()

    def waits_for_itself(self) -> bool:
        """Every slot is taken and the running code is inside one of this run's batches: an item it submits (or a
        wait for room) would wait for its own batch forever."""
        dispatcher = self.dispatcher
        return dispatcher.in_flight >= dispatcher.slot_limit and self.inside_own_batch()

    def blocks_itself(self, inside: Batch) -> bool:
        """Every slot is taken and ``inside`` (the batch whose thread is running) is one of this run's: a blocking
        call from there would wait for that batch forever."""
        dispatcher = self.dispatcher
        return inside.owner is dispatcher and dispatcher.in_flight >= dispatcher.slot_limit

    def slots_named(self) -> int | None:
        """``concurrency`` as the batcher's settings say it (``None``: no limit)."""
        slot_limit = self.dispatcher.slot_limit
        return None if slot_limit == UNLIMITED else slot_limit

    def reentrant_error(self) -> ReentrantCallError:
        slots = self.slots_named()
        return ReentrantCallError(
            f"{self.name}: an item submitted (process(), process_many() or stream()) from inside its own process_batch "
            f"while every slot (concurrency={slots}) is taken would wait for its own batch forever; raise "
            "concurrency, or do the work directly"
        )

    # ------------------------------------------------------------------ retried items coming back

    def requeue(self, key: Hashable, entries: Sequence[WeightedEntry]) -> None:
        """Retried items, their backoff over: to the head of ``key``'s lane (``feedback``'s ``requeue``)."""
        live = [entry for entry in entries if not entry.sink.done()]  # (a caller who left meanwhile: not sent)
        if live and self.state not in DISPATCHING:  # (not reached: a stop fails them, and cancels their timers)
            fail_sinks(
                [sink_of(entry) for entry in live], BatcherStoppedError(f"{self.name} is stopped"), self.recorder
            )
        elif live:
            lane = self.queue.lane(key)  # (the lane of the key now: an idle lane may have been let go meanwhile)
            for entry in live:
                entry.lane = lane
            self.queue.push_front(lane, live)
            self.dispatcher.repump()
        elif not self.queue.waiting:
            self.check_drained()

    # ------------------------------------------------------------------ stopping, failing everything

    def begin_stop(self, exc: BaseException, on_drained: Callable[[], None]) -> None:
        """Refuse new items and the callers in line for room (with ``exc``); send what waits without waiting for
        deadlines; call ``on_drained`` once nothing is queued or in flight."""
        self.on_drained = on_drained
        self.room.fail(exc)
        self.dispatcher.drain()
        self.check_drained()

    def abort(self, exc: AsyncBatchException) -> None:
        """Fail every queued, waiting and in-flight caller with ``exc``; cancel the batches in flight and free their
        slots. A batch running in a thread runs on to its end unheard; one still waiting for a thread never starts.
        The callers of a batch cut off inside ``process_batch`` get what ``abandoned_error()`` says."""
        rec = self.recorder
        fail_sinks(self.queue.clear(), exc, rec)
        fail_sinks([sink_of(entry) for entry in self.feedback.backoffs.clear()], exc, rec)
        self.room.fail(exc)
        self.dispatcher.abandon(exc)
        self.check_drained()

    def check_drained(self) -> None:
        """During a stop: once nothing is queued or in flight, the drain is over (the stop's ``on_drained``, once)."""
        if (
            self.dispatcher.state is State.STOPPING
            and not self.queue.waiting
            and not self.dispatcher.in_flight
            and not self.feedback.backoffs.waiting
        ):
            on_drained, self.on_drained = self.on_drained, _ignore
            on_drained()

    def finish(self) -> None:
        """The end of the run: no wake-up left, and the state says so."""
        self.feedback.backoffs.clear()
        self.dispatcher.close()  # (a stopped run is never dispatched again: a new run starts afresh)

    def stall_changed(self) -> None:
        """The stall timeout changed: the streaming batches waiting for a consumer look at their deadline again."""
        for batch in self.dispatcher.batches:
            for sink in batch.sinks:
                sink.wake_producer()


def violations(engine: Engine) -> list[str]:
    """The invariants of :class:`Engine` (and of its queue, room and deadlines) that do not hold now, described (for
    the tests)."""
    found = queue_violations(engine.queue) + deadline_violations(engine.deadlines) + room_violations(engine.room)
    dispatcher = engine.dispatcher
    if dispatcher.in_flight != len(dispatcher.batches):
        batches = plural(len(dispatcher.batches), "batch", "batches")
        found.append(f"in_flight {dispatcher.in_flight}, but {batches} in flight")
    return found
