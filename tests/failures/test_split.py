"""Splitting on out-of-memory and learning the safe size (issue 45, part 4): ``split_on=``."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import pytest

from async_batcher import AsyncBatcher, batch
from async_batcher.failures import Isolate, RetryPolicy, SplitOn, out_of_memory
from tests.batchers import idle_and_clean

pytestmark = pytest.mark.virtual_time


class Limited(AsyncBatcher[int, int]):
    """Doubles its items; a call of more than ``limit`` items (of more weight, with weights) raises ``MemoryError``."""

    def __init__(self, limit: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limit = limit
        self.sizes: list[int] = []
        self.failed: list[int] = []

    def load(self, batch: list[int]) -> float:
        return len(batch)

    async def process_batch(self, batch: list[int]) -> list[int]:
        self.sizes.append(len(batch))
        if self.load(batch) > self.limit:
            self.failed.append(len(batch))
            raise MemoryError(f"{len(batch)} items do not fit")
        return [x * 2 for x in batch]


async def burst(b: AsyncBatcher[int, Any], n: int, start: int = 0) -> list[Any]:
    items = list(range(start, start + n))
    return await asyncio.gather(*(b.process(x) for x in items), return_exceptions=True)


async def test_a_batch_out_of_memory_is_split_and_every_item_answered() -> None:
    b = Limited(5, max_batch_size=32, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    assert await burst(b, 32) == [2 * x for x in range(32)]
    assert max(size for size in b.sizes if size not in b.failed) <= 5
    s = b.stats
    assert s.splits == len(b.failed) and s.failed == 0
    assert s.ceilings == {None: 4.0}  # 32 -> 16 -> 8 -> 4: the largest part that succeeded
    # The next batches take no more than the ceiling: no call fails any more.
    failures = len(b.failed)
    assert await burst(b, 32) == [2 * x for x in range(32)]
    assert len(b.failed) == failures
    await b.stop()
    idle_and_clean(b)


async def test_a_lane_at_its_ceiling_is_full_and_goes_at_once() -> None:
    b = Limited(5, max_batch_size=32, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    await burst(b, 32)
    assert b.stats.ceilings == {None: 4.0}
    loop = asyncio.get_running_loop()
    sent = loop.time()
    assert await burst(b, 4, start=100) == [2 * x for x in range(100, 104)]
    assert loop.time() - sent < 1.0  # 4 items fill a batch at the ceiling: not held for max_queue_time
    await b.stop()
    idle_and_clean(b)


async def test_the_ceiling_recovers_after_a_spike() -> None:
    b = Limited(4, max_batch_size=32, max_queue_time=1.0, split_on=SplitOn(MemoryError, grow_after=2, grow_by=4))
    await burst(b, 32)
    assert b.stats.ceilings == {None: 4.0}
    b.limit = 1000  # the spike is over
    calls = len(b.sizes)
    rounds = 0
    while b.stats.ceilings:
        await burst(b, 64)
        rounds += 1
        assert rounds < 50
    # From 4 up to 32 by 4 every 2 full calls: 14 calls at the ceiling, then lifted.
    assert len(b.sizes) - calls >= 14
    assert (await burst(b, 32)) == [2 * x for x in range(32)]
    assert b.sizes[-1] == 32
    await b.stop()


async def test_a_threshold_that_moves_during_the_run_is_followed() -> None:
    b = Limited(16, max_batch_size=32, max_queue_time=1.0, split_on=SplitOn(MemoryError, grow_after=1))
    for limit in (16, 3, 9, 30, 2, 32):
        b.limit = limit
        for _ in range(3):
            assert await burst(b, 32) == [2 * x for x in range(32)]
    await b.stop()
    idle_and_clean(b)


async def test_a_single_item_that_does_not_fit_fails_alone() -> None:
    class Heavy(Limited):
        def load(self, batch: list[int]) -> float:
            return sum(100 if x == 7 else 1 for x in batch)

    b = Heavy(8, max_batch_size=16, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    results = await burst(b, 16)
    assert isinstance(results[7], MemoryError)
    assert [r for x, r in enumerate(results) if x != 7] == [2 * x for x in range(16) if x != 7]
    # The item too big on its own did not drag the ceiling down to one.
    assert b.stats.ceilings[None] >= 4
    await b.stop()
    idle_and_clean(b)


async def test_with_weights_the_ceiling_is_a_weight() -> None:
    class Weighted(Limited):
        def item_weight(self, item: int) -> float:
            return 10.0

        def load(self, batch: list[int]) -> float:
            return 10.0 * len(batch)

    b = Weighted(45, max_batch_weight=160, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    assert await burst(b, 16) == [2 * x for x in range(16)]
    assert b.stats.ceilings == {None: 40.0}
    # The next batches weigh no more than the ceiling (4 items of 10): no call fails any more.
    failures, calls = len(b.failed), len(b.sizes)
    assert await burst(b, 16) == [2 * x for x in range(16)]
    assert len(b.failed) == failures and max(b.sizes[calls:]) == 4
    await b.stop()
    idle_and_clean(b)


async def test_each_key_has_its_own_ceiling() -> None:
    class Keyed(Limited):
        def batch_key(self, item: int) -> Hashable:
            return "long" if item >= 100 else "short"

        def load(self, batch: list[int]) -> float:
            return len(batch) * (4 if batch[0] >= 100 else 1)

    b = Keyed(16, max_batch_size=16, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    assert await burst(b, 16) == [2 * x for x in range(16)]
    assert await burst(b, 16, start=100) == [2 * x for x in range(100, 116)]
    assert b.stats.ceilings == {"long": 4.0}
    await b.stop()


async def test_a_ceiling_is_kept_when_more_keys_come_and_go_than_idle_lanes_are_kept() -> None:
    # 17 keys in turn, three rounds: more than the 16 idle lanes kept for their history. Each key runs out of memory
    # once, and its ceiling holds in the later rounds (51 splits when it went with its lane).
    class Keyed(Limited):
        def batch_key(self, item: int) -> Hashable:
            return item // 100

    b = Keyed(2, max_batch_size=4, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    for _ in range(3):
        for key in range(17):
            assert await burst(b, 4, start=100 * key) == [2 * x for x in range(100 * key, 100 * key + 4)]
    s = b.stats
    assert s.splits == 17 and len(b.failed) == 17
    assert s.ceilings == dict.fromkeys(range(17), 2.0)
    b.split_on = None  # off: no ceiling is kept, of a lane or of a key let go
    assert b.stats.ceilings == {}
    b.split_on = SplitOn(MemoryError)
    assert await burst(b, 4) == [0, 2, 4, 6]
    assert b.stats.splits == 18
    await b.stop()
    idle_and_clean(b)


async def test_the_ceilings_of_keys_let_go_are_bounded_the_key_idle_longest_forgotten_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(SplitOn, "keys_kept", 3)

    class Keyed(Limited):
        def batch_key(self, item: int) -> Hashable:
            return item // 100

    b = Keyed(2, max_batch_size=4, max_queue_time=1.0, split_on=SplitOn(MemoryError))
    for key in range(20):
        await burst(b, 4, start=100 * key)
    # The 16 idle lanes kept (keys 4 to 19) have theirs; of the four keys let go, the three let go last.
    assert sorted(b.stats.ceilings) == list(range(1, 20))
    await b.stop()


async def test_out_of_memory_is_never_bisected_nor_retried_as_a_bad_item() -> None:
    b = Limited(1, max_batch_size=4, max_queue_time=1.0, split_on=SplitOn(MemoryError), on_batch_error=Isolate())
    assert await burst(b, 4) == [0, 2, 4, 6]
    assert b.stats.isolated == 0
    await b.stop()


async def test_split_on_takes_the_errors_directly() -> None:
    b = Limited(2, max_batch_size=4, max_queue_time=1.0, split_on=(MemoryError,))
    assert isinstance(b.split_on, SplitOn)
    assert await burst(b, 4) == [0, 2, 4, 6]
    b.split_on = None
    assert b.split_on is None
    await b.stop()


async def test_a_batch_function_is_split_too() -> None:
    sizes: list[int] = []

    @batch(max_batch_size=8, max_queue_time=1.0, split_on=out_of_memory)
    def embed(items: list[int]) -> list[int]:
        sizes.append(len(items))
        if len(items) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return items

    assert await asyncio.gather(*(embed(x) for x in range(8))) == list(range(8))
    assert sizes[:3] == [8, 4, 2]
    await embed.stop()


def test_the_settings_are_checked() -> None:
    with pytest.raises(TypeError, match="split_on"):
        Limited(1, split_on="MemoryError")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an exception class"):
        SplitOn(int)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grow_after"):
        SplitOn(grow_after=0)


def test_a_streaming_batcher_refuses_the_failure_keywords() -> None:
    class Streams(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> Any:  # type: ignore[override]
            yield batch

    with pytest.raises(TypeError, match="streaming"):
        Streams(split_on=MemoryError)


@pytest.mark.parametrize(
    ("name", "value"), [("retry", RetryPolicy()), ("on_batch_error", Isolate()), ("split_on", MemoryError)]
)
async def test_a_streaming_batcher_refuses_the_failure_settings_set_live(name: str, value: Any) -> None:
    class Streams(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> Any:  # type: ignore[override]
            yield [x * 2 for x in batch]

    b = Streams(max_queue_time=0)
    assert [part async for part in b.stream(1)] == [2]
    with pytest.raises(TypeError, match=rf"Streams: {name}= is for a process_batch that returns its results; a stream"):
        setattr(b, name, value)
    assert getattr(b, name) is None  # the old value stays
    setattr(b, name, None)  # (off is fine)
    await b.stop()
