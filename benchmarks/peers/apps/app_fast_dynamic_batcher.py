"""fast-dynamic-batcher 1.1.0 as its README shows: an ``InferenceModel`` whose ``infer`` runs the model, in the
process ``DynBatcher`` spawns; each request waits in a thread (its ``process_batched``).

The model runs in that other process, so the app's counter cannot see its calls: ``infer`` returns each row's
prediction with the size of its batch, and the app counts 1/n call per item of a batch of n.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app_shape import CountingModel, rows
from fast_dynamic_batcher.dyn_batcher import DynBatcher
from fast_dynamic_batcher.inference_template import InferenceModel

__all__ = ["DEFAULTS", "SpawnedModel", "make_predictor"]

DEFAULTS: dict[str, Any] = {"max_batch_size": 256, "max_delay": 0.001}


class SpawnedModel(InferenceModel):
    """Built in the batcher's own process (spawned: this module is imported there by name)."""

    def __init__(self) -> None:
        self.model = CountingModel()

    def infer(self, inputs: list[Any]) -> list[Any]:
        if not inputs:  # its loop calls infer on an empty batch when its delay runs out with nothing queued
            return []
        out = self.model.predict_rows(rows(inputs))[:, 0]
        return [(float(v), len(inputs)) for v in out]


class Fdb:
    def __init__(self, model: CountingModel, settings: dict[str, Any]) -> None:
        self.model = model
        self.settings = {**DEFAULTS, **settings}
        self.batcher: DynBatcher | None = None

    async def start(self) -> None:
        # Its constructor starts the process (TensorFlow loads there: seconds) and a thread.
        self.batcher = await asyncio.to_thread(DynBatcher, SpawnedModel, **self.settings)

    async def predict(self, features: list[float]) -> float:
        if self.batcher is None:
            raise RuntimeError("the batcher is not started")
        value, batch = await self.batcher.process_batched(features)
        self.model.count(1.0 / batch, 1)
        return float(value)

    async def stop(self) -> None:
        if self.batcher is not None:
            await asyncio.to_thread(self.batcher.stop)


def make_predictor(model: CountingModel, settings: dict[str, Any]) -> Fdb:
    return Fdb(model, settings)
