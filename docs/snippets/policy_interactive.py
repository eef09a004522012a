"""A dispatch policy of your own: batches of interactive callers go first.

One model serves people waiting for an answer and a backfill job that can wait,
told apart by the batch key. An interactive batch goes at 8 items or once its
oldest item has waited 2 ms; a backfill batch waits up to 100 ms for 64 items.

python docs/snippets/policy_interactive.py (on a virtual clock: it takes no time)
"""

import asyncio

from async_batcher import AsyncBatcher
from async_batcher.policies import DispatchPolicy, LaneView
from async_batcher.testing import record_batches, run


class Interactive(DispatchPolicy):
    """Interactive keys: 8 items or 2 ms. Any other key: 64 items or 100 ms."""

    def __init__(self, interactive: set[str]) -> None:
        self.interactive = interactive

    def full_at(self, lane: LaneView, now: float) -> int:
        # This many items waiting make the lane's batch go at once.
        return 8 if lane.key in self.interactive else 64

    def due(self, lane: LaneView, now: float) -> float:
        # Else it goes at this time, on the event loop's clock.
        oldest = lane.oldest()  # the arrival of its oldest item
        return oldest + (0.002 if lane.key in self.interactive else 0.1)


class Model(AsyncBatcher[tuple[str, float], float]):
    def batch_key(self, item: tuple[str, float]) -> str:
        return item[0]

    async def process_batch(self, batch: list[tuple[str, float]]) -> list[float]:
        await asyncio.sleep(0.005)  # the model: 5 ms a batch
        return [x * 2 for _, x in batch]


async def main() -> None:
    policy = Interactive({"web"})
    async with Model(policy=policy, max_batch_size=64) as model:
        with record_batches(model) as batches:
            await asyncio.gather(
                *(model.process(("backfill", i)) for i in range(10)),
                *(model.process(("web", i)) for i in range(3)),
            )
            await asyncio.gather(*(model.process(("web", i)) for i in range(8)))
    for batch in batches:
        print(batch.key, batch.size, batch.reason, f"at {batch.started * 1000:g} ms")
    # web 3 deadline at 2 ms: the interactive callers did not wait for the backfill
    # backfill 10 deadline at 100 ms
    # web 8 size at 105 ms: 8 interactive items go at once


if __name__ == "__main__":
    run(main())
