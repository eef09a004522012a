"""async-batcher 0.2.2 as its README shows: an ``AsyncBatcher`` subclass whose ``process_batch`` runs the model on
the stacked rows. A plain ``def``, so 0.2.2 runs it in its executor (one thread here, as for ours); it starts on
its first ``process()``. 0.2.2's own ``KerasAsyncBatcher`` calls ``model.predict``, tens of milliseconds a call
whatever the batch: the same compiled model function as every other variant is the fair choice."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app_shape import CountingModel, rows

__all__ = ["DEFAULTS", "make_predictor"]

DEFAULTS: dict[str, Any] = {"max_batch_size": 256, "max_queue_time": 0.001}


class Old:
    def __init__(self, model: CountingModel, settings: dict[str, Any]) -> None:
        from async_batcher.batcher import AsyncBatcher

        class ModelBatcher(AsyncBatcher[list[float], float]):
            def process_batch(self, batch: list[list[float]]) -> list[float]:  # type: ignore[override]
                return [float(v) for v in model.predict_rows(rows(batch))[:, 0]]

        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self.batcher = ModelBatcher(executor=self.executor, **{**DEFAULTS, **settings})

    async def start(self) -> None:
        pass

    async def predict(self, features: list[float]) -> float:
        return await self.batcher.process(features)

    async def stop(self) -> None:
        await self.batcher.stop(force=True)  # without force its stop polls for up to a second
        self.executor.shutdown()


def make_predictor(model: CountingModel, settings: dict[str, Any]) -> Old:
    return Old(model, settings)
