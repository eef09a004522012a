"""This package: ``KerasAsyncBatcher`` as its README shows for a FastAPI model server, the model in one thread of
its own; every batcher setting can be given on the command line (``--ours NAME:key=value,...``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from app_shape import CountingModel

__all__ = ["DEFAULTS", "make_predictor"]

# The README's settings for a model server: a batch leaves as soon as the model is free (max_queue_time=0), four turns
# of the event loop after the last one ended; no hold (max_hold_time=0, the default).
DEFAULTS: dict[str, Any] = {
    "max_batch_size": 256,
    "max_queue_time": 0.0,
    "max_hold_time": 0.0,
    "max_queue_size": 4096,
}


class Ours:
    def __init__(self, model: CountingModel, settings: dict[str, Any]) -> None:
        from async_batcher.ml.keras import KerasAsyncBatcher

        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        settings = {**DEFAULTS, **settings}
        # turns= and regather= are the Deadline policy's (async_batcher.policies): the loop's turns before a batch
        # after a batch's end (0: plain greedy), and the regather of a cohort; the other keys are keywords.
        policy = {k: settings.pop(k) for k in ("turns", "regather") if k in settings}
        if policy:
            from async_batcher.policies import ClosedLoopHold, Deadline, DispatchPolicy

            built: DispatchPolicy = Deadline(
                float(settings.pop("max_queue_time")),
                turns=int(policy.get("turns", Deadline().turns)),
                regather=bool(int(policy.get("regather", 1))),
            )
            hold = float(settings.pop("max_hold_time"))
            settings["policy"] = ClosedLoopHold(hold, built) if hold else built
        self.batcher = KerasAsyncBatcher(
            model=model.keras_model,
            predict_fn=model.predict_rows,
            dtype=np.float32,
            executor=self.executor,
            **settings,
        )

    async def start(self) -> None:
        self.batcher.start()

    async def predict(self, features: list[float]) -> float:
        return float((await self.batcher.process(features))[0])

    def counts(self) -> dict[str, float]:
        """The batches a hold kept back, and the probes among them (the app's ``/stats``)."""
        stats = self.batcher.stats
        return {"held": stats.held, "probes": stats.probes}

    async def stop(self) -> None:
        await self.batcher.stop()
        self.executor.shutdown()


def make_predictor(model: CountingModel, settings: dict[str, Any]) -> Ours:
    return Ours(model, settings)
