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
import numbers
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from async_batcher._checks import is_real
from async_batcher._core import forming
from async_batcher._core.batch import Batch, Watcher
from async_batcher._core.policy import DispatchPolicy, Reason
from async_batcher._core.state import DISPATCHING, State
from async_batcher.exceptions import AsyncBatchException

if TYPE_CHECKING:
    from collections.abc import Callable

    from async_batcher._core.execution import Runner
    from async_batcher._core.lane import Lane
    from async_batcher._core.queue import Queue
    from async_batcher._core.room import Room

__all__: list[str] = []

_served = attrgetter("served")


class Dispatch:
    """The pump, the policy's decisions applied, the turns and the one timer (see the module's docstring)."""

    # No __dict__ for the Engine, whose slots hold it all (the type checker sees the annotations).
    if not TYPE_CHECKING:
        __slots__ = ()

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
    flushing: dict[Lane, int]
    watchers: list[Watcher]
    joiners: list[Callable[[list[Any]], None]]

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
            due, next_at = self._due_lanes(now)
            if not due:
                break
            for lane in due:  # (each as if chosen again: one sent has the highest served count)
                if self.in_flight >= self.slot_limit:
                    break
                self._dispatch(lane, now)
        if self.flushing:
            self.flushing = {}
        queue.drop_empty_lanes()
        if self.room.putters:
            self.room.wake()  # the batches just taken made room
        if not queue.waiting:
            self._cancel_timer()  # nothing waits: an idle engine has no wake-ups
            self.check_drained()
        elif self.in_flight < self.slot_limit and next_at < math.inf:
            self._arm_timer(next_at)

    def _due_lanes(self, now: float) -> tuple[list[Lane], float]:
        """The lanes due now, the one served longest ago first (a lane never served, or back after an idle spell,
        counts from when it came), so that keys take turns when slots are scarce; and, of the others, the earliest
        time one will be. One look at each lane, however many are due."""
        due: list[Lane] = []
        next_at = math.inf
        for lane in self.queue.lanes.values():
            at = self._due(lane, now)
            if at <= now:
                due.append(lane)
            elif at < next_at:
                next_at = at
        if len(due) > 1:
            due.sort(key=_served)
        return due, next_at

    def _due(self, lane: Lane, now: float) -> float:
        """When the lane's next batch goes: at once when full, stopping or flushing; at once when the policy's size
        is reached; else when the policy says. ``inf`` if nothing of it waits."""
        if not lane.count:
            lane.trigger = 1  # an arrival into an empty lane is looked at
            return math.inf
        if (
            self.state is State.STOPPING
            or (self.flushing and lane in self.flushing)
            or lane.weight >= min(self.weight_limit, lane.weight_ceiling)
        ):
            return now
        full = self.policy.full_at(lane, now)
        try:
            trigger = lane.trigger = min(full, self.batch_limit, lane.ceiling)
        except TypeError:  # (None, a string: compared with a count, or left to fail further on)
            raise _wrong_answer(self.policy, "full_at", full, "a number of items") from None
        if lane.count >= trigger:
            return now
        at = self.policy.due(lane, now)
        if at.__class__ is not float and not is_real(at):
            raise _wrong_answer(self.policy, "due", at, "a time on the loop's clock, or inf")
        if at != at:  # NaN: neither due nor not, it would leave the lane waiting, silently
            raise _wrong_answer(self.policy, "due", at, "a time, or inf", ValueError)
        return at

    def _reason(self, lane: Lane, now: float) -> Reason:
        if lane.count >= min(self.batch_limit, lane.ceiling) or lane.weight >= min(
            self.weight_limit, lane.weight_ceiling
        ):
            return Reason.FULL
        if self.state is State.STOPPING:
            return Reason.STOP
        if self.flushing and lane in self.flushing:
            return Reason.FLUSH
        if lane.count >= lane.trigger:
            return Reason.SIZE
        reason = self.policy.reason(lane, now)
        if reason.__class__ is not Reason:  # (its value is taken: "deadline" is Reason.DEADLINE)
            try:
                reason = Reason(reason)
            except (TypeError, ValueError):
                # Taken as it is, it would reach the statistics as the batch ends, and fail there.
                message = f"{type(self.policy).__name__}.reason() returned {reason!r}: it must be a Reason"
                raise TypeError(message) from None
        return reason

    def _dispatch(self, lane: Lane, now: float) -> None:
        """Form the lane's batch and send it on its way; it takes a slot until it ends (:meth:`batch_ended`)."""
        queue = self.queue
        queue.dispatches += 1
        lane.served = queue.dispatches
        reason = self._reason(lane, now)
        size = self.policy.size(lane)
        if size.__class__ is not int and (isinstance(size, bool) or not isinstance(size, numbers.Integral)):
            raise _wrong_answer(self.policy, "size", size, "a whole number of items, one or more")
        if not size >= 1:  # a batch that takes nothing would be formed again and again, forever
            raise _wrong_answer(self.policy, "size", size, "a batch takes one item or more", ValueError)
        # (A lane's ceiling: the size an out-of-memory split found fits; none, but with split_on.)
        limit = min(size, self.batch_limit, lane.ceiling)
        flushing = self.flushing
        quota = flushing.get(lane, 0) if flushing else 0  # (a flush's: what waited when it began, not what came since)
        if quota and reason is Reason.FLUSH:
            limit = min(limit, quota)
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
        self.policy.dispatched(lane, batch, now)
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
        now = self.loop.time()
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
        if turns and self.state is State.RUNNING and not self.room.putters:
            if self.pump_handle is not None:  # a pump to come (an arrival's, another end's turns) comes after these
                self.pump_handle.cancel()
            self._turn(turns)
        else:
            self.pump_safely()

    def _turn(self, left: int) -> None:
        """Pump after ``left`` more turns of the loop: each a zero-delay timer, which the loop runs once it has polled
        its sockets and run what was ready. The pending turn is ``pump_handle``: arrivals do not pump early, and a
        batch that ends meanwhile starts the count again; a flush ends them."""
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
        for joined in self.joiners:
            joined(taken.contexts)
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

    def flush(self, quota: dict[Lane, int]) -> None:
        """Send the next pass ``quota[lane]`` items of each lane of ``quota`` (the first in line), whatever the policy
        says (slots permitting)."""
        flushing = self.flushing
        for lane, n in quota.items():
            if n > flushing.get(lane, 0):
                flushing[lane] = n
        # A pump already to come is left to come, and turns to come end at the next (:meth:`_turn`): cancelled and
        # asked for again, the pump went to the back of the loop's line, and two flushes doing so in turn kept it
        # from ever running.
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
        waiting; the run serves on. An exception raised in the policy names its method."""
        what = (
            getattr(exc, _POLICY_ANSWER, None) or _raised_in_policy(exc) or "internal error while dispatching batches"
        )
        self.loop.call_exception_handler({"message": f"{self.name}: {what}", "exception": exc})
        self.abort(AsyncBatchException(f"{self.name}: {what}: {exc!r}"))

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


# The attribute that marks an answer of a dispatch policy refused (:func:`_wrong_answer`): what its callers are told.
_POLICY_ANSWER = "_async_batcher_policy_answer"


def _wrong_answer(
    policy: DispatchPolicy, method: str, value: object, wanted: str, kind: type[Exception] = TypeError
) -> Exception:
    """The error of a dispatch policy's answer that is not what its method must return: it names the policy, the
    method and the value (not an internal error of the dispatcher)."""
    name = f"{type(policy).__name__}.{method}()"
    exc = kind(f"{name} returned {value!r}: {wanted}")
    setattr(exc, _POLICY_ANSWER, f"{name} gave a wrong answer")
    return exc


def _raised_in_policy(exc: BaseException) -> str | None:
    """``"<Policy>.<method>() raised"`` when ``exc`` was raised inside a method of a dispatch policy (the outermost:
    the one the engine called), else ``None``."""
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, DispatchPolicy):
            return f"{type(owner).__name__}.{tb.tb_frame.f_code.co_name}() raised"
        tb = tb.tb_next
    return None
