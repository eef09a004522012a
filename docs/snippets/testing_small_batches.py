"""Why are my batches small? Replay the traffic on a virtual clock and ask.

python docs/snippets/testing_small_batches.py (a second of traffic, in no time)
"""

import asyncio
from collections import Counter

from async_batcher import AsyncBatcher
from async_batcher.testing import idle, record_batches, run


class Model(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        await asyncio.sleep(0.001)  # the model: 1 ms a batch
        return batch


async def traffic(model: Model) -> None:
    """1000 requests, one every millisecond."""
    calls = []
    for i in range(1000):
        calls.append(asyncio.ensure_future(model.process(i)))
        await asyncio.sleep(0.001)
    await asyncio.gather(*calls)


async def main() -> None:
    for wait in (0.002, 0.02):
        async with Model(max_batch_size=16, max_queue_time=wait) as model:
            with record_batches(model) as batches:
                await traffic(model)
            assert idle(model) == []  # nothing left waiting, no timer armed
        sizes = dict(Counter(batch.size for batch in batches))
        print(f"max_queue_time={wait}:", dict(model.stats.reasons), "sizes", sizes)
    # max_queue_time=0.002: {'deadline': 500} sizes {2: 500}
    #   every batch went at its deadline: the wait is what keeps them small
    # max_queue_time=0.02: {'full': 62, 'deadline': 1} sizes {16: 62, 8: 1}
    #   full: max_batch_size is the limit now


if __name__ == "__main__":
    run(main())
