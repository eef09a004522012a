"""The engine of one run: it owns what waits (the queue, the room, the timeouts), the slots and the batches in flight,
the one timer, and the policy's decisions as they are applied; only its methods change them (private).

Items come in through :meth:`Engine.put` (the common case: the default lane, priority 0) and
:meth:`Engine.put_entry`; an arrival wakes the dispatcher (:meth:`Engine.pump`, scheduled on the loop) only when a
batch may have become due. The pump asks the :class:`~async_batcher._core.policy.DispatchPolicy` which lane is due,
while slots are free, forms its batch (:mod:`~async_batcher._core.forming`) and hands it to the run's
:class:`~async_batcher._core.execution.Runner`; else it arms a single timer for the earliest deadline. A batch's end
comes back through :meth:`Engine.batch_ended` (the runner's ``on_end``), which lets the loop turn the policy's
``turns`` before the next batch forms while items wait. Nothing runs while nothing waits: an idle engine schedules
no wake-up.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Sequence
from contextvars import copy_context
from functools import partial
from typing import TYPE_CHECKING, Any

from async_batcher._checks import plural
from async_batcher._core.batch import Batch, Watcher, current_batch
from async_batcher._core.deadlines import Deadlines
from async_batcher._core.deadlines import violations as deadline_violations
from async_batcher._core.dispatch import Dispatch
from async_batcher._core.execution import Runner
from async_batcher._core.feedback import RunFeedback
from async_batcher._core.lane import Entry, Lane, WeightedEntry
from async_batcher._core.layers import keeps
from async_batcher._core.policy import UNLIMITED, DispatchPolicy
from async_batcher._core.queue import Queue
from async_batcher._core.queue import violations as queue_violations
from async_batcher._core.retrying import sink_of
from async_batcher._core.room import Room
from async_batcher._core.room import violations as room_violations
from async_batcher._core.sinks import Bulk, fail_sinks
from async_batcher._core.state import DISPATCHING, State
from async_batcher.exceptions import AsyncBatchException, BatcherStoppedError, ReentrantCallError

if TYPE_CHECKING:
    from async_batcher._core.recovery import Recovery
    from async_batcher.stats import _Recorder

__all__: list[str] = []


_new_entry = object.__new__


def _ignore() -> None:
    pass


class Engine(Dispatch):
    """One run's queue, slots, timer and batches in flight (see the module's docstring).

    Invariants (checked by the property test through :func:`violations`): ``in_flight == len(batches)`` (the slots
    taken; at most ``slot_limit`` unless it was lowered under them); the queue's, the room's and the deadlines'.
    """

    __slots__ = (
        "batch_limit",
        "batches",
        "clock",
        "deadlines",
        "feedback",
        "flushing",
        "in_flight",
        "joiners",
        "keyed",
        "loop",
        "name",
        "new_future",
        "on_drained",
        "policy",
        "priority_wait",
        "pump_handle",
        "queue",
        "recorder",
        "room",
        "runner",
        "slot_limit",
        "state",
        "timer",
        "timer_at",
        "timer_when",
        "watchers",
        "weight_limit",
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
        self.state = State.RUNNING
        self.keyed = keyed  # batch_key is overridden: each item is asked its key
        self.queue = Queue(recorder, weighted=weighted)
        self.queue.expire = self.expire_late
        self.room = Room(self.queue, name)
        self.deadlines = Deadlines(loop)  # the callers' timeouts: one timer for all of them
        # How this run's batches run: made here, told of their end, of how items join a streaming batch, and of what
        # a failed call leads to (the run's feedback: retries, backoffs, ceilings).
        self.feedback = RunFeedback(loop, self.queue, self.requeue, self.part_sent)
        self.runner = runner(on_end=self.batch_ended, join=self.join, feedback=self.feedback)
        self.policy = policy
        self.batches: dict[Batch, None] = {}
        self.in_flight = 0
        self.pump_handle: asyncio.Handle | None = None  # the pump to come (one at a time), or the turns before it
        # The timer's deadline is kept here: for a time already past, uvloop's call_at gives a plain Handle.
        self.timer: asyncio.Handle | None = None
        self.timer_at = 0.0
        self.timer_when = 0.0  # the deadline of the last timer that fired
        self.flushing: dict[Lane, int] = {}  # a flush: so many items of these lanes go whatever the policy says
        # Told of every batch as it goes and as it ends (async_batcher.testing): the batcher's, over its runs.
        self.watchers: list[Watcher] = [] if watchers is None else watchers
        # Told of the callers' contexts of the items that join a running batch: a streaming one's new items
        # (continuous batching), or a caller joining a row in flight (dedup_key).
        self.joiners: list[Callable[[list[Any]], None]] = []
        self.on_drained: Callable[[], None] = _ignore  # the stop's: called once, as the drain ends
        self.batch_limit = self.slot_limit = UNLIMITED
        self.weight_limit = math.inf
        self.priority_wait = 1.0
        policy.bind(self)

    # ------------------------------------------------------------------ what the policy may read (Signals)

    @property
    def concurrency(self) -> int:
        return self.slot_limit

    @property
    def room_wanted(self) -> bool:
        return bool(self.room.putters)

    @property
    def arrivals(self) -> int:
        return self.recorder.exited + self.queue.waiting

    def count(self, name: str, n: int = 1) -> None:
        self.recorder.count(name, n)

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
        weighted: bool,
        stall_limit: float,
        recovery: Recovery | None = None,
    ) -> None:
        """The settings as they are now: they apply from the next batch (:meth:`repump` to look again now)."""
        self.runner.stall_limit = stall_limit
        runner = self.runner
        runner.recovery = None if runner.is_stream else recovery
        self.feedback.configure(
            None if recovery is None else recovery.retry, None if recovery is None else recovery.split
        )
        self.batch_limit, self.slot_limit, self.weight_limit = batch_limit, slot_limit, weight_limit
        self.room.set_limit(room_limit, queue_size, queue_weight_limit)
        self.priority_wait = priority_wait
        if policy is not self.policy:
            policy.bind(self)  # (before it is switched in: one whose bind() raises is not)
            old, self.policy = self.policy, policy
            try:
                if not keeps(policy, old):  # (one the new policy wraps goes on)
                    old.replaced(policy, self.queue.lanes.values(), self.loop.time())
            except Exception as exc:  # (the new policy is in place: the batcher serves on)
                message = f"{self.name}: {type(old).__name__}.replaced() raised"
                self.loop.call_exception_handler({"message": message, "exception": exc})
        if weighted and not self.queue.weighted:
            self.queue.keep_weights()
        if self.room.putters:
            self.room.wake()

    # ------------------------------------------------------------------ coming in

    def put(self, item: Any) -> Entry | None:
        """Queue ``item`` in the default lane at priority 0 and return its entry, whose ``sink`` its caller awaits;
        ``None`` if it must wait for room (or be refused). The common case, kept short: the queue's own steps
        (:meth:`Queue.push`, :meth:`arrived`) written out for the one lane and level it touches."""
        queue = self.queue
        room = self.room
        if queue.waiting + room.reserved >= room.limit or room.putters:
            return None
        lane = queue.lane0
        entry = _new_entry(Entry)  # (Entry's fields set here, without a call of its __init__: the one hot path)
        entry.item = item
        entry.sink = self.new_future()
        entry.arrival = self.clock()
        entry.lane = lane
        entry.context = copy_context()
        queue.fifo0.append(entry)
        lane.count += 1
        queue.waiting += 1
        if self.in_flight < self.slot_limit:
            if self.pump_handle is None and (self.timer is None or lane.count >= lane.trigger):
                try:
                    self._wake(lane)
                except RuntimeError:  # its loop is closed: as if the item had never come (the long path starts anew)
                    self.unsubmit(entry)
                    return None
        elif current_batch.get() is not None:  # (even with a pump to come: it finds no free slot either)
            self.refuse_queued_if_reentrant(entry)
        return entry

    def put_entry(self, entry: Entry, priority: float) -> None:
        """Queue a single item's entry (any lane, weight, priority) and wake the dispatcher if it may be due."""
        self.queue.push(entry, priority)
        self.arrived(entry.lane)  # type: ignore[arg-type]

    def put_bulk(self, bulk: Bulk, priority: float) -> None:
        """Queue a ``process_many`` call: one entry of the default lane, or an entry per item in its lane."""
        if bulk.entries is None:
            self.queue.push_bulk(bulk, priority)
            self.arrived(self.queue.lane0)
            return
        for entry in bulk.entries:
            self.queue.push(entry, priority)
        for lane in dict.fromkeys(entry.lane for entry in bulk.entries):
            self.arrived(lane)  # type: ignore[arg-type]

    def lane(self, key: Hashable) -> Lane:
        return self.queue.lane(key)

    def arrived(self, lane: Lane) -> None:
        """Items joined ``lane``: wake the dispatcher if a batch may now be due: nothing else would (no timer), the
        policy's size is reached, or the lane's weight is full; a lane that was empty is looked at (its deadline may
        come before the timer's)."""
        if self.pump_handle is not None or self.in_flight >= self.slot_limit:
            return  # the dispatcher is coming already, or no batch can go before one ends (which pumps)
        if self.timer is None or lane.count >= lane.trigger or lane.weight >= self.weight_limit:
            self._wake(lane)

    def _wake(self, lane: Lane) -> None:
        """Schedule the pump for an arrival into a free slot: at once, unless the policy asked to see this lane's
        next arrival and lets the loop turn first (:meth:`DispatchPolicy.arrival`)."""
        turns = 0
        if lane.watch:
            lane.watch = False
            try:
                turns = self.policy.arrival(lane, self.clock())
            except Exception as exc:  # (raised to the caller, it would leave its item queued, sent to no one)
                self.internal_error(exc)
                return
        if turns:
            self._turn(turns)
        else:
            self.pump_handle = self.loop.call_soon(self._scheduled_pump)

    # ------------------------------------------------------------------ leaving without a batch

    def left(self, entry: Entry) -> None:
        """The caller of ``entry`` was cancelled: if its future was (its own cancellation, not an error of
        ``process_batch``), it counts as cancelled, and its item is withdrawn if it has not been sent."""
        if entry.sink.cancelled():
            self.recorder.cancelled += 1
            self.withdraw(entry)

    def withdraw(self, entry: Entry) -> None:
        """Take an item out of the queue if it is still there: it will never be sent."""
        if self.queue.withdraw(entry):
            self._withdrawn()

    def withdraw_bulk(self, bulk: Bulk) -> None:
        """Take what is still queued of a ``process_many`` call out of the queue."""
        if self.queue.withdraw_bulk(bulk):
            self._withdrawn()

    def unsubmit(self, entry: Entry) -> None:
        """Take back an item :meth:`put` queued on a loop that turned out not to be the running one: as if it had
        never been submitted (it is submitted again, on the long path)."""
        if self.queue.withdraw(entry):
            self.recorder.exited -= 1

    def _withdrawn(self) -> None:
        # Items left without a batch: room for those in line, and perhaps the end of a drain.
        if self.room.putters:
            self.room.wake()
        if not self.queue.waiting:
            self._cancel_timer()  # nothing waits: an idle engine keeps no wake-up
        elif self.timer is not None:
            self.repump()  # a hold's wake-up count (Lane.trigger) counts the items left: look again
        self.check_drained()

    def expire_late(self, entry: Any) -> None:
        """An item whose caller's deadline has passed left the queue as its batch formed: it is never sent; its
        caller gets ``TimeoutError`` (a ``process_many`` call's: the whole call, as its own timeout does)."""
        bulk = entry if entry.__class__ is Bulk else entry.sink if entry.sink.__class__ is Bulk else None
        if bulk is None:
            sink = entry.sink
            if not sink.done():
                self.recorder.timed_out += 1
                sink.set_exception(TimeoutError(f"{self.name}: no result within the timeout"))
            return
        if not bulk.future.done():
            self.recorder.timed_out += len(bulk.items)
            bulk.future.set_exception(TimeoutError(f"{self.name}: no results within the timeout"))
        self.queue.withdraw_bulk(bulk)

    def refuse_queued_if_reentrant(self, entry: Entry) -> None:
        """:meth:`put` found every slot taken: an item queued from inside one of this engine's batches would wait for
        its own batch forever. Take it back and fail it, its one outcome."""
        if not self.inside_own_batch():
            return
        self.queue.withdraw(entry)
        self.recorder.failed += 1
        entry.sink.set_exception(self.reentrant_error())

    def inside_own_batch(self) -> bool:
        inside = current_batch.get()
        return inside is not None and inside.owner is self and inside.is_live()

    def reentrant_error(self) -> ReentrantCallError:
        slots = "None" if self.slot_limit == UNLIMITED else self.slot_limit
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
            self.repump()
        elif not self.queue.waiting:
            self.check_drained()

    # ------------------------------------------------------------------ stopping, failing everything

    def begin_stop(self, exc: BaseException, on_drained: Callable[[], None]) -> None:
        """Refuse new items and the callers in line for room (with ``exc``); send what waits without waiting for
        deadlines; call ``on_drained`` once nothing is queued or in flight."""
        self.on_drained = on_drained
        self.state = State.STOPPING
        self.room.fail(exc)
        self.repump()
        self.check_drained()

    def abort(self, exc: AsyncBatchException) -> None:
        """Fail every queued, waiting and in-flight caller with ``exc``; cancel the batches in flight and free their
        slots. A batch running in a thread runs on to its end unheard; one still waiting for a thread never starts.
        The callers of a batch cut off inside ``process_batch`` get what ``abandoned_error()`` says."""
        rec = self.recorder
        fail_sinks(self.queue.clear(), exc, rec)
        fail_sinks([sink_of(entry) for entry in self.feedback.backoffs.clear()], exc, rec)
        self.room.fail(exc)
        for batch in self.batches:
            batch.abandoned = True
            batch.lane.in_flight -= 1
            fail_sinks(batch.sinks, self.runner.stopped_error(batch, exc), rec)
            if batch.tree is not None:  # the parts of it not called yet
                fail_sinks(batch.tree.pending_sinks(), exc, rec)
            if isinstance(batch.handle, asyncio.Task):
                batch.handle.cancel()
            for _, ended in self.watchers:
                ended(batch)
        self.batches.clear()
        self.in_flight = 0
        self._cancel_timer()
        self.check_drained()

    def check_drained(self) -> None:
        """During a stop: once nothing is queued or in flight, the drain is over (the stop's ``on_drained``, once)."""
        if (
            self.state is State.STOPPING
            and not self.queue.waiting
            and not self.in_flight
            and not self.feedback.backoffs.waiting
        ):
            on_drained, self.on_drained = self.on_drained, _ignore
            on_drained()

    def finish(self) -> None:
        """The end of the run: no wake-up left, and the state says so."""
        self._cancel_timer()
        self.feedback.backoffs.clear()
        if self.pump_handle is not None:
            self.pump_handle.cancel()  # (a stopped run is never dispatched again: a new run starts afresh)
        self.state = State.STOPPED

    def stall_changed(self) -> None:
        """The stall timeout changed: the streaming batches waiting for a consumer look at their deadline again."""
        for batch in self.batches:
            for sink in batch.sinks:
                sink.wake_producer()


def violations(engine: Engine) -> list[str]:
    """The invariants of :class:`Engine` (and of its queue, room and deadlines) that do not hold now, described (for
    the tests)."""
    found = queue_violations(engine.queue) + deadline_violations(engine.deadlines) + room_violations(engine.room)
    if engine.in_flight != len(engine.batches):
        found.append(f"in_flight {engine.in_flight}, but {plural(len(engine.batches), 'batch', 'batches')} in flight")
    return found
