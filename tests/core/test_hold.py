"""The hold (``max_hold_time``: the :class:`~async_batcher.policies.ClosedLoopHold` layer of the policy), on the
loop's virtual clock: every rule it keeps, on every path.

The rules the hold keeps (contract point 1, docs/guides/subclassing.md "Holding a slot for returning callers"):

- it waits only for the callers the lane's last batch answered (a caller who had left is not one; a ``process_many``
  counts once, when its last item is answered), and never longer than ``max_hold_time`` (as set now) after that
  batch ended, nor once the lane has had no arrival for half the time that batch took (since it ended, or since
  the latest arrival); a batch of the lane that ends during a hold adds its callers without moving its end;
  during a hold only the largest batch (``max_batch_size``, or the largest preferred size) goes early; with
  ``max_latency`` the adaptive deadline bounds it;
- a lone caller never waits (after an idle period too); a bulk call never waits for itself; a lane never waits for
  another lane's callers;
- an idle batcher keeps no timer; a stop never holds; a caller waiting for room ends a hold;
- the gate: it applies only while the lane's last batch held all its callers (the hold's record of the lane,
  ``alone``: few items arrived in the lane while it ran, against the lane's rate), or as a probe, for a cohort of
  ``ClosedLoopHold.cohort`` (4) callers or more, at most once per the record's ``probe_wait`` (1 s after a probe
  that gathered its lane's callers, doubling after each that did not, up to 64 s). So a cohort of 2 or 3 is never
  held from a cold start: the tests that need a hold answer four callers or more first (a probe), or run a closed
  loop first (``alone``);
- independent arrivals keep the gate off and pay only for the probes, about log2 of the run's length of them: their
  p99 latency stays within 1.1x of ``max_hold_time=0``'s on the same arrival schedule once the probes have backed
  off (a run of a minute);
- every accepted item resolves exactly once.

Each test states the rule it checks. Every wait is bounded on the loop's clock (``until``, ``asyncio.wait_for``),
so that a hang fails instead of blocking the suite. What a test reads of the hold is the policy's own: its answer
(:func:`held`) and its record of each lane (``lane.memo``, :func:`record_of`).

The quiet end, and the four turns after it. The rules (``ClosedLoopHold.due``, the waits' ``turns``): a hold lets
its items go once its lane has had no arrival for ``ClosedLoopHold.quiet`` (half) of the time the batch it follows
took, counted from that batch's end or the newest arrival (over every priority level, withdrawn entries included),
and never later than ``max_hold_time`` after that batch ended; a batch of the lane that ends during the hold, with
callers or none, moves neither; when a batch ends while items wait, the next forms ``Deadline().turns`` (4) turns
of the loop later. Checked here (the last section): zero-time batches, batches that raise, callers that time out at
the fifo's tail, priorities, two slots, settings changed during a hold, stops during the turns and a restart,
``process_many`` across batches, and random schedules checked against both bounds. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
from collections.abc import AsyncIterator, Hashable
from typing import Any

import pytest

from async_batcher import END, AsyncBatcher, BatcherStoppedError, QueueFullException, testing
from async_batcher.policies import ClosedLoopHold, Deadline, DispatchPolicy, LaneView
from tests.batchers import Recording, engine_of, stop_as, until
from tests.loops import VirtualClockLoop

pytestmark = pytest.mark.virtual_time

# The idle lanes a batcher keeps for their history when keys come and go (the policy's keep_idle).
KEEP_IDLE = DispatchPolicy.keep_idle


class Keyed(Recording):
    """One key for every item: the keyed path (a lane per key, woken by the engine's ``arrived``)."""

    def batch_key(self, item: int) -> Hashable:
        return "k"


class Weighed(Recording):
    """Every item weighs 1: the weighted path (one queue entry per item, even in a ``process_many``)."""

    def item_weight(self, item: int) -> float:
        return 1.0


class ByHundreds(Recording):
    """Items 0-99 are key 0, 100-199 key 1, ..."""

    def batch_key(self, item: int) -> Hashable:
        return item // 100


class ManyKeys(Recording):
    """Every item is its own key."""

    def batch_key(self, item: int) -> Hashable:
        return item


both_paths = pytest.mark.parametrize("cls", [Recording, Keyed], ids=["plain", "keyed"])


def clean(b: AsyncBatcher[Any, Any]) -> None:
    """The run's invariants hold."""
    assert testing.violations(b) == []


def quiet(b: AsyncBatcher[Any, Any]) -> bool:
    """Nothing queued, nothing in flight, no pump to come."""
    s = b.stats
    return not s.queued and not s.in_flight and engine_of(b).dispatcher.pump_handle is None


def idle_without_timer(b: AsyncBatcher[Any, Any]) -> None:
    """An idle batcher (nothing queued, nothing in flight) keeps no wake-up."""
    if quiet(b):
        assert testing.idle(b) == [], "an idle batcher keeps a wake-up"


def hold_of(b: AsyncBatcher[Any, Any]) -> ClosedLoopHold | None:
    """The hold layer of ``b``'s policy (``None`` without one: ``max_hold_time=0`` builds none)."""
    policy: Any = b.policy
    while not isinstance(policy, ClosedLoopHold):
        policy = getattr(policy, "inner", None)  # (a layer's inner policy)
        if policy is None:
            return None
    return policy


def lane_of(b: AsyncBatcher[Any, Any], key: Hashable = None) -> LaneView:
    """The lane of ``key``: the default lane for a batcher without keys, the one key's for :class:`Keyed`."""
    queue = engine_of(b).queue
    if key is None:
        key = "k" if isinstance(b, Keyed) else None
    return queue.lane0 if key is None else queue.lanes[key]


def record_of(b: AsyncBatcher[Any, Any], key: Hashable = None) -> Any:
    """The hold's record of the lane of ``key`` (its memo: ``alone``, ``probing``, ``probe_at``, ``probe_wait``...),
    or ``None`` before the hold has seen a batch of it."""
    hold, lane = hold_of(b), lane_of(b, key)
    return None if hold is None or lane.memo is None else lane.memo.get(hold)


def held(b: AsyncBatcher[Any, Any], key: Hashable = None) -> bool:
    """Whether a hold keeps the lane's free slot for its callers now (the policy's own answer): a test whose attack
    needs a hold checks that one applies, so that it cannot pass for want of one."""
    hold = hold_of(b)
    return hold is not None and hold._holds(lane_of(b, key), asyncio.get_running_loop().time()) is not None


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


async def settle(b: AsyncBatcher[Any, Any], within: float = 60.0) -> None:
    """Let everything queued and in flight finish (bounded on the loop's clock)."""
    await until(lambda: quiet(b), within=within)


# ---------------------------------------------------------------------- independent arrivals (open loop)


async def open_loop(
    b: Recording,
    schedule: list[float],
    *,
    key_of: Any = None,
    latencies: list[float] | None = None,
    watch: Any = None,
) -> list[float]:
    """Submit item ``i`` at ``schedule[i]`` seconds from now (on the loop's clock), whatever the answers; return
    each item's latency. ``watch(i)``, if given, is called just after item ``i`` is submitted (to read the state)."""
    loop = asyncio.get_running_loop()
    b.start()  # (so that ``watch`` can read its state from the first arrival on)
    start = loop.time()
    out: list[float] = [] if latencies is None else latencies

    async def one(i: int) -> None:
        sent = loop.time()
        await b.process(i if key_of is None else key_of(i))
        out.append(loop.time() - sent)

    calls = []
    for i, at in enumerate(schedule):
        if start + at > loop.time():
            await asyncio.sleep(start + at - loop.time())
        calls.append(asyncio.ensure_future(one(i)))
        if watch is not None:
            watch(i)
    await asyncio.wait_for(asyncio.gather(*calls), 600)
    return out


def poisson(rate: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    at, times = 0.0, []
    for _ in range(n):
        times.append(at)
        at += rng.expovariate(rate)
    return times


class Probes:
    """What the gate does under a stream, read after each arrival: the probes (each one moves the lane's
    ``probe_at`` in the hold's record, at least a second apart), the arrivals at which the hold applied, and those
    at which it applied other than as a probe (the gate read a closed loop)."""

    def __init__(self, b: AsyncBatcher[Any, Any], key: Hashable = None, *, skip: int = 0) -> None:
        self.b, self.key, self.skip = b, key, skip
        self.at: list[float] = []  # each probe's next allowed time (the record's probe_at), in order
        self.waits: list[float] = []  # the record's probe_wait, each time it changed
        self.observed = self.held = self.gate_on = 0

    def __call__(self, i: int) -> None:
        present = self.key is None or self.key in engine_of(self.b).queue.lanes
        record: Any = record_of(self.b, self.key) if present else None
        if record is not None:
            if record.probe_at != -math.inf and (not self.at or record.probe_at != self.at[-1]):
                self.at.append(record.probe_at)
            if not self.waits or record.probe_wait != self.waits[-1]:
                self.waits.append(record.probe_wait)
        if i < self.skip or not present:
            return
        self.observed += 1
        if held(self.b, self.key):
            self.held += 1
            self.gate_on += not record.probing  # (held: the hold has a record of the lane)


@pytest.mark.parametrize(
    ("hold", "rate"),
    [(0.03, 500.0), (0.03, 200.0), (0.05, 50.0), (0.05, 500.0), (0.01, 50.0)],
    ids=[
        "hold-0.3-batch-rate-500",
        "hold-0.3-batch-rate-200",
        "hold-0.5-batch-rate-50",
        "hold-0.5-batch-rate-500",
        "hold-0.1-batch-rate-50",
    ],
)
async def test_open_loop_p99_stays_within_1_1x_of_greedy(hold: float, rate: float) -> None:
    # Independent arrivals, one slot, 0.1 s batches, a minute of them: the same seeded schedule with the hold and
    # with max_hold_time=0. The gate stays off; what the hold costs is its probes, each keeping a slot for a
    # cohort up to max_hold_time, at about 0, 1, 3, 7, 15, 31 s (the wait doubles after each probe that gathered
    # nobody). Each puts the items of about one batch up to max_hold_time late: within the first 6 s, three of
    # them are 7.5 % of a 500/s stream (p99 1.16x greedy's at hold 0.05), within a minute six are under 1 %. A
    # gate that read these arrivals as a closed loop, or probes that did not back off, hold batch after batch.
    # No item is ever later than greedy's latest by more than max_hold_time (one slot: a hold shifts the batches
    # after it, it does not pile them up).
    schedule = poisson(rate, int(60 * rate), seed=11)
    p, worst = {}, {}
    for h in (0.0, hold):
        b = Recording(max_queue_time=0, max_hold_time=h, delay=0.1)
        probes = Probes(b)
        latencies = await open_loop(b, schedule, watch=probes)
        p[h], worst[h] = p99(latencies), max(latencies)
        assert probes.gate_on == 0, f"the gate read a closed loop at {probes.gate_on} arrivals"
        clean(b)
        await b.stop()
    assert p[hold] <= 1.1 * p[0.0], f"p99 {p[hold]:.4f} with the hold, {p[0.0]:.4f} greedy"
    assert worst[hold] <= worst[0.0] + hold + 1e-9


@pytest.mark.parametrize("hold", [0.01, 0.03, 0.05])
async def test_independent_arrivals_keep_the_hold_off(hold: float) -> None:
    # The rule: independent arrivals keep the gate off (no batch of theirs "held all its callers"), and the hold
    # applies only as a probe, once per probe_wait, which doubles. Read after each arrival past the first 200 of
    # 2000 at 500/s (4 s): the gate never on, three probes at most (about 0.2, 1.2 and 3.2 s), and the hold
    # applied at no more arrivals than three probes' worth of max_hold_time.
    b = Recording(max_queue_time=0, max_hold_time=hold, delay=0.1)
    schedule = poisson(500.0, 2000, seed=5)
    probes = Probes(b, skip=200)
    await open_loop(b, schedule, watch=probes)
    await b.stop()
    assert probes.gate_on == 0, f"the gate read a closed loop at {probes.gate_on} of {probes.observed} arrivals"
    assert len(probes.at) <= 3, f"{len(probes.at)} probes in 4 s"
    assert probes.held <= 3 * hold * 500 * 1.5, f"the hold applied at {probes.held} of {probes.observed} arrivals"
    stats = b.stats  # what a user sees: the batches held were the probes' (one or none a probe)
    assert stats.held == stats.probes and 1 <= stats.probes <= len(probes.at), (stats.held, stats.probes, probes.at)


async def test_a_closed_loop_that_turns_open_turns_the_hold_off() -> None:
    # Closed-loop clients first (the hold merges them, and the gate is on), then the same batcher under
    # independent arrivals: within a few batches the gate is off and stays off; the hold applies only as a probe.
    b = Recording(max_queue_time=0, max_hold_time=0.03, delay=0.1)

    async def client(c: int) -> None:
        for _ in range(10):
            await b.process(c)
            await asyncio.sleep(0.001 * c)

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(8))), 60)
    assert [len(x) for x in b.batches][-5:] == [8] * 5  # merged
    assert record_of(b).alone  # by the gate, not by probes
    schedule = poisson(500.0, 1500, seed=9)
    probes = Probes(b, skip=300)
    alone: list[bool] = []

    def watch(i: int) -> None:
        probes(i)
        alone.append(record_of(b).alone)

    await open_loop(b, schedule, watch=watch)
    await b.stop()
    assert not any(alone[300:]), f"the gate still on {sum(alone[300:])} arrivals into the stream"
    assert probes.gate_on == 0, f"the hold still applies by the gate {probes.gate_on} arrivals into the stream"


async def test_an_open_loop_lane_is_not_held_because_another_lane_is_a_closed_loop() -> None:
    # Two keys, two slots: key 0 is a closed loop of eight clients, key 1 independent arrivals. The gate is each
    # lane's own: lane 0's batches hold all their callers and the hold merges them, lane 1's never do, and lane 1
    # waits only for the probes. (Were the gate measured over all lanes together, the closed loop would keep it on
    # for lane 1, whose batches would wait for lane 1's callers, who never come back as a cohort; meanwhile lane 0
    # takes the slot lane 1 keeps free.) Lane 1's p99 must stay within 1.1x of greedy's.
    p = {}
    for h in (0.0, 0.03):
        b = ByHundreds(max_queue_time=0, max_hold_time=h, delay=0.1, concurrency=2)
        done = asyncio.Event()

        async def closed(c: int, b: ByHundreds = b, done: asyncio.Event = done) -> None:
            while not done.is_set():
                await b.process(c)
                await asyncio.sleep(0.002 * (1 + c % 4))

        clients = [asyncio.ensure_future(closed(c)) for c in range(8)]
        probes, lane0 = Probes(b, key=1, skip=100), Probes(b, key=0, skip=100)

        def watch(i: int, probes: Probes = probes, lane0: Probes = lane0) -> None:
            probes(i)
            lane0(i)

        latencies = await open_loop(b, poisson(100.0, 6000, seed=3), key_of=lambda i: 100 + i % 100, watch=watch)
        done.set()
        await asyncio.wait_for(asyncio.gather(*clients), 60)
        p[h] = p99(latencies)
        if h:
            assert probes.gate_on == 0, f"lane 1 held by the gate at {probes.gate_on} of {probes.observed} arrivals"
            assert lane0.gate_on, "lane 0, a closed loop, was never held by the gate"
            lane0_sizes = [len(x) for x in b.batches if x[0] < 100]
            assert lane0_sizes.count(8) >= 0.9 * len(lane0_sizes), "the closed loop was not merged"
        clean(b)
        await b.stop()
    assert p[0.03] <= 1.1 * p[0.0], f"open lane p99 {p[0.03]:.4f} with the hold, {p[0.0]:.4f} greedy"


async def test_independent_arrivals_on_several_slots_keep_the_gate_off() -> None:
    # Five minutes of independent arrivals at 30/s, eight slots, 0.1 s batches, max_queue_time=0.005: most batches
    # take one item, and several run at once. The gate should stay off (as on one slot: at no more than 0.1 % of
    # the arrivals), and p99 within 1.1x of greedy's. But say batch A ends 10 ms after batch B of the same lane,
    # one item arrived in between: the lane's "rate" reads 100/s, ten items over A's 0.1 s, and the two that arrived
    # while A ran are fewer than a quarter of that: A "held all its callers". The hold then keeps the item queued at
    # that moment (not a caller A answered) until the next arrival, or for max_hold_time.
    schedule = poisson(30.0, 9000, seed=11)
    p = {}
    for h in (0.0, 0.05):
        b = Recording(max_queue_time=0.005, max_hold_time=h, delay=0.1, concurrency=8)
        probes = Probes(b)
        p[h] = p99(await open_loop(b, schedule, watch=probes))
        clean(b)
        await b.stop()
        assert probes.gate_on <= 0.001 * len(schedule), f"held by the gate at {probes.gate_on} arrivals"
    assert p[0.05] <= 1.1 * p[0.0], f"p99 {p[0.05]:.4f} with the hold, {p[0.0]:.4f} greedy"


async def test_concurrency_unlimited_open_loop_is_never_held() -> None:
    # With a slot for every batch, independent arrivals go as they come, hold or not (a pin).
    schedule = poisson(200.0, 2000, seed=21)
    p = {}
    for h in (0.0, 0.05):
        b = Recording(max_queue_time=0, max_hold_time=h, delay=0.1, concurrency=None)
        p[h] = p99(await open_loop(b, schedule))
        await b.stop()
    assert p[0.05] <= 1.1 * p[0.0]


async def test_bursty_open_loop_on_and_off_stays_within_1_1x_of_greedy() -> None:
    # On/off: bursts of 0.5 s at 400/s, then 0.5 s of silence (each burst starts after an idle period), for a
    # minute: the probes (about 0, 1, 3, 7, 15, 31 s) fall in bursts, the gate stays off (a burst's last batch holds
    # all its callers, but nobody is waiting when the next burst comes). Over 20 bursts the five probes put 1.5 %
    # of the items up to max_hold_time late (1.17x); over 60, 0.6 %.
    rng = random.Random(17)
    schedule: list[float] = []
    at = 0.0
    for burst in range(60):
        at = burst * 1.0
        while at < burst * 1.0 + 0.5:
            schedule.append(at)
            at += rng.expovariate(400.0)
    p = {}
    for h in (0.0, 0.05):
        b = Recording(max_queue_time=0, max_hold_time=h, delay=0.1)
        probes = Probes(b)
        p[h] = p99(await open_loop(b, schedule, watch=probes))
        assert probes.gate_on <= 0.001 * len(schedule), f"held by the gate at {probes.gate_on} arrivals"
        idle_without_timer(b)
        await b.stop()
    assert p[0.05] <= 1.1 * p[0.0]


async def test_probes_back_off_under_independent_arrivals() -> None:
    # Two minutes of independent arrivals (50/s, 0.1 s batches: most batches answer a cohort of four or more, each
    # a chance to probe): the probes come about log2(120) times (at about 0, 1, 3, 7, 15, 31 and 63 s), not 120
    # times, each twice as long after the one before, and the wait is 64 s at the end.
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    probes = Probes(b)
    await open_loop(b, poisson(50.0, 6000, seed=23), watch=probes)
    await b.stop()
    assert probes.gate_on == 0
    assert 5 <= len(probes.at) <= math.log2(120) + 2, f"{len(probes.at)} probes in 120 s: {probes.at}"
    assert probes.waits == [1, 2, 4, 8, 16, 32, 64]
    # Each probe sets the next one's earliest time, its start plus the wait; the next starts with the first cohort
    # answered after that (well within half a second at this rate).
    gaps = [later - earlier for earlier, later in zip(probes.at, probes.at[1:], strict=False)]
    waits = [min(2.0 ** (k + 1), 64.0) for k in range(len(gaps))]
    assert all(wait <= gap <= wait + 0.5 for gap, wait in zip(gaps, waits, strict=True)), gaps


async def stream_then_split_loop(
    b: Recording, *, until_s: float, split_at: float = math.inf
) -> tuple[float, list[tuple[float, int]]]:
    """20 s of independent arrivals (50/s: five probes, the wait backed off to 32 s, the next probe allowed at
    about 32 s), then eight closed-loop clients that start split (the odd ones 0.05 s later), until ``until_s``; at
    ``split_at`` the odd ones pause 0.06 s once more (a hiccup longer than the hold: the loop splits again).
    Returns when the next probe was allowed after the stream, and the start and size of each batch of the
    clients."""
    loop = asyncio.get_running_loop()
    await open_loop(b, poisson(50.0, 1000, seed=29), key_of=lambda i: 10**6 + i)
    record = record_of(b)
    assert record.probe_wait == 32 and not record.alone
    next_probe = record.probe_at
    await asyncio.sleep(20.0 - loop.time())

    async def client(c: int) -> None:
        await asyncio.sleep(0.05 if c % 2 else 0)
        paused = False
        r = 0
        while loop.time() < until_s:
            await b.process(c * 1000 + r)
            r += 1
            await asyncio.sleep(0.005)
            if c % 2 and not paused and loop.time() >= split_at:
                paused = True
                await asyncio.sleep(0.06)

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(8))), 120)
    return next_probe, [(at, len(x)) for at, x in zip(b.started_at, b.batches, strict=True) if x[0] < 10**6]


async def test_a_probe_gathers_a_split_closed_loop_and_the_gate_keeps_it_gathered() -> None:
    # After 20 s of independent arrivals, the next probe is allowed at about 32 s. Eight closed-loop clients that
    # start split alternate in cohorts of four: none of their batches holds all its callers (the other cohort
    # arrives while it runs), so the gate is off and they stay split until that probe: it holds the slot for a
    # cohort, the other cohort is waiting, and one batch of eight goes. That batch held all its callers: the gate is
    # on, and every batch after it is of all eight; the probe's wait is back to 1 s.
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    next_probe, batches = await stream_then_split_loop(b, until_s=36.0)
    split = [size for at, size in batches if at < next_probe]
    merged = [at for at, size in batches if size == 8]
    assert len(split) > 100 and split == [4] * len(split)
    assert merged and next_probe <= merged[0] <= next_probe + 0.5, (next_probe, merged[:3])
    after = [size for at, size in batches if at > merged[0]][:-1]  # (the last: the clients with a round left)
    assert len(after) > 20 and after == [8] * len(after)
    assert record_of(b).alone and record_of(b).probe_wait == 1
    await b.stop()


async def test_after_a_probe_that_gathered_a_split_loop_is_gathered_again_within_seconds() -> None:
    # As above: the probe at about 32 s gathers the clients, and the wait goes back to 1 s. At 35 s half of them
    # hiccup once (0.06 s, longer than the hold): the loop splits, the gate is off again. A probe is allowed from
    # about 33 s (1 s after the one that gathered them): the next cohort answered after 35 s is probed, and the loop
    # is whole again within a second. The probe at 32 s set the next one's time with the wait it began with, 32 s:
    # the loop stays split until 64 s.
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    _, batches = await stream_then_split_loop(b, until_s=40.0, split_at=35.0)
    assert any(size == 4 for at, size in batches if 35.0 <= at < 36.0), "the hiccup did not split the loop"
    late = [(round(at, 3), size) for at, size in batches if 36.5 <= at and size != 8][:-1]  # (the last: leftovers)
    assert not late, f"still split 1.5 s after the hiccup: {late[:4]} ..."
    await b.stop()


# ---------------------------------------------------------------------- whom the hold waits for


@pytest.mark.parametrize("cls", [Recording, Keyed, Weighed], ids=["plain", "keyed", "weighted"])
async def test_a_lone_caller_with_a_process_many_never_waits(cls: type[Recording]) -> None:
    # One caller: a process_many of five, then a process. The process_many counts once (contract point 1), so
    # when the caller comes back, everyone owed is back. With keys or weights, a process_many is queued as one
    # entry per item: were each item's sink counted as a caller, five would be owed, a cohort a probe holds for,
    # and the caller would wait the whole hold for four callers that never were.
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    assert await b.process_many([1, 2, 3, 4, 5]) == [2, 4, 6, 8, 10]
    sent = loop.time()
    assert await b.process(4) == 8
    assert loop.time() - sent == pytest.approx(0.1), "the lone caller waited for the hold"
    await b.stop()


@pytest.mark.parametrize("cls", [Recording, Keyed, Weighed], ids=["plain", "keyed", "weighted"])
async def test_a_process_many_split_over_batches_does_not_wait_for_itself(cls: type[Recording]) -> None:
    # Fifteen items in batches of ten: the first batch answers nobody (the call is not done), so the last five go
    # as soon as the slot is free (had it counted its ten items as callers, a probe would hold them until 1.01);
    # the second answers the one call. Its caller's next call then finds everyone back.
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_batch_size=10, max_hold_time=1.0, delay=0.01)
    assert await b.process_many(range(15)) == [x * 2 for x in range(15)]
    assert b.started_at == pytest.approx([0, 0.01])
    sent = loop.time()
    assert await b.process(99) == 198
    assert loop.time() - sent == pytest.approx(0.01), "the caller waited for itself"
    await b.stop()


@both_paths
@pytest.mark.parametrize("how", ["cancelled", "timed-out"])
async def test_a_caller_that_left_while_its_batch_ran_is_not_waited_for(cls: type[Recording], how: str) -> None:
    # Five callers share a batch; one leaves while it runs (cancelled, or its timeout expires): its result is
    # dropped, it was not answered. The batch answered four, a cohort a probe holds for; they come back at once:
    # nobody the batch answered is missing, and their batch goes at once, not at the hold's end.
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    stay = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    leaves = asyncio.ensure_future(b.process(9) if how == "cancelled" else b.process(9, timeout=0.05))
    await asyncio.sleep(0.05)
    if how == "cancelled":
        leaves.cancel()
    with pytest.raises((asyncio.CancelledError, TimeoutError)):
        await leaves
    assert await asyncio.gather(*stay) == [0, 2, 4, 6]
    sent = loop.time()
    back = [asyncio.ensure_future(b.process(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert held(b)  # the probe holds for the four answered: three are back
    assert await asyncio.wait_for(asyncio.gather(*back, b.process(3)), 5) == [0, 2, 4, 6]
    assert loop.time() - sent == pytest.approx(0.1), "the hold waited for a caller that had left"
    await b.stop()


@both_paths
async def test_a_hold_goes_when_the_callers_owed_are_back_even_if_one_of_them_left_again(cls: type[Recording]) -> None:
    # Four answered at 0.1 (a probe holds for them). Back: one at 0.1, one at 0.11 (cancelled at 0.12), one at
    # 0.13, one at 0.14: as many arrivals as callers owed, so the hold is over (the policy says so: held() is
    # False) and the batch goes at 0.14. On process()'s short path the wake-up threshold was computed before the
    # withdrawal: the arrival at 0.14 would wake nobody and the batch wait for the hold's timer, at 1.1.
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    first = asyncio.ensure_future(b.process(10))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(b.process(11))
    await asyncio.sleep(0.01)
    second.cancel()
    await asyncio.sleep(0.01)
    third = asyncio.ensure_future(b.process(12))
    await asyncio.sleep(0.01)
    assert held(b)  # three of the four back (one of them left again)
    fourth = asyncio.ensure_future(b.process(13))
    assert list(await asyncio.wait_for(asyncio.gather(first, third, fourth), 5)) == [20, 24, 26]
    assert b.started_at == pytest.approx([0, 0.14])
    await b.stop()


async def test_a_lane_does_not_wait_for_another_lanes_callers_even_when_they_come_back_to_it() -> None:
    # Lane 0 answers four at 0.1; they come back as lane-1 items. Lane 1 was never answered: it owes nobody and
    # its items go at once; lane 0, empty, keeps no timer. (A pin.)
    loop = asyncio.get_running_loop()
    b = ByHundreds(max_queue_time=0, max_hold_time=1.0, delay=0.1, concurrency=2)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    assert held(b, 0)  # lane 0 keeps a slot for its four (a probe)
    sent = loop.time()
    assert await asyncio.gather(*(b.process(100 + i) for i in range(2))) == [200, 202]
    assert loop.time() - sent == pytest.approx(0.1)
    idle_without_timer(b)
    await b.stop()


async def test_clients_that_move_to_a_new_key_every_round_are_not_held_by_the_lanes_they_left() -> None:
    # Eight closed-loop clients, a fresh key each round, a slot for every batch: each lane's hold waits for
    # callers that went on to another lane, but nothing waits in the old lane and the new one owes nobody, so no
    # request ever waits; and the lanes left behind are forgotten once their holds are over, but the KEEP_IDLE that
    # ended last (a pin: more rounds than that).
    loop = asyncio.get_running_loop()
    b = ByHundreds(max_queue_time=0, max_hold_time=0.05, delay=0.1, concurrency=None)
    latencies: list[float] = []
    rounds = KEEP_IDLE + 10

    async def client(c: int) -> None:
        for r in range(rounds):
            sent = loop.time()
            assert await b.process(r * 100 + c) == 2 * (r * 100 + c)
            latencies.append(loop.time() - sent)
            await asyncio.sleep(0.001 * c)
            clean(b)

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(8))), 60)
    assert latencies == [pytest.approx(0.1)] * 8 * rounds
    # The default lane, the idle ones kept, the last key's (its hold), perhaps the one before.
    assert len(engine_of(b).queue.lanes) <= 3 + KEEP_IDLE
    idle_without_timer(b)
    await b.stop()


@pytest.mark.parametrize("concurrency", [1, 2, None])
async def test_a_lone_client_never_waits_at_any_concurrency(concurrency: int | None) -> None:
    # A single closed-loop client, coming back at once or after idle periods longer than the hold. (A pin.)
    loop = asyncio.get_running_loop()
    b = Keyed(max_queue_time=0, max_hold_time=0.5, delay=0.1, concurrency=concurrency)
    for think in (0, 0.001, 1.0, 0, 2.0, 0.3):
        sent = loop.time()
        assert await b.process(1) == 2
        assert loop.time() - sent == pytest.approx(0.1)
        await asyncio.sleep(think)
        idle_without_timer(b)
    await b.stop()


@pytest.mark.parametrize(
    "ending", ["none-back", "some-back", "all-back", "back-then-cancelled", "many-keys", "timed-out"]
)
async def test_an_idle_batcher_after_a_hold_wakes_the_loop_for_nothing(ending: str) -> None:
    # However a hold's story ends, once nothing is queued or in flight the loop's clock jumps only for the test's
    # own sleep: no wake-up is left for the hold (counted with VirtualClockLoop.jumps).
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    b = (ManyKeys if ending == "many-keys" else Keyed)(max_queue_time=0, max_hold_time=5.0, delay=0.1, concurrency=2)
    await asyncio.gather(*(b.process(i) for i in range(4)))  # four owed, for 5 s
    if ending == "some-back":
        # two back, held until the lane is quiet for half the 0.1 the batch took: sent at 0.15, not 5.1
        assert list(await asyncio.gather(b.process(1), b.process(2))) == [2, 4]
        assert b.started_at[-1] == pytest.approx(0.15)
    elif ending == "all-back":
        two = [asyncio.ensure_future(b.process(i)) for i in range(2)]  # held: a timer for the hold's end
        await asyncio.sleep(0.01)
        assert await asyncio.gather(*two, b.process(2), b.process(3)) == [0, 2, 4, 6]  # all back: sent at 0.11
        assert b.started_at[-1] == pytest.approx(0.11)
    elif ending == "back-then-cancelled":
        back = asyncio.ensure_future(b.process(1))
        await asyncio.sleep(0.01)
        back.cancel()
        with pytest.raises(asyncio.CancelledError):
            await back
    elif ending == "many-keys":
        assert await asyncio.gather(*(b.process(100 + i) for i in range(50))) == [200 + 2 * i for i in range(50)]
    elif ending == "timed-out":
        with pytest.raises(TimeoutError):  # held: it times out before the lane has been quiet long enough
            await b.process(1, timeout=0.01)
    await settle(b)
    idle_without_timer(b)
    jumps = loop.jumps
    await asyncio.sleep(100)
    assert loop.jumps == jumps + 1, "the idle batcher woke the loop"
    clean(b)
    await b.stop()


# ---------------------------------------------------------------------- how long the hold lasts


async def test_a_hold_keeps_a_free_slot_idle_at_most_max_hold_time_while_batches_of_the_lane_keep_ending() -> None:
    # Unlimited slots. Ten batches of four callers each went at once and are in flight; they end 0.04 apart from
    # 1.0 on, and none of their callers comes back. The first end begins a hold (a probe, for its four); a new
    # caller arrives at 1.01, with a free slot. Were each batch end to restart the hold (0.05 from that end, for
    # that batch's callers: the batch ending at 1.04 held all its callers, by the gate, one item having arrived
    # since 1.0), the new item would wait past 1.06 (with the gate on throughout, until 1.41, eight times
    # max_hold_time). A hold that has begun is not prolonged by later ends (they add their callers to it): the item
    # goes by 1.01 + max_hold_time at the latest.
    loop = asyncio.get_running_loop()

    class Staggered(Recording):
        async def process_batch(self, batch: list[int]) -> Any:
            self.batches.append(list(batch))
            self.started_at.append(loop.time())
            if batch[0] < 100:
                await asyncio.sleep(1.0 + 0.04 * (batch[0] // 10) - loop.time())
            else:
                await asyncio.sleep(0.01)
            return [x * 2 for x in batch]

    b = Staggered(max_queue_time=0, max_hold_time=0.05, concurrency=None, max_batch_size=4)
    calls = [asyncio.ensure_future(b.process(k * 10 + i)) for k in range(10) for i in range(4)]
    await asyncio.sleep(1.01 - loop.time())
    assert len(b.batches) == 10
    assert held(b)
    assert await asyncio.wait_for(b.process(100), 5) == 200
    await asyncio.gather(*calls)
    assert b.batches[-1] == [100]
    assert b.started_at[-1] <= 1.01 + 0.05 + 1e-9, f"held until {b.started_at[-1]}"
    await b.stop()


@both_paths
async def test_max_hold_time_set_to_zero_ends_a_hold_under_way(cls: type[Recording]) -> None:
    # max_hold_time=0 means never hold. Set during a hold (of 10 s), it ends it: the waiting item goes at once.
    # (Were the hold's end fixed when the batch ended, the hold not looking at the setting, the item would wait the
    # old 10 s.)
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=10.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))  # four answered at 0.1: a probe holds for them
    waiting = asyncio.ensure_future(b.process(2))
    await asyncio.sleep(0.01)
    assert held(b)
    b.max_hold_time = 0
    assert await asyncio.wait_for(waiting, 20) == 4
    assert b.started_at[1] == pytest.approx(0.11), f"went at {b.started_at[1]}"
    assert loop.time() == pytest.approx(0.21)
    await b.stop()


@both_paths
async def test_a_shorter_max_hold_time_set_during_a_hold_applies_to_it(cls: type[Recording]) -> None:
    # Lowered from 10 s to 0.05 s at 0.11: the hold ends 0.05 after the batch that began it (0.15), not keeping
    # the 10 s it began with.
    b = cls(max_queue_time=0, max_hold_time=10.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    waiting = asyncio.ensure_future(b.process(2))
    await asyncio.sleep(0.01)
    assert held(b)
    b.max_hold_time = 0.05
    assert await asyncio.wait_for(waiting, 20) == 4
    assert b.started_at[1] <= 0.15 + 1e-9, f"went at {b.started_at[1]}"
    await b.stop()


@both_paths
async def test_max_hold_time_back_on_after_zero_holds_again(cls: type[Recording]) -> None:
    # 0, then back to 0.05 between batches: the next batch's end holds again (a pin). (Four callers: the batch
    # at 0.1, the lane's first with keys, whose empty lane is forgotten when no hold keeps it, holds by a probe;
    # without keys, the batch held all its callers and the gate is on.)
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    b.max_hold_time = 0
    await asyncio.gather(*(b.process(i) for i in range(4)))
    b.max_hold_time = 0.05
    await asyncio.gather(*(b.process(i) for i in range(4)))  # answered at 0.2, all four owed
    back = asyncio.ensure_future(b.process(2))
    await asyncio.sleep(0)
    assert held(b)
    assert await asyncio.wait_for(back, 5) == 4
    assert b.started_at == pytest.approx([0, 0.1, 0.25])  # held 0.05 for the one that never came
    await b.stop()


@both_paths
@pytest.mark.parametrize("how", ["cancelled", "timed-out"])
async def test_a_hold_whose_returning_callers_leave_still_ends_on_time(cls: type[Recording], how: str) -> None:
    # Six answered at 0.1 (a probe holds for them); three come back and leave again during the hold (cancelled, or
    # timed out): they count as back, but the other three never come. A new caller at 0.12 (the fourth back) waits
    # for the hold's end, 0.15, not longer; and while nothing waits the batcher keeps no timer.
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(6)))
    backs = [
        asyncio.ensure_future(b.process(10 + i) if how == "cancelled" else b.process(10 + i, timeout=0.01))
        for i in range(3)
    ]
    await asyncio.sleep(0.01)
    if how == "cancelled":
        for call in backs:
            call.cancel()
    results = await asyncio.gather(*backs, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError | TimeoutError) for r in results)
    await asyncio.sleep(0.01)
    idle_without_timer(b)  # nothing waits: no wake-up for the hold
    sent = loop.time()
    assert await asyncio.wait_for(b.process(5), 5) == 10
    assert b.started_at[-1] == pytest.approx(0.15)
    assert loop.time() - sent == pytest.approx(0.13)
    idle_without_timer(b)
    clean(b)
    await b.stop()


async def test_a_busy_loop_that_runs_past_the_hold_does_not_hold_after_it() -> None:
    # The loop is busy for 1 s (its clock jumps inside a callback) while a hold of 0.05 runs: when the dispatcher
    # looks again the hold is long over, and the item goes at once.
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))  # four answered at 0.1: a probe holds for them
    waiting = asyncio.ensure_future(b.process(2))
    await asyncio.sleep(0)
    assert held(b)
    loop.advance(1.0)  # a CPU-bound stretch on the loop
    assert await asyncio.wait_for(waiting, 5) == 4
    assert b.started_at[1] == pytest.approx(1.1)
    await b.stop()


async def test_a_clock_jump_inside_process_batch_starts_the_hold_at_the_jumped_time() -> None:
    # process_batch stalls the loop for 5 s before answering: the batch ended at 5.0, and the hold (a probe, for
    # the four it answered) runs from there; a caller back at 5.01 finds the three other owed ones not back and
    # waits until 5.05. (A pin.)
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    virtual = loop

    class Stalls(Recording):
        async def process_batch(self, batch: list[int]) -> Any:
            self.started_at.append(virtual.time())
            self.batches.append(list(batch))
            if len(self.batches) == 1:
                virtual.advance(5.0)
            return [x * 2 for x in batch]

    b = Stalls(max_queue_time=0, max_hold_time=0.05)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.01)
    back = asyncio.ensure_future(b.process(2))
    await asyncio.sleep(0)
    assert held(b)
    assert await asyncio.wait_for(back, 5) == 4
    assert b.started_at == pytest.approx([0, 5.05])
    await b.stop()


# ---------------------------------------------------------------------- interplay with the other settings


@both_paths
async def test_preferred_batch_sizes_do_not_split_the_cohort_the_hold_waits_for(cls: type[Recording]) -> None:
    # Eight closed-loop clients, preferred sizes (4, 8). Without preferred sizes the hold gathers all eight each
    # round. With them, were the first four back, the smallest preferred size, to end the hold, the cohort would
    # split into halves, the very thing the hold is for, though 8 is a preferred size too.
    sizes = {}
    for preferred in ((), (4, 8)):
        b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1, max_batch_size=8, preferred_batch_sizes=preferred)

        async def client(c: int, b: Recording = b) -> None:
            for _ in range(6):
                await b.process(c)
                await asyncio.sleep(0.002 * c)

        await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(8))), 60)
        sizes[preferred] = [len(x) for x in b.batches]
        await b.stop()
    assert sizes[()] == [8] * 6
    assert sizes[(4, 8)] == [8] * 6


@pytest.mark.parametrize(("budget", "bound"), [(0.2, 0.2), (2.0, 0.15)], ids=["tight-budget", "loose-budget"])
async def test_a_hold_does_not_push_an_item_past_the_adaptive_latency_budget(budget: float, bound: float) -> None:
    # max_latency=0.2 promises that the oldest item goes in time for its batch to end within the budget
    # (async_batcher.adaptive: "it never waits past the budget"). A closed loop of four has the hold on; then only
    # one of them comes back: were the hold of 1 s to override the budget, it would wait the whole hold, 1.1 s in
    # all. With a looser budget (2 s), the hold's quiet end sends it: 0.05 (half the 0.1 s batch) after it came,
    # answered 0.15 after it was sent.
    loop = asyncio.get_running_loop()
    b = Recording(max_latency=budget, max_hold_time=1.0, delay=0.1)
    for _ in range(6):  # the model learns: 0.1 s a batch, four items arriving a batch
        await asyncio.gather(*(b.process(i) for i in range(4)))
    assert record_of(b).alone
    sent = loop.time()
    back = asyncio.ensure_future(b.process(5))
    await asyncio.sleep(0)
    assert held(b)
    assert await asyncio.wait_for(back, 5) == 10
    assert loop.time() - sent <= bound + 1e-9, f"latency {loop.time() - sent:.3f} s with max_latency={budget}"
    await b.stop()


async def test_max_batch_size_smaller_than_the_cohort_sends_full_batches_during_a_hold() -> None:
    # Twelve clients, max_batch_size=8: a full batch never waits for a hold, it goes as the slot frees (a pin).
    # The first batch answers eight (a probe holds for them) while four wait: the fourth client back makes a full
    # batch, which goes at 0.101, not at the hold's end. Then no batch holds all its callers (the next ones arrive
    # while it runs: the loop is larger than a batch), the gate is off, and every batch of eight goes as the slot
    # frees or as its eighth item comes.
    loop = asyncio.get_running_loop()
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1, max_batch_size=8)
    full_and_held = []

    async def client(c: int) -> None:
        for _ in range(6):
            await b.process(c)
            await asyncio.sleep(0.001 * (c % 4))
            full_and_held.append(held(b) and lane_of(b).count >= 8)

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(12))), 60)
    assert sum(len(x) for x in b.batches) == 72
    assert len(b.batches[1]) == 8 and b.started_at[1] == pytest.approx(0.101)  # full, during the probe's hold
    assert not any(full_and_held), "a full batch waited for a hold"
    ends = [start + 0.1 for start in b.started_at]
    for k in range(1, len(b.batches)):
        if len(b.batches[k]) == 8:  # went as its slot freed, or within a client's return of it
            assert b.started_at[k] <= max(ends[k - 1], b.started_at[k - 1]) + 0.003 + 1e-9, (k, b.started_at)
    assert loop.time() < 1.5
    idle_without_timer(b)
    await b.stop()


async def test_priorities_do_not_change_whom_the_hold_waits_for() -> None:
    # The callers come back one after another, each with another priority: they still count (a pin), the hold
    # gathers them, and the batch goes when the last is back, in priority order.
    b = Recording(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    back = []
    for i in range(4):
        back.append(asyncio.ensure_future(b.process(10 + i, priority=3 - i)))
        await asyncio.sleep(0.01)
        assert held(b) == (i < 3)
    assert await asyncio.wait_for(asyncio.gather(*back), 5) == [20, 22, 24, 26]
    assert b.batches[1] == [13, 12, 11, 10] and b.started_at[1] == pytest.approx(0.13)
    await b.stop()


@both_paths
async def test_raising_concurrency_during_a_hold_does_not_break_it(cls: type[Recording]) -> None:
    # A hold keeps a free slot for the callers owed; more slots come live: the hold still ends on time, and the
    # invariants hold (a pin).
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))  # four answered at 0.1: a probe holds for them
    waiting = asyncio.ensure_future(b.process(2))
    await asyncio.sleep(0.01)
    assert held(b)
    b.concurrency = 4
    clean(b)
    assert await asyncio.wait_for(waiting, 10) == 4
    assert b.started_at[1] <= 0.15 + 1e-9
    await b.stop()


@both_paths
async def test_shrinking_max_queue_size_under_callers_waiting_for_room_ends_the_hold(cls: type[Recording]) -> None:
    # Four owed at 0.1 (a probe); one back at once. At 0.11 the queue shrinks to one and another caller waits for
    # room: the held batch goes at once, to make room (a pin).
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1, wait_when_full=True)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    back = asyncio.ensure_future(b.process(0))
    await asyncio.sleep(0.01)
    assert held(b)
    b.max_queue_size = 1
    blocked = asyncio.ensure_future(b.process(5))
    await asyncio.sleep(0.01)
    assert list(await asyncio.wait_for(asyncio.gather(back, blocked), 5)) == [0, 10]
    assert b.started_at[1] == pytest.approx(0.11)
    clean(b)
    await b.stop()


# ---------------------------------------------------------------------- stops at every moment of a hold


@both_paths
@pytest.mark.parametrize("stop", ["drain", "force", "timeout"])
@pytest.mark.parametrize("moment", ["batch-running", "hold-empty", "hold-waiting", "hold-room-waiting"])
async def test_a_stop_at_any_moment_of_a_hold_never_waits_for_it(cls: type[Recording], stop: str, moment: str) -> None:
    # A 10 s hold (a probe, for four), and a stop at each moment of its life: it never waits for the hold (a drain
    # sends what waits at once; a forced stop fails it at once), every caller resolves once, and the stopped
    # batcher keeps no timer.
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=10.0, delay=0.1, wait_when_full=True)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    if moment != "batch-running":
        await asyncio.gather(*calls)  # answered at 0.1: four owed
        await asyncio.sleep(0.01)
        calls = []
        assert held(b)
    if moment in ("hold-waiting", "hold-room-waiting"):
        calls.append(asyncio.ensure_future(b.process(10)))
        await asyncio.sleep(0.01)
        assert held(b)
    if moment == "hold-room-waiting":
        b.max_queue_size = 1
        await asyncio.sleep(0)
        calls.append(asyncio.ensure_future(b.process(11)))
        await asyncio.sleep(0)
    began = loop.time()
    if stop == "drain":
        await asyncio.wait_for(b.stop(), 5)
    elif stop == "force":
        await asyncio.wait_for(b.stop(force=True), 5)
    else:
        await asyncio.wait_for(b.stop(timeout=0.5), 5)
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    if stop == "force":
        assert loop.time() == began
        assert all(isinstance(outcome, BatcherStoppedError) for outcome in outcomes), outcomes
    else:
        # Drained without waiting for the hold: the batches still to go take 0.1 s each (two when a caller was
        # let in for room), well within the stop's timeout.
        assert loop.time() - began <= (0.2 if moment == "hold-room-waiting" else 0.1) + 1e-9
        if moment == "hold-room-waiting":  # the caller let in for room had not queued yet: a stop refuses it
            outcomes, last = outcomes[:-1], outcomes[-1]
            assert isinstance(last, int | BatcherStoppedError), last
        assert all(isinstance(outcome, int) for outcome in outcomes), outcomes
    assert not await b.is_running() and testing.idle(b) == []
    s = b.stats
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out


# ---------------------------------------------------------------------- streaming and re-entrant calls


class Tokens(AsyncBatcher[tuple[int, int, int], int]):
    """Streams ``n`` parts for an item ``(client, round, n)``, one a step of 0.01 s; items join running batches."""

    continuous_batching = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.starts: list[float] = []

    async def process_batch(self, batch: list[tuple[int, int, int]]) -> AsyncIterator[list[Any]]:
        self.starts.append(asyncio.get_running_loop().time())
        sent: dict[tuple[int, int, int], int] = {}
        while batch:
            await asyncio.sleep(0.01)
            parts: list[Any] = []
            for item in batch:
                sent[item] = sent.get(item, 0) + 1
                parts.append(END if sent[item] > item[2] else sent[item])
            yield parts


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_streaming_with_continuous_batching_and_a_hold_resolves_every_stream(concurrency: int) -> None:
    # Closed-loop stream consumers of different lengths (1 to 5 parts), a hold and items joining running batches:
    # every stream delivers all its parts once and ends; the batcher ends idle without a timer (a pin).
    b = Tokens(max_queue_time=0, max_hold_time=0.05, concurrency=concurrency, max_batch_size=4)
    got: list[list[int]] = []

    async def consumer(c: int) -> None:
        for r in range(5):
            n = 1 + (c + r) % 5
            parts = [part async for part in b.stream((c, r, n))]
            got.append(parts)
            assert parts == list(range(1, n + 1))
            await asyncio.sleep(0.001 * c)
            clean(b)

    await asyncio.wait_for(asyncio.gather(*(consumer(c) for c in range(6))), 60)
    assert len(got) == 30
    await settle(b)
    idle_without_timer(b)
    await b.stop()


async def test_a_reentrant_process_during_a_hold_is_served_within_the_hold() -> None:
    # Two slots. A batch of the outer key calls process() for an inner item while the inner lane holds its slot
    # for four callers that never come back (a probe): the inner item waits for that hold's end, not longer (a
    # pin).
    loop = asyncio.get_running_loop()

    class Nested(ByHundreds):
        async def process_batch(self, batch: list[int]) -> Any:
            self.batches.append(list(batch))
            self.started_at.append(loop.time())
            if batch[0] >= 100:
                await asyncio.sleep(0.02)
                inner = await self.process(50)
                return [x * 2 + inner for x in batch]
            await asyncio.sleep(0.1)
            return [x * 2 for x in batch]

    b = Nested(max_queue_time=0, max_hold_time=0.05, concurrency=2)
    await asyncio.gather(*(b.process(i) for i in range(4)))  # lane 0 answered four at 0.1
    assert held(b, 0)
    assert await asyncio.wait_for(b.process(100), 5) == 300  # its inner item (lane 0) goes at the hold's end
    assert b.batches[2] == [50] and b.started_at[2] == pytest.approx(0.15)
    await b.stop()


# ---------------------------------------------------------------------- large populations


async def test_ten_thousand_closed_loop_callers_share_one_batch_a_round() -> None:
    # 10 000 clients coming back within 0.6 ms of their answers: one batch a round, one lane, no timer left over,
    # and the hold's state is two numbers whatever the population (a pin).
    b = Recording(max_queue_time=0, max_hold_time=0.005, delay=0.01)

    async def client(c: int) -> None:
        for _ in range(4):
            await b.process(c)
            await asyncio.sleep(0.0001 * (c % 7))

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(10_000))), 60)
    assert [len(x) for x in b.batches] == [10_000] * 4
    assert len(engine_of(b).queue.lanes) == 1
    idle_without_timer(b)
    clean(b)
    await b.stop()


async def test_lanes_kept_for_holds_are_forgotten_once_the_holds_are_over() -> None:
    # 1000 keys, each answered once: each empty lane is kept while its hold may still wait (0.05 s). After that,
    # the next call forgets all but the KEEP_IDLE that ended last: the lanes do not accumulate across bursts of new
    # keys (a pin). (While the batcher is idle they stay: nothing runs to forget them, by design, as an idle batcher
    # keeps no timer.)
    loop = asyncio.get_running_loop()
    b = ManyKeys(max_queue_time=0, max_hold_time=0.05, delay=0.01, concurrency=None)
    for burst in range(3):
        await asyncio.gather(*(b.process(burst * 10_000 + i) for i in range(1000)))
        assert len(engine_of(b).queue.lanes) <= 1001 + KEEP_IDLE  # (the last burst's idle lanes that ended last)
        await asyncio.sleep(0.1)
        idle_without_timer(b)
    sent = loop.time()
    assert await b.process(-1) == -2
    assert loop.time() - sent == pytest.approx(0.01)
    assert len(engine_of(b).queue.lanes) <= 2 + KEEP_IDLE  # (the idle lanes that ended last are kept for their history)
    await b.stop()


# ---------------------------------------------------------------------- random schedules


class Chaos(AsyncBatcher[int, int]):
    """Doubles its items after a drawn delay; keys by ``item % keys``; records every item it is sent."""

    def __init__(self, rng: random.Random, keys: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rng = rng
        self.keys = keys
        self.sent: list[int] = []

    def batch_key(self, item: int) -> Hashable:
        return item % self.keys

    async def process_batch(self, batch: list[int]) -> list[int]:
        if len({x % self.keys for x in batch}) != 1:
            raise AssertionError(f"a batch mixes keys: {batch}")
        self.sent += batch
        clean(self)
        await asyncio.sleep(self.rng.choice([0.0, 0.005, 0.02, 0.1]))
        return [x * 2 for x in batch]


@pytest.mark.parametrize("seed", range(int(os.environ.get("HOLD_ATTACK_SEEDS", "12"))))
async def test_random_schedules_around_holds_resolve_every_item_once(seed: int) -> None:
    # Closed-loop clients (single items and process_many, keys, priorities, timeouts), independent arrivals,
    # cancellations, live setting changes (max_hold_time, max_queue_time, concurrency, max_queue_size under
    # wait_when_full callers), and a stop of a drawn kind at a drawn moment. After every step: the invariants, and
    # no timer on an idle batcher; at the end every call resolved once, with its own items' results, no item
    # sent twice, and the counters add up.
    rng = random.Random(seed)
    b = Chaos(
        random.Random(seed + 1000),
        keys=rng.choice([1, 1, 3]),
        max_queue_time=rng.choice([0.0, 0.0, 0.01]),
        max_hold_time=rng.choice([0.01, 0.05, 0.2]),
        concurrency=rng.choice([1, 2, None]),
        max_batch_size=rng.choice([None, 4, 16]),
        wait_when_full=True,
    )
    ids = iter(range(1, 10**9))
    stopping = False
    outcomes: list[tuple[list[int], Any]] = []

    def check() -> None:
        clean(b)
        idle_without_timer(b)

    started = 0

    async def call(items: list[int], *, bulk: bool, timeout: float | None, priority: float) -> None:
        nonlocal started
        started += 1
        try:
            if bulk:
                result: Any = await b.process_many(items, timeout=timeout, priority=priority)
            else:
                result = [await b.process(items[0], timeout=timeout, priority=priority)]
        except (BatcherStoppedError, TimeoutError, asyncio.CancelledError) as exc:
            outcomes.append((items, type(exc)))
            return
        except QueueFullException as exc:  # wait_when_full: only a call larger than the whole queue is refused
            outcomes.append((items, QueueFullException if len(items) > (b.max_queue_size or math.inf) else exc))
            return
        except Exception as exc:
            outcomes.append((items, exc))
            return
        outcomes.append((items, result))
        check()

    tasks: list[asyncio.Future[None]] = []

    async def client(c: int) -> None:
        for _ in range(rng.randint(2, 12)):
            if stopping:
                return
            n = 1 if rng.random() < 0.8 else rng.randint(1, 6)
            items = [next(ids) for _ in range(n)]
            task = asyncio.ensure_future(
                call(
                    items,
                    bulk=n > 1 or rng.random() < 0.1,
                    timeout=rng.choice([None, None, None, 0.03, 0.3]),
                    priority=rng.choice([0, 0, 0, 1, -1]),
                )
            )
            tasks.append(task)
            if rng.random() < 0.1:
                await asyncio.sleep(rng.choice([0.0, 0.004, 0.04]))
                task.cancel()
            await asyncio.wait({task})
            await asyncio.sleep(rng.choice([0.0, 0.0005, 0.002, 0.05]))

    async def independent() -> None:
        while not stopping:
            items = [next(ids)]
            tasks.append(asyncio.ensure_future(call(items, bulk=False, timeout=None, priority=0)))
            await asyncio.sleep(rng.expovariate(50.0))
            check()

    async def meddler() -> None:
        while not stopping:
            await asyncio.sleep(rng.choice([0.01, 0.05, 0.2]))
            check()
            setting = rng.choice(["hold", "queue_time", "concurrency", "room"])
            if setting == "hold":
                b.max_hold_time = rng.choice([0.0, 0.01, 0.05, 0.3])
            elif setting == "queue_time":
                b.max_queue_time = rng.choice([0.0, 0.01, 0.1])
            elif setting == "concurrency":
                b.concurrency = rng.choice([1, 2, None])
            else:
                b.max_queue_size = rng.choice([None, 3, 10])

    clients = [asyncio.ensure_future(client(c)) for c in range(rng.randint(1, 12))]
    others = [asyncio.ensure_future(independent()) for _ in range(rng.randint(0, 1))]
    others.append(asyncio.ensure_future(meddler()))
    await asyncio.sleep(rng.choice([0.05, 0.3, 1.0]))
    kind = rng.choice(["drain", "force", "timeout"])
    stopping = True
    if kind == "drain":
        await asyncio.wait_for(b.stop(), 60)
    elif kind == "force":
        await asyncio.wait_for(b.stop(force=True), 60)
    else:
        await asyncio.wait_for(b.stop(timeout=0.05), 60)
    await asyncio.wait_for(asyncio.gather(*clients, *others), 60)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    assert not await b.is_running() and testing.idle(b) == []
    assert len(b.sent) == len(set(b.sent)), "an item was sent twice"
    assert len(outcomes) == started, "a call resolved more or less than once"
    for items, outcome in outcomes:
        if isinstance(outcome, list):
            assert outcome == [x * 2 for x in items]
        else:
            assert outcome in (BatcherStoppedError, TimeoutError, asyncio.CancelledError, QueueFullException), outcome
    s = b.stats
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out


# ---------------------------------------------------------------------- what the statistics count


@both_paths
@pytest.mark.parametrize(
    "ending",
    [
        "sent",
        "withdrawn",
        "cancelled",
        "hold-layer-set-to-0",
        # max_hold_time=0 set live on a policy built from the keywords removes the ClosedLoopHold layer: told it is
        # replaced, it counts the batch it kept an item back for.
        "hold-set-to-0",
    ],
)
async def test_a_batch_counts_as_held_only_if_an_item_the_hold_kept_back_is_in_it(
    cls: type[Recording], ending: str
) -> None:
    # Four callers answered at 0.1: a probe holds the slot for them until 0.15. One caller comes at 0.1 and is kept
    # back. Sent: it goes at 0.15, in a batch the hold kept back (held, a probe); so does it when max_hold_time
    # is set to 0 at 0.12 (the hold ends then), on the hold layer of a policy given as policy= (it stays, at 0) or
    # on a policy built from the keywords (the layer goes). Withdrawn (its timeout) or cancelled at 0.12: nothing
    # the hold kept back is left, and the batch of a lone caller at 1.0 went at once: not held.
    loop = asyncio.get_running_loop()
    if ending == "hold-layer-set-to-0":
        b = cls(policy=ClosedLoopHold(0.05, Deadline(0)), delay=0.1)
    else:
        b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    if ending == "sent":
        assert await b.process(7) == 14
        assert b.started_at[-1] == pytest.approx(0.15)
    elif ending in ("hold-set-to-0", "hold-layer-set-to-0"):  # it was kept back until the hold ended, at 0.12: held
        call = asyncio.ensure_future(b.process(7))
        await asyncio.sleep(0.02)
        assert held(b)
        b.max_hold_time = 0
        assert await call == 14
        assert b.started_at[-1] == pytest.approx(0.12)
    else:
        call = asyncio.ensure_future(b.process(7, timeout=0.02 if ending == "withdrawn" else None))
        await asyncio.sleep(0)
        assert held(b)  # kept back
        if ending == "cancelled":
            await asyncio.sleep(0.02)
            call.cancel()
        with pytest.raises(TimeoutError if ending == "withdrawn" else asyncio.CancelledError):
            await call
        await asyncio.sleep(1.0 - loop.time())
        assert await b.process(8) == 16
        assert b.started_at[-1] == pytest.approx(1.0)
    stats = b.stats
    assert (stats.batches, stats.held, stats.probes) == (
        (2, 0, 0) if ending in ("withdrawn", "cancelled") else (2, 1, 1)
    )
    clean(b)
    await b.stop()


async def test_a_hold_that_began_after_one_that_kept_items_back_counts_only_its_own() -> None:
    # Two slots. A batch of four ends at 0.1: a probe holds for them until 0.15, and keeps back an item that
    # arrives at 0.1 and is withdrawn at 0.12. A batch of the other slot (started at 0.05 with one item) ends at
    # 0.15: a new hold begins (for one caller: not a probe, and the gate is off: it keeps nothing back). Items that
    # arrive then go at once: not held.
    b = Recording(max_queue_time=0, max_hold_time=0.05, delay=0.1, concurrency=2)
    loop = asyncio.get_running_loop()
    first = asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(b.process(10))
    await first
    kept = asyncio.ensure_future(b.process(7, timeout=0.02))
    await asyncio.sleep(0)
    assert held(b)
    with pytest.raises(TimeoutError):
        await kept
    assert await second == 20
    assert loop.time() == pytest.approx(0.15)
    assert await b.process(8) == 16
    assert b.started_at[-1] == pytest.approx(0.15)
    assert (b.stats.held, b.stats.probes) == (0, 0)
    clean(b)
    await b.stop()


# ---------------------------------------------------------------------- the hold's quiet end


EPS = 1e-9


async def settle_stepwise(b: Any, within: float = 60.0) -> None:
    """Let the clock run (in steps of 1 ms) until nothing is queued, in flight or about to pump; bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not quiet(b):
        assert loop.time() < deadline, "never settled"
        await asyncio.sleep(0.001)


class Marked(Recording):
    """Two durations: a batch with item 100 in it takes ``marked`` seconds, any other ``delay``."""

    def __init__(self, *, marked: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marked, self.usual = marked, self.delay

    async def process_batch(self, batch: list[int]) -> Any:
        self.delay = self.marked if 100 in batch else self.usual  # (read before the batch's first await)
        return await super().process_batch(batch)


@both_paths
async def test_zero_time_batches_never_hold(cls: type[Recording]) -> None:
    # delay=0: the batch took no time, so the quiet gap is 0: nobody ever waits (no spin, no hang, no timer left).
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0)
    lat: list[float] = []

    async def client(c: int) -> None:
        for r in range(20):
            sent = loop.time()
            await b.process(c * 100 + r)
            lat.append(loop.time() - sent)
            await asyncio.sleep(0.001 * (c % 3))

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(6))), 10)
    assert max(lat) == 0.0, max(lat)
    await settle_stepwise(b)
    idle_without_timer(b)
    clean(b)
    await b.stop()


@both_paths
async def test_a_raising_zero_time_batch_with_waiting_items_does_not_hold(cls: type[Recording]) -> None:
    def answer(batch: list[int]) -> list[int]:
        if 0 in batch:
            raise RuntimeError("boom")
        return [x * 2 for x in batch]

    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=5.0, delay=0, answer=answer, max_batch_size=4)
    calls = [asyncio.ensure_future(b.process(i)) for i in range(9)]
    out = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    assert [isinstance(o, RuntimeError) for o in out] == [True] * 4 + [False] * 5
    assert loop.time() == 0.0
    await b.stop()


@both_paths
async def test_withdrawn_arrivals_extend_a_hold_only_up_to_max_hold_time(cls: type[Recording]) -> None:
    # 100 callers answered at 0.1 (0.1 s batch: quiet gap 0.05, max_hold_time 0.5). One caller back at 0.11, then
    # every 0.04 a caller arrives and times out 0.001 later (a withdrawn entry at the fifo tail). Those are
    # arrivals; the hold may last while they come, but never past 0.6.
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=0.5, delay=0.1)
    await asyncio.wait_for(asyncio.gather(*(b.process(i) for i in range(100))), 5)
    await asyncio.sleep(0.01)
    x = asyncio.ensure_future(b.process(7))
    await asyncio.sleep(0)
    assert held(b)
    flickers = []
    while loop.time() < 2.0:
        await asyncio.sleep(0.04)
        flickers.append(asyncio.ensure_future(b.process(1000, timeout=0.001)))
    assert x.done() and x.result() == 14
    res = await asyncio.wait_for(asyncio.gather(*flickers, return_exceptions=True), 5)
    assert all(isinstance(r, TimeoutError | int) for r in res)
    assert b.batches[1][0] == 7 and b.started_at[1] <= 0.6 + EPS, b.started_at[1]
    await settle_stepwise(b)
    idle_without_timer(b)
    clean(b)
    await b.stop()


async def test_newest_is_over_all_priority_levels() -> None:
    # Held for four; one back at 0.11 at priority 5, one at 0.14 at priority 0: the quiet gap runs from 0.14, the
    # two go together at 0.19 (not 0.16, by the older level's tail only; never past 0.19).
    b = Recording(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.01)
    low = asyncio.ensure_future(b.process(1, priority=5))
    await asyncio.sleep(0.03)
    high = asyncio.ensure_future(b.process(2, priority=0))
    assert list(await asyncio.wait_for(asyncio.gather(low, high), 5)) == [2, 4]
    assert b.batches[1] == [2, 1] and b.started_at[1] == pytest.approx(0.19)
    await b.stop()


async def test_a_callerless_batch_ending_during_a_hold_does_not_prolong_it() -> None:
    # Two slots. Batch C (item 100, 0.15 s) and batch A (four items, 0.1 s) both start at 0. C's caller leaves at
    # 0.05: C answers nobody. A ends at 0.1: a probe holds the free slot for its four (quiet gap 0.05). X arrives at
    # 0.11. C ends at 0.15, answering nobody. Rule: X goes once the lane had no arrival for half of A's time,
    # from max(A's end, 0.11) = 0.16. C neither adds callers nor is the batch the hold follows.
    b = Marked(marked=0.15, delay=0.1, max_queue_time=0, max_hold_time=1.0, concurrency=2)
    c = asyncio.ensure_future(b.process(100))
    await asyncio.sleep(0)
    a = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await asyncio.sleep(0.05)
    assert len(b.batches) == 2
    c.cancel()
    assert await asyncio.wait_for(asyncio.gather(*a), 5) == [0, 2, 4, 6]
    await asyncio.sleep(0.01)
    x = asyncio.ensure_future(b.process(9))
    await asyncio.sleep(0)
    assert held(b)
    assert await asyncio.wait_for(x, 5) == 18
    with pytest.raises(asyncio.CancelledError):
        await c
    assert b.started_at[2] <= 0.16 + EPS, f"X held until {b.started_at[2]} (quiet bound 0.16)"
    await b.stop()


@both_paths
async def test_max_hold_time_raised_during_a_hold_does_not_outlast_the_quiet_gap(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=0.05, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.01)
    x = asyncio.ensure_future(b.process(3))
    await asyncio.sleep(0)
    assert held(b)
    b.max_hold_time = 100.0
    assert await asyncio.wait_for(x, 5) == 6
    assert b.started_at[1] == pytest.approx(0.16)
    await b.stop()


@both_paths
async def test_max_batch_size_lowered_to_the_waiting_count_during_a_hold_sends_at_once(cls: type[Recording]) -> None:
    b = cls(max_queue_time=0, max_hold_time=5.0, delay=0.1)
    await asyncio.gather(*(b.process(i) for i in range(8)))
    await asyncio.sleep(0.01)
    xs = [asyncio.ensure_future(b.process(i)) for i in range(2)]
    await asyncio.sleep(0.001)
    assert held(b)
    b.max_batch_size = 2
    assert await asyncio.wait_for(asyncio.gather(*xs), 5) == [0, 2]
    assert b.started_at[1] == pytest.approx(0.111)
    await b.stop()


@both_paths
@pytest.mark.parametrize("how", ["drain", "force", "timeout"])
@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_a_stop_during_the_turns_then_a_restart(cls: type[Recording], how: str, turns: int) -> None:
    # A batch ends with items waiting: the next forms 4 turns later. The caller it answered stops the batcher
    # `turns` loop turns later (its continuation runs before the first turn); every caller resolves once; no timer;
    # then a restart serves at once, with no leftover hold or turn from the old run. (One first caller: no probe.)
    loop = asyncio.get_running_loop()
    b = cls(max_queue_time=0, max_hold_time=5.0, delay=0.1)
    seen: list[Any] = []

    async def first_then_stop() -> None:
        assert await b.process(0) == 0
        for _ in range(turns):
            await asyncio.sleep(0)
        seen.append((engine_of(b).dispatcher.pump_handle is not None, b.stats.queued, b.stats.in_flight))
        await stop_as(b, how, timeout=0.05)

    first = asyncio.ensure_future(first_then_stop())
    await asyncio.sleep(0)
    late = [asyncio.ensure_future(b.process(10 + i)) for i in range(2)]  # queued behind the running batch
    began = 0.1
    await asyncio.wait_for(first, 5)
    assert seen == [(True, 2, 0)], seen  # stopped during the turns
    out = await asyncio.wait_for(asyncio.gather(*late, return_exceptions=True), 5)
    if how == "drain":
        assert out == [20, 22] and loop.time() - began <= 0.1 + EPS
    elif how == "force":
        assert all(isinstance(o, BatcherStoppedError) for o in out), out
    else:
        assert all(isinstance(o, int | BatcherStoppedError) for o in out), out
    assert not await b.is_running() and testing.idle(b) == []
    s = b.stats
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out
    b.start()
    sent = loop.time()
    assert await asyncio.wait_for(b.process(5), 5) == 10
    assert loop.time() - sent == pytest.approx(0.1)
    await settle_stepwise(b)
    idle_without_timer(b)
    await b.stop()


async def test_process_many_spanning_batches_during_a_hold_is_bounded() -> None:
    # Held for four (quiet 0.05, hold 1.0): a process_many of 10 arrives at 0.11 with max_batch_size 4: the full
    # batches go at once; the last 2 may be held by the quiet gap, at most until 0.11 + 0.05 after the batch
    # before... but never past hold end, and all of it resolves.
    b = Recording(max_queue_time=0, max_hold_time=1.0, delay=0.1, max_batch_size=4)
    await asyncio.gather(*(b.process(i) for i in range(4)))
    await asyncio.sleep(0.01)
    res = await asyncio.wait_for(b.process_many(range(10)), 5)
    assert res == [2 * i for i in range(10)]
    assert [len(x) for x in b.batches[1:]] == [4, 4, 2]
    assert b.started_at[1] == pytest.approx(0.11)
    for end, start in zip([s + 0.1 for s in b.started_at[1:]], b.started_at[2:], strict=False):
        assert start <= end + 0.05 + EPS, b.started_at
    await settle_stepwise(b)
    idle_without_timer(b)
    await b.stop()


class Varied(Recording):
    """Each batch takes a duration drawn by ``rng`` (0 included); an item that 97 divides makes its batch raise;
    keys by ``item % keys``; records each batch's span (start, end, key, items) in ``spans``."""

    rng: random.Random
    keys: int
    spans: list[tuple[float, float, int, list[int]]]

    def batch_key(self, item: int) -> int:
        return item % self.keys

    async def process_batch(self, batch: list[int]) -> Any:
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.batches.append(list(batch))
        self.started_at.append(start)
        try:
            await asyncio.sleep(self.rng.choice([0.0, 0.0, 0.003, 0.02, 0.1, 0.3]))
            if any(v % 97 == 0 for v in batch):
                raise RuntimeError("bad batch")
            return [v * 2 for v in batch]
        finally:
            self.spans.append((start, loop.time(), batch[0] % self.keys, list(batch)))


@pytest.mark.parametrize("seed", range(40))
async def test_random_holds_stay_within_both_bounds(seed: int) -> None:
    # One slot, one key, max_queue_time 0: a free slot with items waiting idles only for a hold. For each batch,
    # starting at s after the previous batch's end e (that batch ran r): s <= max(e + max_hold_time, the oldest
    # arrival in it) and s <= max(e, the latest arrival before s) + quiet * r (ClosedLoopHold.quiet, a half).
    # Random durations (0 included), batches that raise, process_many, timeouts, priorities, max_hold_time and
    # max_batch_size; then idle.
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    rng = random.Random(seed)
    hold = rng.choice([0.01, 0.05, 0.2, 1.0])
    b = Varied(max_queue_time=0, max_hold_time=hold, max_batch_size=rng.choice([3, 8, None]))
    b.rng, b.keys, b.spans = rng, 1, []
    hold_layer = hold_of(b)
    assert hold_layer is not None
    quiet_share = hold_layer.quiet  # (of the time the batch a hold follows took)
    arrivals: list[float] = []
    item_arrival: dict[int, float] = {}
    outcomes: list[Any] = []
    counter = iter(range(1, 10**6))

    async def client(c: int) -> None:
        for _ in range(rng.randint(5, 25)):
            kind = rng.random()
            n = next(counter)
            arrivals.append(loop.time())
            try:
                if kind < 0.15:
                    items = [next(counter) for _ in range(rng.randint(1, 6))]
                    for it in items:
                        item_arrival[it] = loop.time()
                    outcomes.append(await b.process_many(items, return_exceptions=True))
                elif kind < 0.3:
                    item_arrival[n] = loop.time()
                    outcomes.append(await b.process(n, timeout=rng.choice([0.001, 0.01, 0.05])))
                else:
                    item_arrival[n] = loop.time()
                    outcomes.append(await b.process(n, priority=rng.choice([0, 0, 1])))
            except (TimeoutError, RuntimeError) as exc:
                outcomes.append(exc)
            await asyncio.sleep(rng.choice([0.0, 0.0, 0.001, 0.004, 0.03, 0.2]))

    await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(rng.randint(2, 10)))), 600)
    await settle_stepwise(b)
    idle_without_timer(b)
    clean(b)
    jumps = loop.jumps
    await asyncio.sleep(50)
    assert loop.jumps == jumps + 1, "the idle batcher woke the loop"
    spans = sorted(b.spans)
    bad: list[tuple[Any, ...]] = []
    for (s0, e0, _, _), (s1, _, _, items) in itertools.pairwise(spans):
        r = e0 - s0
        oldest = min(item_arrival[v] for v in items)
        latest = max((a for a in arrivals if a <= s1), default=-1.0)
        if s1 > max(e0 + hold, oldest) + EPS:
            bad.append(("max_hold_time", e0, s1, hold))
        if s1 > max(e0, latest) + quiet_share * r + EPS and s1 > oldest + EPS:
            bad.append(("quiet", e0, r, latest, s1))
    assert not bad, bad[:5]
    s = b.stats
    assert s.submitted == s.succeeded + s.failed + s.cancelled + s.timed_out
    await b.stop()


async def test_a_short_batch_ending_during_a_hold_does_not_cut_the_gap_for_the_long_batchs_callers() -> None:
    # Two slots. A (four items, 0.2 s) from 0 to 0.2: a probe holds for its four (gap 0.1). B (one item, 0.002 s)
    # starts at 0.199 and ends at 0.201, during the hold: it adds its caller. A's four come back 0.01 apart from
    # 0.21, well within A's gap: expected together, one batch. (The gap is taken from B's 0.002 s instead.)
    loop = asyncio.get_running_loop()
    b = Marked(marked=0.002, delay=0.2, max_queue_time=0, max_hold_time=1.0, concurrency=2)
    a = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await asyncio.sleep(0.199)
    bb = asyncio.ensure_future(b.process(100))
    assert await asyncio.wait_for(asyncio.gather(*a, bb), 5) == [0, 2, 4, 6, 200]
    back = []
    for i in range(4):
        await asyncio.sleep(max(0.0, 0.21 + 0.01 * i - loop.time()))
        back.append(asyncio.ensure_future(b.process(i)))
    assert await asyncio.wait_for(asyncio.gather(*back), 5) == [0, 2, 4, 6]
    assert [len(x) for x in b.batches[2:]] == [4], (b.batches, b.started_at)
    await b.stop()


class KeyedMarked(Marked, Keyed):
    """:class:`Marked` on the keyed path."""


@pytest.mark.parametrize("cls", [Marked, KeyedMarked], ids=["plain", "keyed"])
async def test_a_batch_of_the_lane_that_ends_during_a_hold_adds_its_callers_to_it(cls: type[Marked]) -> None:
    # Two slots. A (four items, 0.1 s) from 0 to 0.1: a probe holds the free slot for its four. B (four items, item
    # 100 in it: 0.12 s), of the same lane, ends at 0.12, during the hold: the hold waits for B's four too. A's four
    # are back at 0.125, B's at 0.13, within the quiet gap (0.05 of A's 0.1 s): one batch of eight. (Were B's callers
    # not added, the hold would be over once A's four were back, and the eight would go in two batches of four.)
    loop = asyncio.get_running_loop()
    b = cls(marked=0.12, delay=0.1, max_queue_time=0, max_hold_time=1.0, concurrency=2)
    a = [asyncio.ensure_future(b.process(i)) for i in range(4)]
    await asyncio.sleep(0)
    bb = [asyncio.ensure_future(b.process(100 + i)) for i in range(4)]
    await asyncio.sleep(0.001)
    assert b.batches == [[0, 1, 2, 3], [100, 101, 102, 103]]
    assert await asyncio.wait_for(asyncio.gather(*a), 5) == [0, 2, 4, 6]
    assert held(b)

    async def back(items: range, at: float) -> list[int]:
        await asyncio.sleep(at - loop.time())
        return list(await asyncio.gather(*(b.process(i) for i in items)))

    assert await asyncio.wait_for(asyncio.gather(*bb), 5) == [200, 202, 204, 206]
    assert held(b)  # after B's end: still waiting, for A's four and B's four
    got = await asyncio.wait_for(asyncio.gather(back(range(4), 0.125), back(range(100, 104), 0.13)), 5)
    assert list(got) == [[0, 2, 4, 6], [200, 202, 204, 206]]
    assert [len(x) for x in b.batches[2:]] == [8] and b.started_at[2] == pytest.approx(0.13), b.batches
    await b.stop()
