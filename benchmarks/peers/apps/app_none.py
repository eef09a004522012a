"""No batching: one model call per request, in a thread (Starlette's ``run_in_threadpool``, where FastAPI runs a
plain ``def`` endpoint), so that the event loop is never blocked."""

from __future__ import annotations

from typing import Any

from app_shape import CountingModel, row
from starlette.concurrency import run_in_threadpool

__all__ = ["make_predictor"]


class Unbatched:
    def __init__(self, model: CountingModel) -> None:
        self.model = model

    async def start(self) -> None:
        pass

    async def predict(self, features: list[float]) -> float:
        out = await run_in_threadpool(self.model.predict_rows, row(features))
        return float(out[0, 0])

    async def stop(self) -> None:
        pass


def make_predictor(model: CountingModel, settings: dict[str, Any]) -> Unbatched:
    if settings:
        raise ValueError(f"the unbatched variant takes no settings, got {settings}")
    return Unbatched(model)
