"""Checked by mypy --strict in test_typing.py, never run: the constructor's keywords are typed end to end.

A misspelt keyword or a value of the wrong type is an error a type checker reports; each line that must be one
carries a ``type: ignore`` for that error, and ``--strict`` reports an ignore that is not needed.
"""

from __future__ import annotations

from async_batcher import AsyncBatcher, Limits, Streaming
from async_batcher.policies import ClosedLoopHold, Deadline, LatencyBudget


class Doubler(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [x * 2 for x in batch]


Doubler(max_batch_size=64, max_queue_time=0.002, concurrency=2, max_queue_size=100, wait_when_full=True)
Doubler(max_batch_weight=1e6, max_priority_wait=0.5, max_latency=0.05, name="doubler", executor=None)
Doubler(batch_size=64)  # 0.2.2's synonym: typed too (it warns at run time)
Doubler(max_batch_szie=64)  # type: ignore[call-arg]
Doubler(max_queeu_time=0.01)  # type: ignore[call-arg]
Doubler(max_queue_time="soon")  # type: ignore[arg-type]
Doubler(concurrency=None, max_batch_size=None)  # None: no limit
Doubler(concurrency="2")  # type: ignore[arg-type]
Doubler(limits=Limits(max_batch_size=64, concurrency=2), policy=Deadline(0.002), streaming=Streaming(buffer=4))
Doubler(policy=ClosedLoopHold(0.002, LatencyBudget(0.05)))
Doubler(limits={"max_batch_size": 64})  # type: ignore[arg-type]
Doubler(policy=0.002)  # type: ignore[arg-type]
b = Doubler()
b.max_batch_size = None
b.limits = Limits(max_queue_size=100)
b.max_queue_time = "soon"  # type: ignore[assignment]
running: bool = b.running  # a plain bool (is_running() is 0.2.2's coroutine)
wrong: str = b.running  # type: ignore[assignment]
