"""Batch predictions of a Keras model: many concurrent single-item awaits become one model call.

Path and constructor are async-batcher 0.2.2's (``model=`` and the batching settings, keyword-only), so code
written against it runs unchanged; 0.2.2 called ``model.predict``, whose fixed cost of tens of milliseconds a
call (it builds a data pipeline each time) ate most of what batching gained. This one calls
``model.predict_on_batch`` (or your own ``predict_fn``, a ``tf.function`` say) in the executor, so the event
loop stays free while the model runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

try:
    import numpy  # noqa: F401  (what the extra installs; async_batcher.ml.numpy below imports it)
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("async_batcher.ml.keras needs numpy: pip install 'async-batcher[keras]'") from exc

from async_batcher.batcher import AsyncBatcher
from async_batcher.ml._collate import check_bucketed_batch_size, check_lists
from async_batcher.ml.numpy import Lists, PadValue, collate

if TYPE_CHECKING:
    from typing import Unpack

    import numpy.typing as npt

    from async_batcher._core.options import BatcherOptions

__all__ = ["KerasAsyncBatcher"]


class KerasAsyncBatcher(AsyncBatcher[Any, Any]):
    """Run a Keras model on batches of items; each caller gets its own row of the model's output.

    An item is one model input without the batch axis: an array-like of the input's shape (a list of 10 floats
    for a model on 10 features) or, for a model with named inputs, a dict of them. The result is the item's row
    of the output (a numpy array; a dict or list of them for a multi-output model).

    An item that does not stack with the rest of its batch (another shape or set of features than most of the
    batch's items have, strings among numbers, not an array) fails alone, with an error naming its shape and
    the batch's; the others run. An error of the model or of its outputs fails its whole batch.

    Args:
        model: the Keras model (any backend); called through ``predict_on_batch`` unless ``predict_fn`` is given.
        **options: The settings of :class:`~async_batcher.AsyncBatcher` (``max_batch_size``, ``max_queue_time``,
            ``concurrency``, ``executor``, ``limits``, ``policy``, ...),. The model runs
            in ``executor`` (the loop's default executor if None): give it ``concurrency`` threads.
        predict_fn: called with the stacked inputs instead of ``model.predict_on_batch``; returns the batched
            outputs (arrays or tensors).
        dtype: cast the stacked inputs to it (for instance the model's float32) instead of keeping their dtype.
        pad_sequences, pad_value: pad variable-length items to the longest of the batch (see
            ``async_batcher.ml.numpy.collate``); the attention mask is then the model's concern: pass a
            ``predict_fn`` that takes ``batch`` if the model needs it.
        buckets: the allowed batch sizes: batches are padded up to one of them, so a compiled model sees few
            shapes; ``max_batch_size`` must fit in the largest.
        lists: how a list in the outputs is read (see ``async_batcher.ml.numpy.split_outputs``). Default:
            ``"outputs"`` with ``model.predict_on_batch`` (a Keras model returns a list for a list of outputs),
            ``"auto"`` with a ``predict_fn``.
    """

    def __init__(
        self,
        *,
        model: Any,
        predict_fn: Callable[[Any], Any] | None = None,
        dtype: npt.DTypeLike | None = None,
        pad_sequences: bool = False,
        pad_value: PadValue = 0,
        buckets: Collection[int] | None = None,
        lists: Lists | None = None,
        **options: Unpack[BatcherOptions],
    ) -> None:
        super().__init__(**options)
        if predict_fn is None and not callable(getattr(model, "predict_on_batch", None)):
            raise TypeError(f"model must have predict_on_batch (a Keras model), got {type(model).__name__}")
        buckets = check_bucketed_batch_size(buckets, self.max_batch_size)
        self.model = model
        if predict_fn is None and callable(make := getattr(model, "make_predict_function", None)):
            # Keras builds its predict function lazily, unguarded: build it here, not in two batch threads at once.
            make()
        self.predict_fn: Callable[[Any], Any] = predict_fn or model.predict_on_batch
        self.dtype = dtype
        self.pad_sequences = pad_sequences
        self.pad_value = pad_value
        self.buckets = buckets
        self.lists: Lists = check_lists(lists if lists is not None else "outputs" if predict_fn is None else "auto")

    def process_batch(self, batch: list[Any]) -> Sequence[Any]:
        """Stack, predict, split: runs in the executor, never on the event loop. The items that do not stack
        are left out of the model's batch and get their errors in their places."""
        collated = collate(
            batch,
            dtype=self.dtype,
            pad_sequences=self.pad_sequences,
            pad_value=self.pad_value,
            buckets=self.buckets,
            odd_items="exclude",
        )
        outputs = self.predict_fn(collated.inputs) if collated.size else None
        return collated.split(outputs, lists=self.lists)
