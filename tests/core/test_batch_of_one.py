"""A batch of one takes short paths (forming, delivery, the executor's end): each answers as a larger batch does.

The short paths are written out for speed; these tests hold them to the general ones: the same result kinds reach a
lone caller as reach two callers sharing a batch, on both paths of ``process_batch`` (a coroutine, and a plain
``def`` in the batcher's own executor).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from async_batcher import AsyncBatcher, Retry, TransientError

# What process_batch answers for an item: by the item (each test's items choose their own result).
RESULTS: dict[int, Callable[[], Any]] = {
    1: lambda: "plain",
    2: lambda: ValueError("an exception element"),
    3: lambda: KeyboardInterrupt(),  # a BaseException that is not an Exception: a plain result, as for many
    4: lambda: Retry(),  # no retry policy: its caller gets the TransientError
    5: lambda: None,
}


class Async(AsyncBatcher[int, Any]):
    async def process_batch(self, batch: list[int]) -> list[Any]:
        return [RESULTS[x]() for x in batch]


class Sync(AsyncBatcher[int, Any]):
    def process_batch(self, batch: list[int]) -> list[Any]:  # type: ignore[override]
        return [RESULTS[x]() for x in batch]


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        yield executor


def _kind(outcome: Any) -> tuple[str, str]:
    """An outcome as its kind and type: ('result', type) or ('raised', type)."""
    if isinstance(outcome, tuple):
        return outcome
    return ("result", type(outcome).__name__)


async def _outcome(b: AsyncBatcher[int, Any], item: int) -> tuple[str, str]:
    try:
        return _kind(await b.process(item))
    except BaseException as exc:  # (KeyboardInterrupt is a result here, never raised)
        return ("raised", type(exc).__name__)


@pytest.mark.parametrize("path", ["async", "executor"])
@pytest.mark.parametrize("item", sorted(RESULTS))
async def test_a_lone_caller_gets_what_a_caller_sharing_its_batch_gets(
    path: str, item: int, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    b: AsyncBatcher[int, Any] = Async(max_queue_time=0) if path == "async" else Sync(max_queue_time=0, executor=pool)
    alone = await _outcome(b, item)
    shared = await asyncio.gather(_outcome(b, item), _outcome(b, 1))
    assert b.stats.batches == 2  # (a batch of one, then a batch of two)
    assert alone == shared[0]
    expected = {
        1: ("result", "str"),
        2: ("raised", "ValueError"),
        3: ("result", "KeyboardInterrupt"),
        4: ("raised", TransientError.__name__),
        5: ("result", "NoneType"),
    }[item]
    assert alone == expected
    await b.stop()
    assert b.stats.succeeded + b.stats.failed == 3


@pytest.mark.parametrize("path", ["async", "executor"])
async def test_a_lone_caller_who_left_before_its_batch_formed_is_not_sent(
    path: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    seen: list[list[int]] = []

    class SeenAsync(Async):
        async def process_batch(self, batch: list[int]) -> list[Any]:
            seen.append(list(batch))
            return await super().process_batch(batch)

    class SeenSync(Sync):
        def process_batch(self, batch: list[int]) -> list[Any]:  # type: ignore[override]
            seen.append(list(batch))
            return super().process_batch(batch)

    # max_batch_size=1: the lane is full, so the dispatcher forms the batch without looking at its head first (a
    # look that would drop the departed caller's item): forming itself must leave it out.
    options: dict[str, Any] = {"max_queue_time": 0, "max_batch_size": 1}
    b: AsyncBatcher[int, Any] = SeenSync(executor=pool, **options) if path == "executor" else SeenAsync(**options)
    call = asyncio.ensure_future(b.process(1))
    await asyncio.sleep(0)  # (queued, its batch not formed yet: the pump comes after this)
    call.cancel()  # (its future is cancelled now; its item is withdrawn only as its task runs, after the pump)
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await b.process(5) is None
    assert seen == [[5]]
    assert (b.stats.cancelled, b.stats.succeeded, b.stats.batches) == (1, 1, 1)
    await b.stop()
