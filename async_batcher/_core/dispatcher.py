"""When batches go: the :class:`Dispatcher` of one run owns the slots, the pump, the one timer, the turns and the
flush, and applies the decision it is (:class:`~async_batcher._core.decision.Decision`: ``(when, reason)`` per lane,
asking the run's :class:`~async_batcher._core.policy.DispatchPolicy`) (private; the dispatch layer, above execution,
below the engine that composes it).

**Arrivals** (:meth:`Dispatcher.arrived`) wake the pump only when the lane reached what its last decision left on it
(``Lane.trigger``, ``Lane.trigger_weight``), or with no timer.

**The pump** (:meth:`Dispatcher.pump`) sends every due lane while slots are free, the one served longest ago first
(:mod:`~async_batcher._core.forming` forms the batch, the runner runs it); else it arms the one
:class:`~async_batcher._core.timer.Timer` for the earliest due time. A batch's end (:meth:`Dispatcher.batch_ended`,
the runner's ``on_end``) lets the loop turn the policy's ``turns`` before the next batch forms. An idle dispatcher
schedules no wake-up. It tells the engine above it through the callbacks it gave: ``on_idle`` (nothing waits as the
run stops: a drain may be over), ``on_fault`` (a bug).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from async_batcher._core import answers, forming
from async_batcher._core.batch import Batch, Watcher
from async_batcher._core.decision import Decision
from async_batcher._core.policy import DispatchPolicy, Reason
from async_batcher._core.state import DISPATCHING, UNLIMITED, State
from async_batcher._core.timer import Timer
from async_batcher.exceptions import AsyncBatchException

if TYPE_CHECKING:
    from collections.abc import Callable

    from async_batcher._core.execution import Runner
    from async_batcher._core.lane import Lane
    from async_batcher._core.queue import Queue
    from async_batcher._core.room import Room
    from async_batcher.stats import _Recorder

__all__: list[str] = []

# The enum members the passes compare with, read once (an enum class's attribute is a Python-level lookup).
_RUNNING, _STOPPING, _FLUSH = State.RUNNING, State.STOPPING, Reason.FLUSH
# A policy's pumping() that does nothing (DispatchPolicy's): a pass that finds nothing waiting may be left out.
_QUIET_PUMPING = DispatchPolicy.pumping


class Dispatcher(Decision):
    """The slots, the pump, the policy's decisions applied, the turns, the flush and the one timer of a run (see the
    module's docstring). It is the :class:`~async_batcher._core.policy.Signals` its policy reads.

    Invariant (:func:`~async_batcher._core.engine.violations`): ``in_flight == len(batches)``, the slots taken.
    """

    __slots__ = (
        "batches",
        "clock",
        "in_flight",
        "joiners",
        "loop",
        "name",
        "on_fault",
        "on_idle",
        "priority_wait",
        "pump_handle",
        "recorder",
        "room",
        "runner",
        "slot_limit",
        "wakeup",
        "watchers",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        queue: Queue,
        room: Room,
        recorder: _Recorder,
        policy: DispatchPolicy,
        *,
        name: str,
        watchers: list[Watcher],
        on_idle: Callable[[], None],
        on_fault: Callable[[AsyncBatchException], None],
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(queue, policy)
        self.loop = loop
        self.clock = loop.time if clock is None else clock  # the loop's clock (the engine's: in C where it can be)
        self.name = name
        self.room = room
        self.recorder = recorder
        self.runner: Runner  # (the engine's, given once made: it is told of each batch's end by this dispatcher)
        self.batches: dict[Batch, None] = {}
        self.in_flight = 0
        self.slot_limit = UNLIMITED
        self.priority_wait = 1.0
        self.pump_handle: asyncio.Handle | None = None  # the pump to come (one at a time), or the turns before it
        self.wakeup = Timer(loop, self.pump_safely)  # for the earliest due time, while a slot is free
        # Told of every batch as it goes and as it ends (async_batcher.testing): the batcher's, over its runs.
        self.watchers = watchers
        # Told of the callers' contexts of the items that join a running batch: a streaming one's new items
        # (continuous batching), or a caller joining a row in flight (dedup_key).
        self.joiners: list[Callable[[list[Any]], None]] = []
        self.on_idle = on_idle  # the engine's: nothing waits now, and the run stops (a drain may be over)
        self.on_fault = on_fault  # the engine's: fail every caller (a bug here or in the policy)
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

    def count(self, name: str, n: int = 1) -> None:  # (Signals.count)
        self.recorder.count(name, n)

    # ------------------------------------------------------------------ told of arrivals

    def arrived(self, lane: Lane) -> bool:
        """Items joined ``lane``: wake the pump if a batch may now be due (nothing else would: no timer; or the lane
        reached what the last decision said makes it go at once). False: every slot is taken (a batch's end pumps)."""
        if self.in_flight >= self.slot_limit:
            return False
        if self.pump_handle is None and (
            self.wakeup.handle is None or lane.count >= lane.trigger or lane.weight >= lane.trigger_weight
        ):
            self._wake(lane)
        return True

    def _wake(self, lane: Lane) -> None:
        """Schedule the pump for an arrival into a free slot: at once, unless the policy asked to see this lane's
        next arrival and lets the loop turn first (:meth:`DispatchPolicy.arrival`)."""
        turns = 0
        if lane.watch:
            lane.watch = False
            try:
                turns = self.policy.arrival(lane, self.loop.time())
            except Exception as exc:  # (raised to the caller, it would leave its item queued, sent to no one)
                self.internal_error(exc)
                return
        if turns:
            self._turn(turns)
        else:
            self.pump_handle = self.loop.call_soon(self._scheduled_pump)

    def withdrawn(self) -> None:
        """Items left the queue without a batch: with nothing left, no wake-up; else a hold's count
        (``Lane.trigger``) counts the items that left: look again if a timer waits."""
        if not self.queue.waiting:
            self.wakeup.cancel()
        elif self.wakeup.handle is not None:
            self.repump()

    # ------------------------------------------------------------------ sending batches out

    def pump(self) -> None:
        """Send every batch that is due while slots are free; else arm one timer for the next deadline."""
        if self.state not in DISPATCHING:
            return
        queue, wakeup = self.queue, self.wakeup
        # A timer may fire a hair before its time by the loop's clock resolution: when it fired for a deadline, that
        # deadline is due.
        now = self.clock()
        if now < wakeup.fired_for:
            now = wakeup.fired_for
        self.policy.pumping(now)
        next_at = math.inf
        while queue.waiting and self.in_flight < self.slot_limit:
            due, next_at = self.due_lanes(now)
            if not due:
                break
            for _, lane, reason in due:  # (each as if chosen again: one sent has the highest served count)
                if self.in_flight >= self.slot_limit:
                    break
                self._dispatch(lane, reason, now)
        if self.flushing:
            self.flushing = {}
        if len(queue.lanes) > 1:
            queue.drop_empty_lanes(self.policy.keep_idle)
        if self.room.putters:
            self.room.wake()  # the batches just taken made room
        if not queue.waiting:
            if wakeup.handle is not None:
                wakeup.cancel()  # nothing waits: an idle dispatcher has no wake-ups
            if self.state is _STOPPING:
                self.on_idle()  # (a drain may be over)
        elif self.in_flight < self.slot_limit and next_at < math.inf:
            wakeup.arm(next_at)

    def _dispatch(self, lane: Lane, reason: Reason, now: float) -> None:
        """Form the lane's batch and send it on its way; it takes a slot until it ends (:meth:`batch_ended`)."""
        queue = self.queue
        queue.dispatches += 1
        lane.served = queue.dispatches
        policy = self.policy
        size = policy.size(lane)
        if size.__class__ is not int or size < 1:
            size = answers.size(policy, size)
        # The capacity the decision found for this lane in this pass (decide(): its weight is left on the lane).
        limit = size
        if self.batch_limit < limit:
            limit = self.batch_limit
        if lane.ceiling < limit:
            limit = lane.ceiling
        weight = lane.trigger_weight
        flushing = self.flushing
        quota = flushing.get(lane, 0) if flushing else 0  # (a flush's: what waited when it began, not what came since)
        if quota and reason is _FLUSH:
            limit = min(limit, quota)
        watchers = self.watchers
        taken = forming.take(
            queue, lane, limit, weight, now=now, max_priority_wait=self.priority_wait, arrivals=bool(watchers)
        )
        if taken is None:
            return
        if quota:
            if quota > len(taken.items):
                flushing[lane] = quota - len(taken.items)
            else:
                del flushing[lane]
        batch = Batch(self, taken, now, lane, reason)
        lane.watch = False  # (a batch that goes ends what the policy watched for)
        # In flight before the policy is told: if dispatched() raises, the abort that follows fails its callers too.
        self.batches[batch] = None
        self.in_flight += 1
        lane.in_flight += 1
        policy.dispatched(lane, batch, now)
        for sent, _ in watchers:
            sent(batch)
        self.runner.launch(batch)

    def part_sent(self, batch: Batch) -> None:
        """A part of a failed batch is called in its slot (the runner's feedback says so): the watchers see it go."""
        for sent, _ in self.watchers:
            sent(batch)

    def batch_ended(self, batch: Batch, callers: int) -> None:
        """A batch has freed its slot, having answered ``callers``: the policy learns from it, and a free slot never
        idles while a batch is due. While fewer items wait than the largest batch, the next batch forms the policy's
        ``turns`` turns of the loop later (not while stopping, or while callers wait for room)."""
        del self.batches[batch]
        self.in_flight -= 1
        lane = batch.lane
        lane.in_flight -= 1
        now = self.clock()
        policy = self.policy
        try:
            lane.watch = policy.ended(lane, batch, callers, now)
            turns = policy.turns
            turns = turns if turns and 0 < self.queue.waiting < policy.largest() else 0
        except Exception as exc:  # (raised here, it would leave the items queued behind the batch waiting)
            lane.watch, turns = False, 0
            self.internal_error(exc)
        lane.ended, lane.arrived_at_end = now, lane.arrived
        for _, ended in self.watchers:
            ended(batch)
        if turns and self.state is _RUNNING and not self.room.putters:
            if self.pump_handle is not None:  # a pump to come (an arrival's, another end's turns) comes after these
                self.pump_handle.cancel()
            self._turn(turns)
        elif (
            self.queue.waiting
            or self.state is not _RUNNING
            or self.flushing
            or self.room.putters
            or self.wakeup.handle is not None
            or len(self.queue.lanes) > 1
            or policy.__class__.pumping is not _QUIET_PUMPING
        ):
            self.pump_safely()
        # else nothing waits and a pass would do nothing (no lane to send or drop, no timer, no drain to end, a
        # policy that is not told of passes): none is made

    def _turn(self, left: int) -> None:
        """Pump after ``left`` more turns of the loop (zero-delay timers: the loop polls its sockets between them). The
        pending turn is ``pump_handle``: arrivals do not pump early; a batch's end restarts the count; a flush ends
        it."""
        if left > 0 and not self.flushing:
            self.pump_handle = self.loop.call_at(self.loop.time(), self._turn, left - 1)
        else:
            self._scheduled_pump()

    def join(self, batch: Batch) -> int:
        """Continuous batching: items waiting in a streaming batch's lane join it between its steps, up to
        ``max_batch_size`` and ``max_batch_weight``; return how many did."""
        room = self.batch_limit - len(batch.items)
        lane = batch.lane
        if room <= 0 or not lane.count:
            return 0
        budget = self.weight_limit
        if self.queue.weighted:
            budget -= sum(batch.weights) if batch.weights is not None else len(batch.items)
        now = self.loop.time()
        taken = forming.take(
            self.queue, lane, room, budget, now=now, max_priority_wait=self.priority_wait, overflow=False
        )
        if taken is None:
            return 0
        batch.take_in(taken)
        for joined in self.joiners:
            joined(taken.contexts)
        if self.room.putters:
            self.room.wake()
        return len(taken.items)

    # ------------------------------------------------------------------ the end of the run's batches

    def abandon(self, exc: AsyncBatchException) -> None:
        """A forced stop (or an internal error): fail the callers of every batch in flight with ``exc`` (or what
        ``abandoned_error()`` says, for a batch cut off inside ``process_batch``), cancel their tasks and free
        their slots; no wake-up is left. A batch running in a thread runs on to its end unheard."""
        for batch in self.batches:
            batch.lane.in_flight -= 1
            self.runner.abandon(batch, exc)
            for _, ended in self.watchers:
                ended(batch)
        self.batches.clear()
        self.in_flight = 0
        self.wakeup.cancel()

    def drain(self) -> None:
        """The run stops: what waits goes without waiting for deadlines."""
        self.state = State.STOPPING
        self.repump()

    def close(self) -> None:
        """The end of the run: no wake-up left, and no batch is dispatched again (a new run starts afresh)."""
        self.wakeup.cancel()
        if self.pump_handle is not None:
            self.pump_handle.cancel()
        self.state = State.STOPPED

    # ------------------------------------------------------------------ waking the pump

    def repump(self) -> None:
        """A setting or the state changed: let the dispatcher look again (a no-op when the run does not dispatch)."""
        if self.state in DISPATCHING and self.pump_handle is None and not self.loop.is_closed():
            self.pump_handle = self.loop.call_soon(self._scheduled_pump)

    def room_wanted_now(self) -> None:
        """A caller waits for room in the queue: a hold never keeps it waiting (the batch it keeps back makes room),
        so let the dispatcher look again if its timer may be a hold's."""
        if self.wakeup.handle is not None:
            self.repump()

    def flush(self, quota: dict[Lane, int]) -> None:
        """Send the next pass ``quota[lane]`` items of each lane of ``quota`` (the first in line), whatever the policy
        says (slots permitting)."""
        flushing = self.flushing
        for lane, n in quota.items():
            if n > flushing.get(lane, 0):
                flushing[lane] = n
        # A pump to come is left to come (turns end at the next: _turn): cancelled and asked for again, it went to the
        # back of the loop's line, and two flushes doing so in turn kept it from ever running.
        self.repump()

    def _scheduled_pump(self) -> None:
        self.pump_handle = None
        self.pump_safely()

    def pump_safely(self) -> None:
        """:meth:`pump`, such that even a bug in it cannot leave a caller waiting: it fails them, and serves on."""
        try:
            self.pump()
        except Exception as exc:
            self.internal_error(exc)

    def internal_error(self, exc: Exception) -> None:
        """A bug of the dispatcher or of its policy: report it, and fail every caller rather than leave one
        waiting (``on_fault``); the run serves on. An exception raised in the policy names its method."""
        what = answers.fault(exc)
        self.loop.call_exception_handler({"message": f"{self.name}: {what}", "exception": exc})
        self.on_fault(AsyncBatchException(f"{self.name}: {what}: {exc!r}"))
