"""The short paths stay short: the common case runs none of the machinery it does not need.

How fast the batcher is, ``benchmarks/overhead`` measures. These tests pin *which code runs*, so that a change that
sends the common case down the long path, calls a hook nobody overrode, or wakes the dispatcher for nothing fails
here, in every run, rather than in a benchmark run by hand. They count calls of the package's functions with a
profile hook; each test also counts something that must happen, so that a counter that sees nothing fails too.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import async_batcher
from tests.batchers import Recording

PACKAGE = str(Path(async_batcher.__file__).parent)
HOOKS = __file__  # the hooks overridden here are counted too
# Under mutmut (pyproject.toml) a function runs as x_<name>__mutmut_orig or x_<name>__mutmut_<n>, a method of class
# C as C.xǁCǁ<name>__mutmut_...: counted as <name>, or C.<name>.
MUTANT = re.compile(r"^(?:x_|(\w+)\.xǁ\w+ǁ)(.+)__mutmut_(?:orig|\d+)$")


def _unmangled(qualname: str) -> str:
    found = MUTANT.match(qualname)
    if found is None:
        return qualname
    cls, name = found.groups()
    return name if cls is None else f"{cls}.{name}"


NEVER_OVERRIDDEN = ("AsyncBatcher.batch_key", "AsyncBatcher.item_weight")


@contextmanager
def calls() -> Iterator[Counter[str]]:
    """Count the calls of the package's functions (and this module's hooks), by qualified name, made on this thread
    while inside."""
    counted: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and (frame.f_code.co_filename.startswith(PACKAGE) or frame.f_code.co_filename == HOOKS):
            counted[_unmangled(frame.f_code.co_qualname)] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield counted
    finally:
        sys.setprofile(previous)


class Keyed(Recording):
    def batch_key(self, item: int) -> int:
        return item // 100  # (one key for the items of these tests)


class Weighed(Recording):
    def item_weight(self, item: int) -> float:
        return 1.0  # (a weight limit needs the hook)


async def test_a_plain_batcher_takes_the_short_path_and_calls_no_hook_it_did_not_override() -> None:
    b = Recording(max_queue_time=0)
    b.start()
    with calls() as counted:
        assert await asyncio.gather(*(b.process(i) for i in range(20))) == [i * 2 for i in range(20)]
        assert await b.process_many(range(10)) == [i * 2 for i in range(10)]
    assert counted["AsyncBatcher.process"] >= 20 and counted["Admission.submit_many"] >= 1  # (the counter sees)
    assert counted["Admission.submit"] == 0  # process() never took the long path
    assert counted["Intake.key_and_weight"] == 0  # process_many() queued one entry, not an entry per item
    assert not [name for name in NEVER_OVERRIDDEN if counted[name]]
    await b.stop()


@pytest.mark.parametrize(
    ("make", "called", "never"),
    [
        (lambda: Keyed(max_queue_time=0), "Keyed.batch_key", "AsyncBatcher.item_weight"),
        (
            lambda: Weighed(max_queue_time=0, max_batch_weight=10),
            "Weighed.item_weight",
            "AsyncBatcher.batch_key",
        ),
    ],
    ids=["keyed", "weighted"],
)
async def test_of_the_two_hooks_only_the_one_in_use_is_called(make: Any, called: str, never: str) -> None:
    b = make()
    with calls() as counted:
        assert await asyncio.gather(*(b.process(i) for i in range(5))) == [i * 2 for i in range(5)]
        assert await b.process_many(range(5)) == [i * 2 for i in range(5)]
    assert (counted[called], counted[never]) == (10, 0), counted
    await b.stop()


@pytest.mark.virtual_time
@pytest.mark.parametrize("cls", [Recording, Keyed], ids=["plain", "keyed"])
async def test_arrivals_wake_the_dispatcher_only_when_a_batch_may_be_due(cls: type[Recording]) -> None:
    gate = asyncio.Event()
    b = cls(max_queue_time=1.0, max_batch_size=100, gate=gate)
    b.start()
    waiting = []
    with calls() as counted:
        for i in range(10):  # one at a time: the first wakes the dispatcher, which arms the timer for the rest
            waiting.append(asyncio.ensure_future(b.process(i)))
            await asyncio.sleep(0)
    assert counted["Dispatcher._scheduled_pump"] == 1 and counted["Timer.arm"] == 1
    await asyncio.sleep(1.5)  # (on the loop's virtual clock)
    assert b.batches == [list(range(10))]  # at 1.0, every item in one batch, held at the gate: no free slot
    with calls() as counted:
        for i in range(10, 15):
            waiting.append(asyncio.ensure_future(b.process(i)))
            await asyncio.sleep(0)
    assert (
        counted["AsyncBatcher.process"] >= 5 and counted["Dispatcher._scheduled_pump"] == 0
    )  # nothing may go: no wake-up
    gate.set()
    assert await asyncio.gather(*waiting) == [i * 2 for i in range(15)]
    await b.stop()


@pytest.mark.virtual_time
@pytest.mark.parametrize("cls", [Recording, Keyed], ids=["plain", "keyed"])
async def test_during_a_hold_only_the_caller_that_completes_the_batch_wakes_the_dispatcher(
    cls: type[Recording],
) -> None:
    b = cls(max_queue_time=0, max_hold_time=1.0, delay=0.1)
    assert await asyncio.gather(*(b.process(c) for c in range(4))) == [0, 2, 4, 6]  # one batch, answered at 0.1
    await asyncio.sleep(0.001)  # (on the loop's virtual clock)
    back = []
    with calls() as counted:
        for c in range(4):  # the four come back one by one
            back.append(asyncio.ensure_future(b.process(c)))
            await asyncio.sleep(0.01)
    # The first back wakes it (to hold the slot for the three others, with a timer); then only the fourth.
    assert counted["AsyncBatcher.process"] >= 4 and counted["Dispatcher._scheduled_pump"] == 2
    assert await asyncio.gather(*back) == [0, 2, 4, 6] and [len(x) for x in b.batches] == [4, 4]
    await b.stop()


@pytest.mark.virtual_time
async def test_a_pump_that_takes_the_last_free_slot_arms_no_timer() -> None:
    # One slot; key 0 has two full batches, key 1 one item due at 1.0. Each time the dispatcher sends a batch of
    # key 0's, no slot is left: key 1's deadline needs no timer yet, since the end of that batch looks again.
    b = Keyed(max_queue_time=1.0, max_batch_size=2, concurrency=1, delay=0.1)
    b.start()
    with calls() as counted:
        waiting = [asyncio.ensure_future(b.process(x)) for x in (0, 1, 100, 2, 3)]
        assert await asyncio.gather(*waiting) == [0, 2, 200, 4, 6]
    assert b.batches == [[0, 1], [2, 3], [100]] and b.started_at == [0.0, 0.1, 1.0]
    assert counted["Timer.arm"] == 1 and counted["Timer._fire"] == 1  # armed at 0.2, as the slot came free
    await b.stop()


async def test_calls_with_timeouts_share_one_loop_timer() -> None:
    b = Recording(max_queue_time=0, default_timeout=5.0)
    b.start()
    for _ in range(2):
        with calls() as counted:
            assert await asyncio.gather(*(b.process(i) for i in range(100))) == [i * 2 for i in range(100)]
        assert counted["Deadlines.add"] == 100  # (the counter sees)
        # One timer for the hundred calls (their deadlines never come earlier than the first's), not one each; it
        # is cancelled once they have all ended, so the next hundred arm it afresh.
        assert counted["Deadlines._arm"] == 1
    await b.stop()


async def test_the_short_path_keeps_each_callers_context_with_one_c_call_and_no_python_call() -> None:
    # Contract point 13: each item keeps its caller's context (current_batch().contexts), a snapshot taken on
    # process()'s short path (Engine.put) by contextvars.copy_context(), a C call: no Python function runs for it.
    b = Recording(max_queue_time=0)
    b.start()
    copies: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and arg is contextvars.copy_context and frame.f_code.co_filename.startswith(PACKAGE):
            copies[_unmangled(frame.f_code.co_qualname)] += 1

    with calls() as counted:
        assert await asyncio.gather(*(b.process(i) for i in range(20))) == [i * 2 for i in range(20)]
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        assert await asyncio.gather(*(b.process(i) for i in range(20))) == [i * 2 for i in range(20)]
    finally:
        sys.setprofile(previous)
    assert copies == {"Engine.put": 20}  # one snapshot per item, where it is queued
    assert counted["AsyncBatcher.process"] >= 20 and counted["Admission.submit"] == 0
    ours = [name for name in counted if not name.startswith("test_")]
    assert not [name for name in ours if "context" in name.lower()]  # (no Python function of ours for it)
    await b.stop()
