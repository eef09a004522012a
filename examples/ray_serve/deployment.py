"""The Keras example model on Ray Serve, batched inside each replica: by this package, or by ``@serve.batch``.

Two deployments of one shape (same model, same batch limits, one executor thread per replica running the
model), so that the two batchers can be compared (benchmarks/ray_serve.py, reports/ray.md):

- :class:`PackageModel`: an :class:`~async_batcher.AsyncBatcher` per replica, made in ``__init__`` and started
  lazily by its first ``process`` on the replica's event loop; ``async __del__`` (which Ray Serve awaits at a
  graceful shutdown, after it drained the replica's requests) stops it.
- :class:`ServeBatchModel`: Ray Serve's own ``@serve.batch`` on a method.

HTTP, for both: ``POST /`` with a JSON list of 10 finite numbers answers the prediction, a JSON number (422 for
a bad item, which fails its own caller only; 503 with ``Retry-After`` when this package's queue is full);
``GET /stats`` answers the counters of the replica that serves it (``replica`` names it). Every answer carries an
``x-replica`` header. Build an app with :func:`build_app`; ``python -m examples.ray_serve`` runs one on a local
Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from ray import serve
from ray.serve.deployment import Application
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from async_batcher import AsyncBatcher, QueueFullException
from benchmarks.keras import model as example_model

__all__ = ["BATCHERS", "BatchSettings", "PackageModel", "RowModel", "ServeBatchModel", "build_app"]


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """What both deployments share: the batch limits, the model, and a delay that makes the model slower."""

    max_batch_size: int = 32
    #: Seconds the first item of a batch waits for more (``batch_wait_timeout_s`` for ``@serve.batch``).
    max_queue_time: float = 0.005
    #: This package only (``@serve.batch`` has no bound): items a replica holds before answering 503.
    max_queue_size: int = 1024
    hidden_layers: int = example_model.ModelSpec.hidden_layers
    #: Seconds each model call sleeps on top of the model: a slower model, for the shutdown and cancel probes.
    batch_delay: float = 0.0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_queue_size < 1 or self.hidden_layers < 1:
            raise ValueError(f"max_batch_size, max_queue_size and hidden_layers must be >= 1, got {self}")
        if not (self.max_queue_time >= 0 and self.batch_delay >= 0):
            raise ValueError(f"max_queue_time and batch_delay must be >= 0, got {self}")


class RowModel:
    """The example model over items, each a list of 10 finite numbers; counts the rows it computes.

    :meth:`predict_items` answers each item with its prediction, or with a ``ValueError`` for an item that is no
    such list: one bad item costs only itself. It runs in a thread, off the event loop.
    """

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        example_model.configure_threads(1, 1)
        self.model = example_model.load_or_train(example_model.ModelSpec(hidden_layers=settings.hidden_layers))
        self.predict_fn = example_model.compiled_predict(self.model)
        self._lock = threading.Lock()
        self.calls = 0
        self.rows = 0
        for size in (1, 2, settings.max_batch_size):  # trace and size TensorFlow's buffers before any request
            self.predict_fn(np.zeros((size, example_model.N_FEATURES), dtype=np.float32))

    @staticmethod
    def check(item: Any) -> list[float] | ValueError:
        if (
            isinstance(item, list)
            and len(item) == example_model.N_FEATURES
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in item)
        ):
            return item
        kind = f"a list of {len(item)}" if isinstance(item, list) else type(item).__name__
        return ValueError(f"an item must be a list of {example_model.N_FEATURES} finite numbers, got {kind}")

    def predict_items(self, items: list[Any]) -> list[float | ValueError]:
        checked = [self.check(item) for item in items]
        rows = [item for item in checked if not isinstance(item, ValueError)]
        predictions: list[float] = []
        if rows:
            predictions = self.predict_fn(np.asarray(rows, dtype=np.float32)).numpy()[:, 0].tolist()
        if self.settings.batch_delay:
            time.sleep(self.settings.batch_delay)
        with self._lock:
            self.calls += 1
            self.rows += len(rows)
        answers = iter(predictions)
        return [item if isinstance(item, ValueError) else next(answers) for item in checked]

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {"model_calls": self.calls, "model_rows": self.rows}


class _ModelBatcher(AsyncBatcher[Any, float]):
    """This package's batcher around :meth:`RowModel.predict_items` (a plain def: it runs in the executor)."""

    def __init__(self, model: RowModel, **settings: Any) -> None:
        super().__init__(**settings)
        self.model = model

    def process_batch(self, batch: list[Any]) -> list[float | ValueError]:
        return self.model.predict_items(batch)


def _replica_id() -> str:
    return str(serve.get_replica_context().replica_id.unique_id)


def _answer(value: float, replica: str) -> Response:
    return Response(json.dumps(value), media_type="application/json", headers={"x-replica": replica})


def _bad_item(exc: ValueError, replica: str) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=422, headers={"x-replica": replica})


async def _read_item(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None  # no JSON: a bad item like any other, answered by the batch with its error


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=256)
class PackageModel:
    """The model behind this package's batcher, one per replica."""

    def __init__(self, settings: BatchSettings) -> None:
        self.model = RowModel(settings)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self.replica = _replica_id()
        # Made here, outside any event loop; its first process() starts it on the replica's loop.
        self.batcher = _ModelBatcher(
            self.model,
            name=f"ray-{self.replica}",
            max_batch_size=settings.max_batch_size,
            max_queue_time=settings.max_queue_time,
            max_queue_size=settings.max_queue_size,
            executor=self.executor,
        )

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.url.path.rstrip("/").endswith("/stats"):
            stats = dataclasses.asdict(self.batcher.stats)
            body = {"replica": self.replica, **self.model.counters(), **stats}
            return JSONResponse(json.loads(json.dumps(body).replace("NaN", "null")))
        item = await _read_item(request)
        try:
            value = await self.batcher.process(item)
        except ValueError as exc:  # this item's own error: the batch's other callers got their answers
            return _bad_item(exc, self.replica)
        except QueueFullException:
            return JSONResponse({"detail": "busy"}, status_code=503, headers={"Retry-After": "1"})
        return _answer(value, self.replica)

    async def __del__(self) -> None:
        # Ray Serve awaits this at a graceful shutdown, once the replica's requests are done.
        await self.batcher.stop()
        self.executor.shutdown(wait=True)


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=256)
class ServeBatchModel:
    """The same model and limits behind Ray Serve's ``@serve.batch``."""

    def __init__(self, settings: BatchSettings) -> None:
        self.model = RowModel(settings)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model")
        self.replica = _replica_id()
        self.batches = 0
        self.items = 0
        self.predict.set_max_batch_size(settings.max_batch_size)
        self.predict.set_batch_wait_timeout_s(settings.max_queue_time)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def predict(self, items: list[Any]) -> list[float | ValueError]:
        self.batches += 1
        self.items += len(items)
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.model.predict_items, items)

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.url.path.rstrip("/").endswith("/stats"):
            body = {"replica": self.replica, **self.model.counters(), "batches": self.batches, "processed": self.items}
            return JSONResponse(body)
        value = await self.predict(await _read_item(request))
        # @serve.batch hands an Exception in the results back as a value: the caller must look.
        if isinstance(value, ValueError):
            return _bad_item(value, self.replica)
        return _answer(value, self.replica)


BATCHERS = {"package": PackageModel, "serve-batch": ServeBatchModel}


def build_app(batcher: str = "package", *, replicas: int = 2, settings: BatchSettings | None = None) -> Application:
    """The app of one deployment: ``batcher`` is ``"package"`` (this package) or ``"serve-batch"``."""
    if batcher not in BATCHERS:
        raise ValueError(f"batcher must be one of {sorted(BATCHERS)}, got {batcher!r}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    return BATCHERS[batcher].options(num_replicas=replicas).bind(settings or BatchSettings())
