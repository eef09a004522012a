"""The ceiling of dispatch in a closed loop, not a batcher to run: a batch leaves the moment the ``size``-th request
of the cohort has arrived (``size``: the closed loop's connections, known in advance), with no timer, no turns of
the loop and no queue; the model in one thread of its own, as for ours. A request that finds fewer than ``size``
others waits at most ``fallback`` seconds (0.05), so that a cohort that splits or a step's end cannot hang it.

No real batcher knows how many callers are coming, and none merges a cohort sooner: what this serves at ``size``
connections is the most that merging the closed loop's requests into batches can give in this app on this machine,
so that a ratio against a peer can be read against the ratio the ceiling reaches. (A rule that ran two cohorts in
turn could do better only if the model's thread ran without the GIL for much of its call.)"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app_shape import CountingModel, rows

__all__ = ["make_predictor"]


class Cohort:
    def __init__(self, model: CountingModel, settings: dict[str, Any]) -> None:
        unknown = set(settings) - {"size", "fallback"}
        if "size" not in settings or unknown:
            raise ValueError(f"the cohort variant takes size (required) and fallback, got {settings}")
        self.model = model
        self.size = int(settings["size"])
        self.fallback = float(settings.get("fallback", 0.05))
        if self.size < 1 or not self.fallback > 0:
            raise ValueError(f"the cohort variant needs size >= 1 and fallback > 0, got {settings}")
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self.pending: list[tuple[list[float], asyncio.Future[float]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.running: set[asyncio.Task[None]] = set()  # the batches in the model: referenced until done

    async def start(self) -> None:
        pass

    async def predict(self, features: list[float]) -> float:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        self.pending.append((features, future))
        if len(self.pending) >= self.size:
            self._send()
        elif self.timer is None:
            self.timer = loop.call_later(self.fallback, self._send)
        return await future

    def _send(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    async def _run(self, batch: list[tuple[list[float], asyncio.Future[float]]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(self.executor, self.model.predict_rows, rows([f for f, _ in batch]))
        except Exception as e:  # every caller of the batch gets the model's error
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, future), value in zip(batch, out[:, 0], strict=True):
            if not future.done():
                future.set_result(float(value))

    async def stop(self) -> None:
        self._send()  # the callers still waiting for their cohort go now, and are answered before the model's
        if self.running:  # thread goes
            await asyncio.wait(self.running)
        self.executor.shutdown()


def make_predictor(model: CountingModel, settings: dict[str, Any]) -> Cohort:
    return Cohort(model, settings)
