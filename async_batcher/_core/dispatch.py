"""When batches go: the half of the :class:`~async_batcher._core.engine.Engine` that applies its dispatch policy
(private). :meth:`Dispatch.pump` asks the :class:`~async_batcher._core.policy.DispatchPolicy` which lane is due,
while slots are free, forms its batch (:mod:`~async_batcher._core.forming`) and hands it to the run's runner; else
it arms a single timer for the earliest deadline. A batch's end comes back through :meth:`Dispatch.batch_ended`,
which lets the loop turn the policy's ``turns`` before the next batch forms while items wait. The engine's other
half (what comes in, what leaves without a batch, the stop) is :mod:`~async_batcher._core.engine`'s.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from async_batcher._core import forming
from async_batcher._core.batch import Batch
from async_batcher._core.policy import Reason
from async_batcher._core.state import DISPATCHING, State
from async_batcher.exceptions import AsyncBatchException

if TYPE_CHECKING:
    from async_batcher._core.execution import Runner
    from async_batcher._core.lane import Lane
    from async_batcher._core.policy import DispatchPolicy
    from async_batcher._core.queue import Queue
    from async_batcher._core.room import Room

__all__: list[str] = []


class Dispatch:
    """The pump, the policy's decisions applied, the turns and the one timer (see the module's docstring)."""

    # The engine's state this half reads and changes (Engine's slots).
    loop: asyncio.AbstractEventLoop
    name: str
    state: State
    queue: Queue
    room: Room
    runner: Runner
    policy: DispatchPolicy
    batches: dict[Batch, None]
    in_flight: int
    batch_limit: int
    slot_limit: int
    weight_limit: float
    priority_wait: float
    pump_handle: asyncio.Handle | None
    timer: asyncio.Handle | None
    timer_at: float
    timer_when: float
    flushing: bool
    watchers: list[tuple[Callable[[Batch], None], Callable[[Batch], None]]]

    def check_drained(self) -> None: ...

    def abort(self, exc: AsyncBatchException) -> None: ...

    # ------------------------------------------------------------------ sending batches out

    def pump(self) -> None:
        """Send every batch that is due while slots are free; else arm one timer for the next deadline."""
        if self.state not in DISPATCHING:
            return
        queue = self.queue
        # A timer may fire a hair before its time by the loop's clock resolution: when it fired for a deadline, that
        # deadline is due.
        now = max(self.loop.time(), self.timer_when)
        self.policy.pumping(now)
        next_at = math.inf
        while queue.waiting and self.in_flight < self.slot_limit:
            lane, next_at = self._choose(now)
            if lane is None:
                break
            self._dispatch(lane, now)
        self.flushing = False
        queue.drop_empty_lanes()
        if self.room.putters:
            self.room.wake()  # the batches just taken made room
        if not queue.waiting:
            self._cancel_timer()  # nothing waits: an idle engine has no wake-ups
            self.check_drained()
        elif self.in_flight < self.slot_limit and next_at < math.inf:
            self._arm_timer(next_at)

    def _choose(self, now: float) -> tuple[Lane | None, float]:
        """The due lane served longest ago (a lane never served counts from when it came), so that keys take turns
        when slots are scarce; and, of the lanes looked at that are not due, the earliest time one will be."""
        chosen: Lane | None = None
        next_at = math.inf
        for lane in self.queue.lanes.values():
            if chosen is not None and lane.served >= chosen.served:
                continue  # it cannot go before the one chosen
            at = self._due(lane, now)
            if at <= now:
                chosen = lane
            elif at < next_at:
                next_at = at
        return chosen, next_at

    def _due(self, lane: Lane, now: float) -> float:
        """When the lane's next batch goes: at once when full, stopping or flushing; at once when the policy's size
        is reached; else when the policy says. ``inf`` if nothing of it waits."""
        if not lane.count:
            lane.trigger = 1  # an arrival into an empty lane is looked at
            return math.inf
        if self.state is State.STOPPING or self.flushing or lane.weight >= min(self.weight_limit, lane.weight_ceiling):
            return now
        trigger = lane.trigger = min(self.policy.full_at(lane, now), self.batch_limit, lane.ceiling)
        if lane.count >= trigger:
            return now
        return self.policy.due(lane, now)

    def _reason(self, lane: Lane, now: float) -> Reason:
        if lane.count >= min(self.batch_limit, lane.ceiling) or lane.weight >= min(
            self.weight_limit, lane.weight_ceiling
        ):
            return Reason.FULL
        if self.state is State.STOPPING:
            return Reason.STOP
        if self.flushing:
            return Reason.FLUSH
        if lane.count >= lane.trigger:
            return Reason.SIZE
        return self.policy.reason(lane, now)

    def _dispatch(self, lane: Lane, now: float) -> None:
        """Form the lane's batch and send it on its way; it takes a slot until it ends (:meth:`batch_ended`)."""
        queue = self.queue
        queue.dispatches += 1
        lane.served = queue.dispatches
        reason = self._reason(lane, now)
        # (A lane's ceiling: the size an out-of-memory split found fits; none, but with split_on.)
        limit = min(self.policy.size(lane), self.batch_limit, lane.ceiling)
        watchers = self.watchers
        taken = forming.take(
            queue,
            lane,
            limit,
            min(self.weight_limit, lane.weight_ceiling),
            now=now,
            max_priority_wait=self.priority_wait,
            arrivals=bool(watchers),
        )
        if taken is None:
            return
        batch = Batch(self, taken, now, lane, reason)
        lane.watch = False  # (a batch that goes ends what the policy watched for)
        self.policy.dispatched(lane, batch, now)
        self.batches[batch] = None
        self.in_flight += 1
        lane.in_flight += 1
        for sent, _ in watchers:
            sent(batch)
        self.runner.launch(batch)

    def batch_ended(self, batch: Batch, callers: int) -> None:
        """A batch has freed its slot, having answered ``callers``: the policy learns from it, and a free slot never
        idles while a batch is due. While fewer items wait than the largest batch, the next batch forms the policy's
        ``turns`` turns of the loop later (not while stopping, or while callers wait for room)."""
        del self.batches[batch]
        self.in_flight -= 1
        lane = batch.lane
        lane.in_flight -= 1
        now = self.loop.time()
        lane.watch = self.policy.ended(lane, batch, callers, now)
        lane.ended, lane.arrived_at_end = now, lane.arrived
        for _, ended in self.watchers:
            ended(batch)
        waiting = self.queue.waiting
        turns = self.policy.turns
        if turns and 0 < waiting < self.policy.largest() and self.state is State.RUNNING and not self.room.putters:
            if self.pump_handle is not None:  # a pump to come (an arrival's, another end's turns) comes after these
                self.pump_handle.cancel()
            self._turn(turns)
        else:
            self.pump_safely()

    def _turn(self, left: int) -> None:
        """Pump after ``left`` more turns of the loop: each a zero-delay timer, which the loop runs once it has polled
        its sockets and run what was ready. The pending turn is ``pump_handle``: arrivals do not pump early, and a
        batch that ends meanwhile starts the count again."""
        if left > 0:
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
        batch.items.extend(taken.items)
        batch.sinks.extend(taken.sinks)
        batch.contexts.extend(taken.contexts)
        if batch.weights is not None:
            batch.weights.extend(taken.weights or ())  # (a list: the queue was weighted when the batch formed)
        if taken.deadlines is not None:
            if batch.deadlines is None:  # (the first items with a deadline came as it ran)
                batch.deadlines = [math.inf] * (len(batch.items) - len(taken.items))
            batch.deadlines.extend(taken.deadlines)
        batch.size = max(batch.size, len(batch.items))
        if self.room.putters:
            self.room.wake()
        return len(taken.items)

    # ------------------------------------------------------------------ waking the pump

    def repump(self) -> None:
        """A setting or the state changed: let the dispatcher look again (a no-op when the run does not dispatch)."""
        if self.state in DISPATCHING and self.pump_handle is None and not self.loop.is_closed():
            self.pump_handle = self.loop.call_soon(self._scheduled_pump)

    def room_wanted_now(self) -> None:
        """A caller waits for room in the queue: a hold never keeps it waiting (the batch it keeps back makes room),
        so let the dispatcher look again if its timer may be a hold's."""
        if self.timer is not None:
            self.repump()

    def flush(self) -> None:
        """Send what waits now at the next pass, whatever the policy says (slots permitting)."""
        self.flushing = True
        if self.pump_handle is not None:
            self.pump_handle.cancel()
            self.pump_handle = None
        self.repump()

    def _scheduled_pump(self) -> None:
        self.pump_handle = None
        self.pump_safely()

    def pump_safely(self) -> None:
        """:meth:`pump`, such that even a bug in it cannot leave a caller waiting: it fails them, and serves on."""
        try:
            self.pump()
        except Exception as exc:
            self.loop.call_exception_handler(
                {"message": f"{self.name}: internal error while dispatching batches", "exception": exc}
            )
            self.abort(AsyncBatchException(f"{self.name}: internal error while dispatching batches: {exc!r}"))

    # ------------------------------------------------------------------ the timer

    def _arm_timer(self, deadline: float) -> None:
        """Make sure the pump runs at ``deadline``: one timer, for the earliest deadline."""
        if self.timer is not None:
            if self.timer_at <= deadline:
                return  # it fires first and will look again
            self.timer.cancel()
        self.timer = self.loop.call_at(deadline, self._on_timer, deadline)
        self.timer_at = deadline

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_timer(self, when: float) -> None:
        self.timer = None
        self.timer_when = when
        self.pump_safely()
