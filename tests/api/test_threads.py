"""Callers from threads: ``process_sync`` into an app's loop, or into a loop thread the batcher starts itself."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from async_batcher import (
    BatcherStoppedError,
    batch,
)
from tests.api.test_decorator import Scaler
from tests.batchers import Recording, settled, until

# Every blocking call in these tests has a timeout, so that a broken batcher fails a test instead of hanging it.
WAIT = 30.0


def loop_threads(name: str) -> list[threading.Thread]:
    """The event-loop threads a batcher of this name started for blocking calls (they carry its name)."""
    return [t for t in threading.enumerate() if t.name == f"async-batcher:{name}"]


class ThreadRecording(Recording):
    """Records the thread its (async) ``process_batch`` ran on: the thread of the loop the batcher lives on."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threads: set[threading.Thread] = set()

    async def process_batch(self, batch: list[int]) -> Any:
        self.threads.add(threading.current_thread())
        return await super().process_batch(batch)


async def test_threads_calling_at_once_share_batches_on_the_apps_loop() -> None:
    b = ThreadRecording(max_batch_size=32, max_queue_time=60)
    b.start()  # bound to this (the app's) loop: the threads' items come here
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=32) as pool:
        calls = [loop.run_in_executor(pool, functools.partial(b.process_sync, i, timeout=WAIT)) for i in range(32)]
        results = await asyncio.gather(*calls)
    assert results == [2 * i for i in range(32)]
    assert b.stats.batches == 1 and sorted(b.batches[0]) == list(range(32))
    assert b.threads == {threading.current_thread()}
    assert not loop_threads(b.name)  # no loop thread of its own was needed
    await b.stop()


def test_a_program_without_an_event_loop_gets_a_loop_thread_that_stop_sync_ends() -> None:
    b = ThreadRecording(max_batch_size=32, max_queue_time=60, name="no-loop")
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(functools.partial(b.process_sync, timeout=WAIT), range(32)))
    assert results == [2 * i for i in range(32)]
    assert b.stats.batches == 1
    (thread,) = b.threads
    assert thread is not threading.main_thread() and thread.daemon and "no-loop" in thread.name
    assert thread.is_alive()

    b.stop_sync()
    assert not thread.is_alive()
    assert thread not in threading.enumerate()
    with pytest.raises(BatcherStoppedError):
        b.process_sync(1, timeout=WAIT)
    assert not loop_threads(b.name)  # refusing the item started nothing
    assert b.stats.rejected == 1

    b.start()  # with no running loop: marks it to start at the next use, on a new loop thread
    b.max_queue_time = 0
    assert b.process_many_sync([1, 2, 3], timeout=WAIT) == [2, 4, 6]
    (second,) = b.threads - {thread}
    b.stop_sync()
    assert not second.is_alive()


async def test_stop_from_another_loop_stops_the_batcher_on_its_loop_thread_and_ends_it() -> None:
    b = ThreadRecording(max_queue_time=0)
    loop = asyncio.get_running_loop()
    # Called from a worker thread, on a batcher bound to no loop: it starts a loop thread of its own.
    assert await loop.run_in_executor(None, functools.partial(b.process_sync, 4, timeout=WAIT)) == 8
    (thread,) = b.threads
    assert thread is not threading.current_thread() and thread.is_alive()
    await b.stop()
    assert not thread.is_alive()
    assert not await b.is_running()
    await b.stop()  # idempotent


async def test_stop_sync_from_a_worker_thread_stops_a_batcher_on_the_apps_loop() -> None:
    b = Recording(max_queue_time=0)
    assert await b.process(1) == 2
    await asyncio.get_running_loop().run_in_executor(None, b.stop_sync)
    assert not await b.is_running()
    with pytest.raises(BatcherStoppedError):
        await b.process(1)


async def test_a_blocking_call_on_an_event_loop_thread_is_refused() -> None:
    bound, unbound = Recording(), Recording()
    bound.start()
    for b in (bound, unbound):
        # With a timeout, a broken check fails the test (TimeoutError) instead of hanging it.
        with pytest.raises(RuntimeError, match="await"):
            b.process_sync(1, timeout=WAIT)
        with pytest.raises(RuntimeError, match="await"):
            b.process_many_sync([1], timeout=WAIT)
        with pytest.raises(RuntimeError, match="await"):
            b.stop_sync()
    assert not loop_threads(unbound.name)
    assert bound.stats.submitted == 0
    await bound.stop()


async def test_a_sync_timeout_withdraws_the_item() -> None:
    b = Recording(max_batch_size=2, max_queue_time=60)
    b.start()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        # The batch waits for a second item that only comes later: the call times out with its item queued.
        await loop.run_in_executor(None, functools.partial(b.process_sync, 1, timeout=0.01))
    await until(lambda: b.stats.queued == 0)
    assert await asyncio.gather(b.process(2), b.process(3)) == [4, 6]
    assert b.batches == [[2, 3]]  # the item whose caller left was never sent
    stats = b.stats
    assert stats.cancelled + stats.timed_out == 1
    await b.stop()


def test_results_and_errors_reach_the_calling_thread() -> None:
    b = Recording(max_queue_time=0, answer=lambda xs: [ValueError(f"bad {x}") if x == 2 else x for x in xs])
    results = b.process_many_sync([1, 2, 3], timeout=WAIT, return_exceptions=True)
    assert results[0] == 1 and results[2] == 3
    assert isinstance(results[1], ValueError)
    with pytest.raises(ValueError, match="bad 2"):
        b.process_sync(2, timeout=WAIT)
    with pytest.raises(ValueError, match="timeout"):
        b.process_sync(1, timeout=-1)
    b.stop_sync()


def test_a_decorated_sync_function_called_from_threads() -> None:
    calls: list[list[int]] = []

    @batch(max_batch_size=8, max_queue_time=60, name="squares")
    def square(xs: list[int]) -> list[int]:
        calls.append(list(xs))
        return [x * x for x in xs]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(functools.partial(square.sync, timeout=WAIT), range(8)))
    assert results == [i * i for i in range(8)]
    assert len(calls) == 1 and sorted(calls[0]) == list(range(8))
    assert square.process_many_sync(range(8), timeout=WAIT) == results
    (thread,) = loop_threads("squares")
    square.stop_sync()
    assert not thread.is_alive()


def test_a_method_called_from_a_thread_and_its_loop_thread_ends_with_the_instance() -> None:
    assert Scaler(3).offset.sync(2, timeout=WAIT) == 5  # a temporary instance lives through the call
    gc.collect()
    before = set(loop_threads("Scaler.offset"))
    s = Scaler(10)
    assert s.offset.sync(1, timeout=WAIT) == 11
    (thread,) = set(loop_threads("Scaler.offset")) - before
    assert thread.is_alive()
    del s
    gc.collect()  # the instance, then its batcher, are gone: the batcher's finalizer stops the thread
    thread.join(WAIT)
    assert not thread.is_alive()


def test_stopping_the_loop_thread_releases_the_threads_waiting_on_it() -> None:
    started = threading.Event()

    class Forever(Recording):
        async def process_batch(self, batch: list[int]) -> Any:
            started.set()
            await asyncio.Event().wait()  # never answers

    b = Forever(max_queue_time=0, name="forever")
    with ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(b.process_sync, 1)  # no timeout: only the stop can release it
        assert started.wait(WAIT)
        (thread,) = loop_threads("forever")
        b.stop_sync(timeout=0.05)  # the drain cannot finish: the timed-out stop fails the caller
        with pytest.raises(BatcherStoppedError):
            waiting.result(WAIT)
    assert not thread.is_alive()
    b.stop_sync()  # a no-op once stopped


# ---------------------------------------------------------------------- stops racing blocking calls


@pytest.mark.parametrize("trial", range(8))
def test_stop_sync_racing_the_first_blocking_calls_answers_every_thread(trial: int) -> None:
    b = Recording(max_queue_time=0.001, name=f"race-{trial}")
    start = threading.Barrier(31)
    outcomes: list[object] = []

    def call(i: int) -> None:
        start.wait()
        try:
            outcomes.append(b.process_sync(i, timeout=WAIT))
        except BatcherStoppedError as exc:
            outcomes.append(exc)
        except BaseException as exc:  # anything else is a defect: kept to be reported
            outcomes.append(("unexpected", exc))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    start.wait()
    b.stop_sync()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a thread was left blocked"
    assert len(outcomes) == 30
    assert all(isinstance(o, int | BatcherStoppedError) for o in outcomes), outcomes
    b.stop_sync()
    assert not [t for t in threading.enumerate() if t.name == f"async-batcher:race-{trial}"]


def test_a_blocking_call_into_a_loop_that_is_open_but_not_running_is_refused() -> None:
    b = Recording(max_queue_time=0)
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(b.process(1)) == 2  # bound to this loop, which then stops running
        with pytest.raises(RuntimeError, match="not running"):
            b.process_sync(2)  # no timeout: it must not wait forever
        loop.run_until_complete(b.stop())
    finally:
        loop.close()


def test_a_blocking_call_from_a_thread_pool_to_the_apps_loop_gets_its_answer() -> None:
    # The common deployment: an app's loop in one thread, sync code in a pool calling into it.
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            holder["loop"] = asyncio.get_running_loop()
            holder["b"] = b = Recording(max_batch_size=16, max_queue_time=0.01)
            b.start()
            holder["stop"] = stop = asyncio.Event()
            ready.set()
            await stop.wait()
            await b.stop()

        asyncio.run(main())

    server = threading.Thread(target=serve)
    server.start()
    assert ready.wait(WAIT)
    b = holder["b"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: b.process_sync(i, timeout=WAIT), range(16))) == [2 * i for i in range(16)]
    holder["loop"].call_soon_threadsafe(holder["stop"].set)
    server.join(WAIT)
    assert not server.is_alive() and settled(b)
