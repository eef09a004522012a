"""Random schedules with ``max_queue_weight``, ``refuse_late`` and ``dedup_key`` all on (issue 46).

Each example draws the limits (weight, batch size, whether callers wait for room) and a schedule of calls, on the
virtual clock, against a model whose batch of ``n`` rows takes ``per_batch + per_item·n`` seconds: items of random
weights (some heavier than the limit), with and without a deadline (``timeout=``), duplicates of one another
(``dedup_key``), cancellations at random moments, and stops (drained or forced) with restarts. It checks:

- after every step, the internal invariants (``violations``), and that the weight admitted and not yet resolved
  never exceeds ``max_queue_weight`` (checked each time weight is taken);
- every call resolves exactly once, with its own result or an outcome it may have: an item heavier than the limit
  is refused as oversized (and only such an item), a refusal for room only when the queue's weight is full, no
  duplicate key twice in one batch, a cancellation only for a call that was cancelled;
- every refusal as late was justified: the batch the item would have joined (as it ran without it) ended no sooner
  than the earliest deadline it would have been held to (its own, or its batch's), less the prediction's margin;
  (skipped when a caller left, or a stop came, while that batch waited: the prediction cannot know the future);
- the counters add up, and the batcher ends idle.
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher import (
    AsyncBatcher,
    BatcherStoppedError,
    LateRefusalError,
    OversizedItemError,
    QueueFullException,
)
from async_batcher._core.room import Room
from async_batcher.testing import violations
from tests.batchers import idle_and_clean
from tests.loops import VirtualClockLoop

EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "300")) // 3 or 1
PER_BATCH, PER_ITEM = 0.005, 0.001


@dataclass(frozen=True)
class Item:
    n: int  # unique
    key: int | None  # duplicates share one
    weight: float

    @property
    def value(self) -> int:
        return self.n if self.key is None else 1000 + self.key


@dataclass
class Run:
    """What the model and the callers saw."""

    batches: list[tuple[float, float, list[Item]]] = field(default_factory=list)  # (start, end, items)
    problems: list[str] = field(default_factory=list)
    left_at: list[float] = field(default_factory=list)  # when a caller left early, or a stop came
    sent: dict[int, float] = field(default_factory=dict)  # each item's arrival


class Model(AsyncBatcher[Item, int]):
    def __init__(self, run: Run, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run = run

    def item_weight(self, item: Item) -> float:
        return item.weight

    def dedup_key(self, item: Item) -> int | None:
        return item.key

    async def process_batch(self, batch: list[Item]) -> list[int]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        keys = [x.key for x in batch if x.key is not None]
        if len(keys) != len(set(keys)):
            self.run.problems.append(f"a duplicate key took two rows of one batch: {batch}")
        await asyncio.sleep(PER_BATCH + PER_ITEM * len(batch))
        self.run.batches.append((start, loop.time(), list(batch)))
        return [x.value for x in batch]


calls = st.tuples(
    st.sampled_from([0.0, 0.0, 0.0, 0.0005, 0.002, 0.01, 0.03]),  # delay before it: bursts, and pauses
    st.sampled_from(["submit"] * 8 + ["cancel", "stop", "force"]),
    st.floats(0.1, 14),  # weight (the limit is 5 to 10)
    st.one_of(st.none(), st.integers(0, 5)),  # dedup key
    st.one_of(st.none(), st.floats(0.005, 0.08)),  # timeout
    st.integers(0, 10_000),  # which earlier call a cancellation picks
)


@given(
    schedule=st.lists(calls, min_size=30, max_size=150),
    limit=st.floats(5, 10),
    max_batch_size=st.sampled_from([2, 4, 16]),
    wait_when_full=st.booleans(),
    warm=st.sampled_from([0, 8, 8, 12]),
)
@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
def test_every_call_resolves_once_within_the_weight_and_every_late_refusal_is_justified(
    schedule: list[tuple[float, str, float, int | None, float | None, int]],
    limit: float,
    max_batch_size: int,
    wait_when_full: bool,
    warm: int,
) -> None:
    run = Run()
    taken = Room.take

    def take(room: Room, weight: float) -> None:
        taken(room, weight)
        if room.held > room.weight_limit + 1e-9:
            run.problems.append(f"held {room.held} over max_queue_weight={room.weight_limit}")

    Room.take = take  # type: ignore[method-assign]
    loop = VirtualClockLoop()
    try:
        loop.run_until_complete(
            asyncio.wait_for(scenario(run, schedule, limit, max_batch_size, wait_when_full, warm), 600)
        )
    finally:
        Room.take = taken  # type: ignore[method-assign]
        loop.close()
    assert not run.problems, run.problems


async def scenario(
    run: Run,
    schedule: list[tuple[float, str, float, int | None, float | None, int]],
    limit: float,
    max_batch_size: int,
    wait_when_full: bool,
    warm: int,
) -> None:
    loop = asyncio.get_running_loop()
    b = Model(
        run,
        refuse_late=True,
        default_timeout=60.0,  # (refuse_late needs a deadline for every call: a far one for those without timeout=)
        max_queue_weight=limit,
        max_batch_size=max_batch_size,
        wait_when_full=wait_when_full,
        max_queue_time=0.002,
    )
    for i in range(warm):  # batches of several sizes measured: past the warm-up, refusals can happen
        await asyncio.gather(*(b.process(Item(-100 * i - j, None, 0.1)) for j in range(1, 2 + i % 4)))
    tasks: list[tuple[Item, float | None, asyncio.Task[Any], list[bool]]] = []
    refusals: list[tuple[int, LateRefusalError]] = []
    n = 0

    async def call(item: Item, timeout: float | None) -> Any:
        run.sent[item.n] = loop.time()
        try:
            return await b.process(item, timeout=timeout)
        except LateRefusalError as exc:
            refusals.append((item.n, exc))
            raise
        except (asyncio.CancelledError, TimeoutError):
            run.left_at.append(loop.time())
            raise

    for delay, kind, weight, key, timeout, pick in schedule:
        await asyncio.sleep(delay)
        if kind == "submit":
            item = Item(n, key, weight)
            n += 1
            tasks.append((item, timeout, asyncio.ensure_future(call(item, timeout)), [False]))
        elif kind == "cancel" and tasks:
            _, _, task, cancelled = tasks[pick % len(tasks)]
            cancelled[0] = cancelled[0] or not task.done()
            task.cancel()
        elif kind in ("stop", "force"):
            run.left_at.append(loop.time())
            await b.stop(force=kind == "force")
            run.left_at.append(loop.time())
            b.start()
        await asyncio.sleep(0)
        assert violations(b) == []
    if tasks:
        await asyncio.wait([task for *_, task, _ in tasks], timeout=60)
    await b.stop()
    idle_and_clean(b)
    for item, _, task, cancelled in tasks:
        if not task.done():
            run.problems.append(f"{item} never resolved")
            continue
        if task.cancelled():
            if not cancelled[0]:
                run.problems.append(f"{item} cancelled, but not by its caller")
            continue
        error = task.exception()
        if error is None:
            if task.result() != item.value:
                run.problems.append(f"{item} got {task.result()}")
        elif isinstance(error, OversizedItemError) != (item.weight > limit):
            run.problems.append(f"{item} (limit {limit}) got {error!r}")
        elif not isinstance(error, QueueFullException | TimeoutError | BatcherStoppedError | OversizedItemError):
            run.problems.append(f"{item} got {error!r}")
        elif type(error) is QueueFullException and wait_when_full and "weight" in str(error):
            run.problems.append(f"{item} refused for room though callers wait for it: {error!r}")
    for n, refusal in refusals:
        justified(run, n, refusal, max_batch_size)


def justified(run: Run, n: int, refusal: LateRefusalError, max_batch_size: int) -> None:
    """A refusal of item ``n`` as late: the batch it would have joined, as it ran, ended by the deadline it was held
    to less the margin? Then it would have been in time: a problem. Its batch: the one that took the last item queued
    when it came, if that one had room for it, else the one after; or, nothing queued, the next to start; one row
    longer with it. Queued before it: sent earlier, or at the same instant earlier in the schedule (the virtual clock
    gives a burst one time)."""
    sent = run.sent[n]
    due = sent + refusal.budget
    later = sorted((batch for batch in run.batches if batch[0] > sent), key=lambda batch: batch[0])  # (one that starts
    # as it comes may have formed before it came: not counted)
    queued = [((run.sent.get(x.n, -math.inf), x.n), i) for i, batch in enumerate(later) for x in batch[2]]
    queued = [(t, i) for t, i in queued if t[0] < sent or (t[0] == sent and 0 <= t[1] < n)]
    if queued:
        index = max(queued)[1]
        if len(later[index][2]) >= max_batch_size:
            index += 1
    else:
        index = 0
    if index >= len(later):
        return  # nothing ran after it: its batch would have been the next, at least a batch's time away
    _, end, _ = later[index]
    if any(sent <= t <= end for t in run.left_at):
        return  # a caller left, or a stop came, meanwhile: the prediction could not know
    end += PER_ITEM  # with it, its batch would have been one row longer
    if end < due - refusal.margin - 1e-6:
        run.problems.append(
            f"refused at {sent:.4f} (predicted {refusal.predicted:.4f} s, margin {refusal.margin:.4f} s, budget "
            f"{refusal.budget:.4f} s), but the batch it would have joined ended at {end:.4f}, "
            f"{due - end:.4f} s before its deadline {due:.4f}"
        )


def test_the_justification_check_can_fail() -> None:
    sent = {0: 0.0, 1: 0.01, 2: 0.015}  # item 2 refused
    run = Run(batches=[(0.0, 0.01, [Item(0, None, 1.0)]), (0.02, 0.03, [Item(1, None, 1.0)])], sent=sent)
    refusal = LateRefusalError("x", predicted=0.1, margin=0.0, budget=0.05, retry_after=0.0)
    justified(run, 2, refusal, 4)  # its batch (the second) ended at 0.031 with it, 0.034 s before its deadline
    assert run.problems and "before its deadline" in run.problems[0]
    fair = Run(batches=run.batches, sent=run.sent)
    justified(fair, 2, LateRefusalError("x", predicted=0.1, budget=0.01, retry_after=0.0), 4)
    assert fair.problems == [] and not math.isnan(refusal.margin)


@pytest.mark.virtual_time
async def test_the_weight_bound_is_checked_where_weight_is_taken() -> None:
    run = Run()
    b = Model(run, max_queue_weight=5)
    assert await b.process(Item(1, None, 5)) == 1
    with pytest.raises(OversizedItemError):
        await b.process(Item(2, None, 5.5))
    await b.stop()
