"""Batch the calls of a PyTorch model: many concurrent single-item awaits become one forward pass.

The torch twin of :class:`async_batcher.ml.keras.KerasAsyncBatcher`: the same settings, and the model runs
in the executor under ``torch.inference_mode()``, so the event loop stays free while it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from async_batcher.batcher import AsyncBatcher
from async_batcher.ml._collate import (
    Lists,
    PaddingSide,
    PadValue,
    check_bucketed_batch_size,
    check_lists,
    check_padding_side,
)
from async_batcher.ml.torch._devices import _as_device
from async_batcher.ml.torch.tensors import Batch, collate

if TYPE_CHECKING:
    from typing import Unpack

    from async_batcher._core.options import BatcherOptions

__all__ = ["TorchAsyncBatcher"]


class TorchAsyncBatcher(AsyncBatcher[Any, Any]):
    """Run a torch model on batches of items; each caller gets its own row of the model's output, a tensor.

    An item is one model input without the batch axis: a tensor (or a list of numbers) or, for a model with
    named inputs, a dict of them (``{"input_ids": ..., "attention_mask": ...}``). The result is the item's row
    of the output: a tensor on the model's device (the same structure of them for a model with several or
    nested outputs, a transformers ``ModelOutput`` say; see ``split_outputs`` for the rule), a view of the
    batch's output made under inference mode: ``clone()`` it to change it in place or to use it in autograd.

    An item that does not stack with the rest of its batch (another shape, dtype or set of features than most
    of the batch's items have, or not an array of numbers) fails alone, with an error naming its shape and
    dtype and the batch's; the others run. An error of the model or of its outputs fails its whole batch.

    Args:
        model: a ``torch.nn.Module`` in eval mode (one in training mode is refused: BatchNorm and Dropout would
            make each caller's result depend on the others in its batch), or any callable. Called with the
            stacked inputs, ``model(**inputs)`` for dict items, unless ``predict_fn`` is given.
        **options: The settings of :class:`~async_batcher.AsyncBatcher` (``max_batch_size``, ``max_queue_time``,
            ``concurrency``, ``executor``, ``limits``, ``policy``, ...),. The model runs
            in ``executor`` (the loop's default executor if None): give it ``concurrency`` threads.
        predict_fn: called with the collated :class:`~async_batcher.ml.torch.tensors.Batch` instead of the model,
            for a model that takes the mask: ``lambda b: model(b.inputs, attention_mask=b.mask)``.
        dtype, pad_sequences, pad_value, padding_side, mask_dtype, buckets, device, non_blocking, pin_memory:
            as for ``collate``. ``device`` defaults to the device of the module's first parameter (or buffer).
            ``buckets``: ``max_batch_size`` must fit in the largest.
        trim: give each caller its sequence outputs cut to its own length (see ``Batch.split``); needs
            ``pad_sequences``.
        output_device: move the outputs there (``"cpu"``, say) in one copy before splitting them.
        lists: how a list in the model's outputs is read: ``"auto"`` (the default: several outputs when it holds
            tensors, one element per item when it holds plain Python values, refused when it could be both),
            ``"outputs"`` or ``"items"`` (see ``split_outputs``).
    """

    def __init__(
        self,
        *,
        model: Callable[..., Any],
        predict_fn: Callable[[Batch], Any] | None = None,
        dtype: torch.dtype | None = None,
        pad_sequences: bool = False,
        pad_value: PadValue = 0,
        padding_side: PaddingSide = "right",
        mask_dtype: torch.dtype = torch.bool,
        buckets: Collection[int] | None = None,
        device: torch.device | str | int | None = None,
        non_blocking: bool = False,
        pin_memory: bool = False,
        trim: bool | str = False,
        output_device: torch.device | str | int | None = None,
        lists: Lists = "auto",
        **options: Unpack[BatcherOptions],
    ) -> None:
        super().__init__(**options)
        if predict_fn is None and not callable(model):
            raise TypeError(f"model must be a torch.nn.Module or a callable, got {type(model).__name__}")
        if isinstance(model, torch.nn.Module) and model.training:
            raise ValueError(
                f"model {type(model).__name__} is in training mode: call model.eval() first (in training mode"
                " BatchNorm and Dropout make each caller's result depend on the rest of its batch)"
            )
        if trim is not False and not pad_sequences:
            raise ValueError(f"trim={trim!r} cuts padded sequences: it needs pad_sequences=True")
        self.model = model
        self.predict_fn: Callable[[Batch], Any] = predict_fn or self._call_model
        self.dtype = dtype
        self.pad_sequences = pad_sequences
        self.pad_value = pad_value
        self.padding_side = check_padding_side(padding_side)
        self.mask_dtype = mask_dtype
        self.buckets = check_bucketed_batch_size(buckets, self.max_batch_size)
        self.device = _as_device(device) if device is not None else _module_device(model)
        self.non_blocking = non_blocking
        self.pin_memory = pin_memory
        self.trim = trim
        self.output_device = None if output_device is None else _as_device(output_device)
        self.lists = check_lists(lists)

    def process_batch(self, batch: list[Any]) -> Sequence[Any]:
        """Collate, run the model, split: in the executor, never on the event loop, under inference mode.

        The items that do not stack are left out of the model's batch and get their errors in their places.
        """
        with torch.inference_mode():
            collated = collate(
                batch,
                dtype=self.dtype,
                pad_sequences=self.pad_sequences,
                pad_value=self.pad_value,
                padding_side=self.padding_side,
                mask_dtype=self.mask_dtype,
                buckets=self.buckets,
                device=self.device,
                non_blocking=self.non_blocking,
                pin_memory=self.pin_memory,
                odd_items="exclude",
            )
            outputs = self.predict_fn(collated) if collated.size else None
            return collated.split(outputs, trim=self.trim, device=self.output_device, lists=self.lists)

    def _call_model(self, batch: Batch) -> Any:
        if isinstance(batch.inputs, Mapping):
            return self.model(**batch.inputs)
        return self.model(batch.inputs)


def _module_device(model: object) -> torch.device | None:
    """Where a module's weights are (its first parameter, else its first buffer); None for other callables."""
    if not isinstance(model, torch.nn.Module):
        return None
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return None
