"""Batch the predictions of a scikit-learn model: many concurrent single-row awaits become one model call.

Path and constructor are async-batcher 0.2.2's (``SklearnAsyncBatcher(model=...)`` and the batching settings,
keyword-only). A caller's item is one row of features (a list or 1-D array of ``model.n_features_in_``
numbers); the batch's rows are stacked into one 2-D array with :mod:`async_batcher.ml.numpy`, and ``method``
(``predict`` by default, or ``predict_proba``, ``decision_function``, ``transform``, ...) runs once on it in the
executor, never on the event loop. Each caller gets its own row of the output: a scalar from ``predict``, a 1-D
array from ``predict_proba`` or ``transform``, a 1-row CSR matrix from a sparse output (a ``OneHotEncoder``'s
``transform``). A row of the wrong shape fails only its caller, with a ``ValueError`` naming both shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from async_batcher.batcher import AsyncBatcher

try:
    import numpy as np

    from async_batcher.ml._collate import check_lists
    from async_batcher.ml.numpy import Lists, collate
except ImportError as error:  # pragma: no cover - exercised in a subprocess by tests/sklearn/test_sklearn_batcher.py
    raise ImportError(
        f"async_batcher.ml.sklearn needs numpy ({error.name} is missing): pip install 'async-batcher[sklearn]'"
    ) from error

if TYPE_CHECKING:
    from typing import Unpack

    import numpy.typing as npt

    from async_batcher._core.options import BatcherOptions

__all__ = ["SklearnAsyncBatcher"]


class SklearnAsyncBatcher(AsyncBatcher[Any, Any]):
    """Run a scikit-learn estimator's ``method`` on batches of rows; each caller gets its own row of the output.

    Args:
        model: A fitted estimator or pipeline.
        method: The method to call on the stacked rows: ``"predict"`` (default), ``"predict_proba"``,
            ``"predict_log_proba"``, ``"decision_function"``, ``"transform"``, or any other of the model's
            methods that takes a 2-D array and returns one row (or one value) per input row.
        dtype: Cast the stacked rows to it (say ``numpy.float32``) instead of keeping their dtype.
        lists: How a list returned by ``method`` is read: ``"auto"`` (the default: several outputs when it holds
            arrays, as ``predict_proba`` of a multi-output classifier returns, one element per row when it holds
            plain Python values, refused when it could be both), ``"outputs"`` or ``"items"`` (see
            ``async_batcher.ml.numpy.split_outputs``).
        **options: The settings of :class:`~async_batcher.AsyncBatcher` (``max_batch_size``, ``max_queue_time``,
            ``concurrency``, ``executor``, ``limits``, ``policy``, ...), (0.2.2's
            defaults). The model runs in ``executor`` (the loop's default executor if None).
    """

    def __init__(
        self,
        *,
        model: Any,
        method: str = "predict",
        dtype: npt.DTypeLike | None = None,
        lists: Lists = "auto",
        **options: Unpack[BatcherOptions],
    ) -> None:
        super().__init__(**options)
        if not isinstance(method, str) or not callable(getattr(model, method, None)):
            raise TypeError(f"model {type(model).__name__} has no method {method!r}")
        self.model = model
        self.method = method
        self.dtype = dtype
        self.lists = check_lists(lists)
        features = getattr(model, "n_features_in_", None)
        self.n_features: int | None = features if isinstance(features, int) else None

    def process_batch(self, batch: list[Any]) -> Sequence[Any]:
        """Check each row, stack the good ones, call the model once, split: runs in the executor."""
        results: list[Any] = [self._check(row) for row in batch]
        good = [index for index, result in enumerate(results) if result is None]
        if good:
            # Rows of a model that does not say its width (no n_features_in_) may still differ: those of
            # another width than most are left out with their error, as the rows checked above.
            collated = collate([batch[index] for index in good], dtype=self.dtype, odd_items="exclude")
            outputs = getattr(self.model, self.method)(collated.inputs) if collated.size else None
            for index, output in zip(good, collated.split(outputs, lists=self.lists), strict=True):
                results[index] = output
        return results

    def _check(self, row: Any) -> ValueError | None:
        """A ``ValueError`` for a row that is not one row of numbers of the model's width, else None."""
        try:
            array = np.asarray(row)
        except (TypeError, ValueError) as error:
            return ValueError(f"a row must be a sequence of numbers: {error}")
        if array.ndim != 1 or array.dtype == np.object_ or array.dtype.kind not in "biuf":
            return ValueError(f"a row must be a 1-D sequence of numbers, got shape {array.shape} of {array.dtype}")
        if self.n_features is not None and array.shape[0] != self.n_features:
            return ValueError(f"the model takes rows of {self.n_features} features, got {array.shape[0]}")
        return None
