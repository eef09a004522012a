"""The one app shape of the head-to-head: the same model, the same minimal FastAPI app, one batcher per variant.

``POST /predict`` takes a JSON list of the model's 10 features and answers a JSON number; ``GET /stats`` gives the
model calls and the items they took since the start; ``GET /healthz`` says whether the model is loaded. The only
thing a variant supplies is a :class:`Predictor`: how ``/predict`` gets its row through the model.

This module and the variants' are loaded by ``serve.py`` inside each variant's own environment, where this
repository is not importable (async-batcher 0.2.2 has this package's import name); the example's model module is
loaded from its file.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Protocol

import numpy as np
from fastapi import FastAPI
from pydantic import Field

__all__ = ["ROOT", "CountingModel", "Predictor", "create_app", "example_model", "row", "rows"]

ROOT = Path(__file__).resolve().parents[3]
N_FEATURES = 10


def example_model() -> ModuleType:
    """``benchmarks/keras/model.py``, loaded from its file (once per process)."""
    name = "_peers_example_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "keras" / "model.py")
        if spec is None or spec.loader is None:
            raise ImportError("cannot load benchmarks/keras/model.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class CountingModel:
    """The example's Keras model as one traced graph, counting its calls and the rows they took.

    ``predict_rows`` is thread-safe: the unbatched variant calls it from many threads at once.
    """

    def __init__(self) -> None:
        model = example_model()
        # One TensorFlow thread per pool, as the example server: on 2 cores its default pools fight the web
        # server and the load generator, and a model this small gains nothing from intra-op threads.
        model.configure_threads(1, 1)
        self.keras_model = model.load_or_train()
        self._fn = model.compiled_predict(self.keras_model)
        self._lock = threading.Lock()
        for size in (1, 2, 256):  # tracing and TensorFlow's buffers: out of the first requests' way
            self._fn(np.zeros((size, N_FEATURES), dtype=np.float32))
        self.calls = 0.0
        self.items = 0

    def predict_rows(self, rows: Any) -> Any:
        """Predictions for a 2-D float32 array of rows: an array of shape (n, 1)."""
        out = self._fn(rows).numpy()
        self.count(1.0, len(rows))
        return out

    def count(self, calls: float, items: int) -> None:
        with self._lock:
            self.calls += calls
            self.items += items


class Predictor(Protocol):
    async def start(self) -> None: ...

    async def predict(self, features: list[float]) -> float: ...

    async def stop(self) -> None: ...


Features = Annotated[list[float], Field(min_length=N_FEATURES, max_length=N_FEATURES)]


def create_app(make_predictor: Callable[[CountingModel], Predictor], info: dict[str, Any]) -> FastAPI:
    """The app; the model loads when the app starts (in a thread: the loop stays free). ``GET /info`` answers
    ``info`` (what the variant is, its settings and versions)."""
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        model = await asyncio.to_thread(CountingModel)
        predictor = make_predictor(model)
        await predictor.start()
        # TensorFlow leaves millions of long-lived objects that every full collection walks again: out of the
        # collector's sight, for every variant alike (as the example server does).
        gc.collect()
        gc.freeze()
        state.update(model=model, predictor=predictor)
        try:
            yield
        finally:
            await predictor.stop()

    app = FastAPI(lifespan=lifespan)

    @app.post("/predict")
    async def predict(features: Features) -> float:
        predictor: Predictor = state["predictor"]
        return await predictor.predict(features)

    @app.get("/stats")
    async def stats() -> dict[str, float]:
        model: CountingModel = state["model"]
        # A predictor may add its own counts (this package's: the batches a hold kept back).
        extra: dict[str, float] = getattr(state.get("predictor"), "counts", dict)()
        return {"model_calls": model.calls, "items": model.items, **extra}

    @app.get("/info")
    async def describe() -> dict[str, Any]:
        return info

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok" if "predictor" in state else "loading"}

    return app


def row(features: list[float]) -> Any:
    """One request's features as the model's input: a (1, 10) float32 array."""
    return np.asarray([features], dtype=np.float32)


def rows(items: list[Any]) -> Any:
    """Many requests' features stacked: an (n, 10) float32 array."""
    return np.asarray(items, dtype=np.float32)
