"""Settings as values: Limits, Streaming, the policy, the keywords that build it, and live changes of each."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from async_batcher import Limits, Streaming, testing
from async_batcher.policies import ClosedLoopHold, Deadline, LatencyBudget, PreferredSizes
from tests.batchers import Recording


def test_the_keywords_build_the_policy_layer_by_layer() -> None:
    assert repr(Recording().policy) == "Deadline(max_queue_time=0.01, turns=4, regather=True)"
    b = Recording(max_latency=0.05, preferred_batch_sizes=[8, 4], max_hold_time=0.002)
    hold = b.policy
    assert isinstance(hold, ClosedLoopHold) and hold.max_hold_time == 0.002
    assert isinstance(hold.inner, PreferredSizes) and hold.inner.sizes == (4, 8)
    assert isinstance(hold.inner.inner, LatencyBudget) and hold.inner.inner.max_latency == 0.05
    assert (b.max_latency, b.preferred_batch_sizes, b.max_hold_time) == (0.05, (4, 8), 0.002)


def test_a_group_and_one_of_its_fields_together_are_refused_naming_both() -> None:
    with pytest.raises(TypeError, match=r"pass limits= or max_batch_size=, not both"):
        Recording(limits=Limits(max_batch_size=4), max_batch_size=8)
    with pytest.raises(TypeError, match=r"pass policy= or max_queue_time=, max_hold_time=, not both"):
        Recording(policy=Deadline(0), max_queue_time=0, max_hold_time=1)
    with pytest.raises(TypeError, match=r"pass streaming= or stream_buffer=, not both"):
        Recording(streaming=Streaming(buffer=2), stream_buffer=4)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Limits(max_batch_size=0), "max_batch_size must be an int >= 1, or None for no limit; got 0"),
        (lambda: Limits(concurrency=2.5), "concurrency must be an int >= 1, or None for no limit; got 2.5"),
        (lambda: Limits(max_batch_weight=-1), "max_batch_weight must be None or a finite number > 0, got -1"),
        (lambda: Streaming(buffer=0), "stream_buffer must be an int >= 1; got 0"),
        (lambda: Deadline(-1), "max_queue_time must be a finite number of seconds >= 0, got -1"),
        (lambda: LatencyBudget(0), "max_latency must be a finite number of seconds > 0, got 0"),
        (lambda: PreferredSizes([]), "PreferredSizes needs at least one size"),
    ],
)
def test_bad_values_are_refused_naming_them(make: Any, named: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert str(info.value) == named


def test_a_keyword_set_live_changes_its_layer_in_place_and_a_layer_comes_and_goes() -> None:
    b = Recording(max_queue_time=0.5)
    deadline = b.policy
    b.max_queue_time = 0  # 0 is a value of its own, not "no layer"
    assert b.policy is deadline and b.max_queue_time == 0 and deadline.max_queue_time == 0
    b.max_hold_time = 0.5
    assert isinstance(b.policy, ClosedLoopHold) and b.policy.inner is deadline  # the wait kept as it was
    b.max_hold_time = 0
    assert b.policy is deadline
    b.max_latency = 0.1
    budget = b.policy
    assert isinstance(budget, LatencyBudget)
    assert b.max_queue_time == 0  # kept for when the Deadline comes back
    b.max_latency = None
    assert isinstance(b.policy, Deadline) and b.policy.max_queue_time == 0


def test_max_queue_time_with_max_latency_is_refused_at_construction_and_live() -> None:
    # The latency budget chooses the wait: max_queue_time given beside max_latency was silently dropped, and set live
    # it was kept for later, doing nothing.
    with pytest.raises(TypeError, match="pass max_queue_time= or max_latency=, not both") as info:
        Recording(max_queue_time=0, max_latency=0.05)
    assert str(info.value).startswith("Recording(): ")
    assert Recording(max_queue_time=0, max_latency=None).max_queue_time == 0  # None: no budget, nothing dropped
    b = Recording(max_latency=0.1)
    with pytest.raises(TypeError, match=r"max_queue_time=0\.3 does nothing while max_latency=0\.1 is set"):
        b.max_queue_time = 0.3
    assert b.max_queue_time == 0.01 and isinstance(b.policy, LatencyBudget)  # nothing changed
    b.max_latency = None
    b.max_queue_time = 0.3
    assert isinstance(b.policy, Deadline) and b.policy.max_queue_time == 0.3


def test_a_keyword_a_given_policy_has_no_layer_for_is_refused_and_nothing_changes() -> None:
    budget = LatencyBudget(0.05)
    b = Recording(policy=budget)
    with pytest.raises(TypeError, match=r"max_queue_time cannot be set on a batcher whose policy was given"):
        b.max_queue_time = 5
    assert b.max_queue_time == 0.01 and b.policy is budget
    with pytest.raises(TypeError, match=r"max_hold_time cannot be set"):
        b.max_hold_time = 1
    b.max_latency = 0.2  # its own layer: set in place
    assert budget.max_latency == 0.2 and b.policy is budget
    with pytest.raises(ValueError, match="max_latency"):
        b.max_latency = -1
    assert budget.max_latency == 0.2


def test_a_bad_value_set_live_leaves_every_setting_as_it_was() -> None:
    b = Recording(max_batch_size=8, preferred_batch_sizes=[4])
    before = repr(b.policy)
    with pytest.raises(ValueError, match=r"above max_batch_size=8"):
        b.preferred_batch_sizes = [4, 16]
    with pytest.raises(TypeError, match=r"iterable of ints"):
        b.preferred_batch_sizes = "ab"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"smaller than the preferred batch size 4"):
        b.max_batch_size = 2
    assert repr(b.policy) == before and b.max_batch_size == 8


def test_one_policy_serves_one_batcher() -> None:
    shared = Deadline(0)
    first = Recording(policy=shared)
    with pytest.raises(ValueError, match=r"already serves another batcher"):
        Recording(policy=shared)
    with pytest.raises(ValueError, match=r"already serves another batcher"):
        Recording(policy=ClosedLoopHold(0.1, shared))  # a layer of it too
    first.policy = Deadline(0)  # let go of it
    assert Recording(policy=shared).policy is shared
    del first
    gc.collect()


@pytest.mark.virtual_time
async def test_a_parameter_set_on_the_policy_itself_applies_at_once() -> None:
    # The deadline of the item waiting (10 s) is replaced by the new one (0.5 s) at once: the batcher looks again
    # when a built-in policy's parameter changes, not at its old timer.
    deadline = Deadline(10)
    b = Recording(policy=deadline)
    loop = asyncio.get_running_loop()
    call = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0.1)
    deadline.max_queue_time = 0.5
    assert await call == 2
    assert b.started_at == [pytest.approx(0.5)] and loop.time() < 1
    await b.stop()
    assert testing.idle(b) == []


def test_limits_and_streaming_are_values_set_whole_or_by_field() -> None:
    b = Recording()
    b.limits = Limits(max_batch_size=8, concurrency=None)
    assert (b.max_batch_size, b.concurrency, b.max_queue_size) == (8, None, None)
    b.max_queue_size = 3
    b.max_queue_size = None
    assert b.limits == Limits(max_batch_size=8, concurrency=None)
    b.streaming = Streaming(stall_timeout=None)
    assert (b.stream_buffer, b.stream_stall_timeout) == (16, None)
    with pytest.raises(TypeError, match=r"limits must be an async_batcher.Limits"):
        b.limits = {"max_batch_size": 8}  # type: ignore[assignment]
