"""The scaling guide's shared batcher: the processes of a pool share one batch.

(tests/shared/test_docs_snippet.py runs it whole.)
"""

import asyncio
import multiprocessing
import os

from async_batcher import AsyncBatcher
from async_batcher.shared import SharedBatcher


class Doubler(AsyncBatcher[int, int]):  # stands for a model
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [2 * x for x in batch]


def make_doubler() -> Doubler:
    # Called in the process that owns the batcher, only: the model loads there.
    return Doubler(max_batch_size=64, max_queue_time=0.005)


# Every process makes one at import: cheap, no I/O.
doubler = SharedBatcher(make_doubler, name="doubler")


async def work(first: int) -> list[int]:
    # The first process to start owns the batcher; the others send it their items.
    async with doubler:
        print(os.getpid(), doubler.role)
        calls = [doubler.process(x) for x in range(first, first + 3)]
        return list(await asyncio.gather(*calls))


def worker(first: int) -> list[int]:
    return asyncio.run(work(first))


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        print(pool.map(worker, [0, 10, 20]))  # [[0, 2, 4], [20, 22, 24], [40, 42, 44]]
