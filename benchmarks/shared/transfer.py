"""numpy arrays as items: pickle 5 out of band over the socket against shared memory."""

from __future__ import annotations

import multiprocessing
import statistics
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from async_batcher import AsyncBatcher
from async_batcher.shared import SharedBatcher
from benchmarks.shared.common import run


class Reader(AsyncBatcher[Any, Any]):
    """Touches each array (its sum: the model reads every byte) and answers a float. An item that is a tuple
    ``(name, shape, dtype)`` is an array in shared memory: attached, read in place, closed."""

    async def process_batch(self, batch: list[Any]) -> list[float]:
        out = []
        for item in batch:
            if isinstance(item, tuple):
                name, shape, dtype = item
                block = _attach(name)
                array: Any = np.ndarray(shape, dtype=dtype, buffer=block.buf)
                out.append(float(array.sum()))
                del array
                block.close()
            else:
                out.append(float(item.sum()))
        return out


def _attach(name: str) -> shared_memory.SharedMemory:
    # (Both processes were spawned by this one and share its resource tracker: the owner's registration of the
    # block is the client's, which its unlink() removes.)
    return shared_memory.SharedMemory(name=name)


def reader() -> Reader:
    return Reader(max_batch_size=1, max_queue_time=0)


def owner_main(address: str, loop: str, ready: Any, done: Any) -> None:
    async def main() -> None:
        import asyncio

        async with SharedBatcher(reader, address=address, role="owner", name="reader", max_message_size=2**31):
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, done.wait)

    run(main(), loop)


def client_main(address: str, loop: str, sizes: list[int], repeat: int, out: Any) -> None:
    async def main() -> None:
        results = {}
        async with SharedBatcher(
            reader, address=address, role="client", name="reader", max_message_size=2**31
        ) as shared:
            for size in sizes:
                array = np.ones(size // 8, dtype=np.float64)
                pickled, shm = [], []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    await shared.process(array)
                    pickled.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    block = shared_memory.SharedMemory(create=True, size=array.nbytes)
                    np.ndarray(array.shape, dtype=array.dtype, buffer=block.buf)[:] = array
                    await shared.process((block.name, array.shape, array.dtype.str))
                    block.close()
                    block.unlink()
                    shm.append(time.perf_counter() - t0)
                results[size] = (statistics.median(pickled), statistics.median(shm))
        out.put(results)

    run(main(), loop)


def measure(address: str, loop: str, sizes: list[int], repeat: int) -> dict[int, tuple[float, float]]:
    """Per size in bytes: the median round trip (seconds) with pickle out of band, and with shared memory."""
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    out: Any = ctx.Queue()
    owner = ctx.Process(target=owner_main, args=(address, loop, ready, done))
    owner.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the owner did not start")
        client = ctx.Process(target=client_main, args=(address, loop, sizes, repeat, out))
        client.start()
        results: dict[int, tuple[float, float]] = out.get(timeout=600)
        client.join(30)
    finally:
        done.set()
        owner.join(30)
        if owner.is_alive():
            owner.kill()
    return results
