"""The Keras benchmark server's model: :class:`ModelService` (the model, its compiled function, the batcher and the
thread pools), made in each worker, or with ``--shared`` in the owner only, by :func:`make_batcher`."""

from __future__ import annotations

import gc
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from async_batcher.ml.keras import KerasAsyncBatcher
from async_batcher.ml.numpy import collate
from benchmarks.keras import model as example_model
from benchmarks.keras.settings import ServerSettings

__all__ = ["BATCHER_NAME", "ModelService", "make_batcher", "owned", "release"]

BATCHER_NAME = "keras-benchmark"

_owned: ModelService | None = None  # with --shared: the service this process made as the owner


class ModelService:
    """The model, its compiled function and the two ways of calling it that the endpoints compare."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.model = example_model.load_or_train(settings.model_spec)
        self.predict_fn = example_model.compiled_predict(self.model)
        # One thread per batch in flight: the batcher never runs more than `concurrency` batches at once.
        self.batch_executor = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="keras-batch")
        # /predict's pool: as many model calls at once as there are cores to run them; more only queue in TF.
        self.single_executor = ThreadPoolExecutor(settings.predict_threads, thread_name_prefix="keras-single")
        self.batch_rows = 0  # rows the batcher's model calls computed, padding included (benchmarks/padding.py)
        self._rows_lock = threading.Lock()
        self.batcher = KerasAsyncBatcher(
            model=self.model,
            predict_fn=self.predict_batch,
            dtype=np.float32,
            buckets=settings.bucket_sizes,
            preferred_batch_sizes=settings.preferred_sizes,
            max_batch_size=settings.max_batch_size,
            max_queue_time=settings.max_queue_time,
            max_hold_time=settings.max_hold_time,
            max_queue_size=settings.max_queue_size,
            concurrency=settings.concurrency,
            executor=self.batch_executor,
            name=BATCHER_NAME,
        )
        self._warm_up()

    def predict_rows(self, rows: Any) -> Any:
        return self.predict_fn(rows).numpy()

    def predict_batch(self, rows: Any) -> Any:
        with self._rows_lock:
            self.batch_rows += len(rows)
        return self.predict_rows(rows)

    def predict_one(self, features: list[float]) -> float:
        """What /predict runs in its thread: the batcher's path (collate, model, split) for a batch of one."""
        batch = collate([features], dtype=np.float32)
        return float(batch.split(self.predict_rows(batch.inputs))[0][0])

    def _warm_up(self) -> None:
        # The first calls trace the graph and size TF's buffers: keep that out of the first requests' latency.
        for size in (1, 2, self.settings.max_batch_size):
            self.predict_rows(np.zeros((max(size, 1), example_model.N_FEATURES), dtype=np.float32))

    def close(self) -> None:
        self.single_executor.shutdown(wait=True)
        self.batch_executor.shutdown(wait=True)


def make_batcher() -> KerasAsyncBatcher:
    """The shared batcher's factory (``--shared``): called in the owner only, in a thread, so that the other workers
    never import TensorFlow nor load the model. Its settings come from the environment, as every worker's do."""
    global _owned
    settings = ServerSettings.from_env()
    example_model.configure_threads(settings.tf_intra_op_threads, settings.tf_inter_op_threads)
    service = _owned = ModelService(settings)
    # As the server's lifespan does without --shared: TensorFlow's long-lived objects out of the collector's sight.
    gc.collect()
    gc.freeze()
    return service.batcher


def owned() -> ModelService | None:
    """The service :func:`make_batcher` made in this process (``None`` where it did not)."""
    return _owned


def release() -> ModelService | None:
    """The service :func:`make_batcher` made in this process, once (for its thread pools to be closed)."""
    global _owned
    service, _owned = _owned, None
    return service
