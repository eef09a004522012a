"""batched 0.1.5 as its README shows: ``@batched.aio.dynamically`` on a function of a list of items. A plain
``def``, which batched runs in a thread (``asyncio.to_thread``). An item is a tuple: batched takes a list passed to
the decorated function for a batch of items."""

from __future__ import annotations

from typing import Any

from app_shape import CountingModel, rows

__all__ = ["DEFAULTS", "make_predictor"]

DEFAULTS: dict[str, Any] = {"batch_size": 256, "timeout_ms": 1.0}


class Batched:
    def __init__(self, model: CountingModel, settings: dict[str, Any]) -> None:
        from batched import aio

        def predict_batch(items: list[tuple[float, ...]]) -> list[float]:
            return [float(v) for v in model.predict_rows(rows(items))[:, 0]]

        self.processor = aio.dynamically(predict_batch, **{**DEFAULTS, **settings})

    async def start(self) -> None:
        pass

    async def predict(self, features: list[float]) -> float:
        result: float = await self.processor(tuple(features))
        return result

    async def stop(self) -> None:
        pass


def make_predictor(model: CountingModel, settings: dict[str, Any]) -> Batched:
    return Batched(model, settings)
