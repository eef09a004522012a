"""Checked by mypy --strict in test_typing.py, never run: the constructor's keywords are typed end to end.

A misspelt keyword or a value of the wrong type is an error a type checker reports; each line that must be one
carries a ``type: ignore`` for that error, and ``--strict`` reports an ignore that is not needed.
"""

from __future__ import annotations

from async_batcher import AsyncBatcher


class Doubler(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [x * 2 for x in batch]


Doubler(max_batch_size=64, max_queue_time=0.002, concurrency=2, max_queue_size=100, wait_when_full=True)
Doubler(max_batch_weight=1e6, max_priority_wait=0.5, max_latency=0.05, name="doubler", executor=None)
Doubler(batch_size=64)  # 0.2.2's synonym: typed too (it warns at run time)
Doubler(max_batch_szie=64)  # type: ignore[call-arg]
Doubler(max_queeu_time=0.01)  # type: ignore[call-arg]
Doubler(max_queue_time="soon")  # type: ignore[arg-type]
Doubler(concurrency=None)  # type: ignore[arg-type]
