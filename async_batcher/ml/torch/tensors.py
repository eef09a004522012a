"""Stack per-item inputs into torch tensors; split a model's batched outputs back into per-item tensors.

The torch twin of :mod:`async_batcher.ml.numpy`, with the same names and arguments (switch by changing the
import), built from torch operations only: no numpy round-trip, dtypes kept, results left on the model's
device. What it adds: ``padding_side`` (``"left"`` for decoder-only models), ``device`` placement, and trimming
each item's sequence output back to its own length::

    batch = collate(items, pad_sequences=True, padding_side="left", buckets=(1, 8, 32), device="cuda")
    outputs = model(batch.inputs, attention_mask=batch.mask)
    return batch.split(outputs, trim=True)    # one result per item: no padding rows, no padding positions

An item is a tensor (or anything ``torch.as_tensor`` takes: a number, a list of numbers, a numpy array) or a
``Mapping`` of feature name to such values (all items with the same keys). With ``odd_items="exclude"`` an item
that does not stack with the rest of its batch is left out of it and gets its own error from
:meth:`Batch.split`, which is how :class:`~async_batcher.ml.torch.TorchAsyncBatcher` fails only its caller.

This module holds :class:`Batch` and :func:`collate`; their parts have modules of their own, from which it
re-exports the public names: :mod:`~async_batcher.ml.torch._selection` (the items that go into a batch),
:mod:`~async_batcher.ml.torch._stacking` (stacking and padding), :mod:`~async_batcher.ml.torch._split`
(``split_outputs``) and :mod:`~async_batcher.ml.torch._devices` (``to_device``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch

from async_batcher.ml._collate import (
    Lists,
    OddItems,
    PaddingSide,
    PadValue,
    bucket_size,
    check_array_pad_value,
    check_buckets,
    check_items,
    check_odd_items,
    check_pad_value_names,
    check_padding_side,
    merge_left_out,
    pad_value_for,
)
from async_batcher.ml.torch._devices import _as_device, _Device, to_device
from async_batcher.ml.torch._selection import _select
from async_batcher.ml.torch._split import split_outputs
from async_batcher.ml.torch._stacking import _pad_rows, _Padding, _stack

__all__ = [
    "Batch",
    "Lists",
    "OddItems",
    "PadValue",
    "PaddingSide",
    "check_buckets",
    "collate",
    "split_outputs",
    "to_device",
]

# The stacked inputs, their masks and lengths have one structure: a tensor, or a dict of tensors.
_Tensors: TypeAlias = "torch.Tensor | dict[str, torch.Tensor]"


@dataclass(frozen=True)
class Batch:
    """The tensors to feed a model for one batch of items, and how to split its outputs back.

    ``inputs``: the stacked items, ``(padded_size, ...)``; a dict of such tensors for dict items.
    ``mask`` / ``lengths``: with ``pad_sequences`` only (else None), same structure as ``inputs``: the
    attention mask ``(padded_size, longest)`` (true where the item has data) and each item's length
    ``(padded_size,)``, int64. ``size``: the number of real items in ``inputs``; ``padded_size``: rows in the
    tensors (more when a bucket size padded it). ``padding_side``: where the padding positions are. All on one
    device. ``left_out``: with ``odd_items="exclude"``, the items left out of the batch, by their index in
    ``items``, with the error each gets from :meth:`split`. When every item was left out, ``size`` is 0 and
    ``inputs`` an empty tensor: do not call the model.
    """

    inputs: _Tensors
    size: int
    padded_size: int
    mask: _Tensors | None = None
    lengths: _Tensors | None = None
    padding_side: PaddingSide = "right"
    left_out: Mapping[int, Exception] = field(default_factory=dict)

    def split(
        self, outputs: Any, *, trim: bool | str = False, device: _Device | None = None, lists: Lists = "auto"
    ) -> list[Any]:
        """One result per item given to :func:`collate`, in its order: the item's part of the model's batched
        ``outputs`` (see :func:`split_outputs`), or for an item left out of the batch its error, which a
        batcher's ``process_batch`` returns in its place to fail that caller alone. ``outputs`` is not read
        when ``size`` is 0.

        ``trim``: cut each item's sequence outputs (axis 1 of every output) to the item's own length, dropping
        its padding positions; needs ``pad_sequences``. For dict items, name the feature whose lengths count
        (``trim="input_ids"``); ``True`` works when every feature has the same lengths. ``device``: move the
        outputs there first (one copy of the real rows, say to ``"cpu"``, instead of one per item). ``lists``:
        how a list in the outputs is read (:data:`~async_batcher.ml.torch.Lists`).
        """
        if not self.size:  # every item was left out: nothing to read, nor lengths to trim by
            return merge_left_out([], self.left_out)
        lengths = self._trim_lengths(trim)
        rows = split_outputs(
            outputs,
            self.size,
            padded_size=self.padded_size,
            lengths=lengths,
            padding_side=self.padding_side,
            device=device,
            lists=lists,
        )
        return merge_left_out(rows, self.left_out)

    def _trim_lengths(self, trim: bool | str) -> torch.Tensor | None:
        if trim is False:
            return None
        if self.lengths is None:
            raise ValueError("trim needs the lengths of padded sequences: collate with pad_sequences=True")
        if isinstance(self.lengths, torch.Tensor):
            if trim is not True:
                raise ValueError(f"trim={trim!r} names a feature, but the items are not dicts: pass trim=True")
            return self.lengths
        if trim is True:
            first, *others = self.lengths.values()
            if all(torch.equal(first, other) for other in others):
                return first
            raise ValueError(
                f"the features {sorted(self.lengths)} have different lengths: name the one to trim by, trim='...'"
            )
        if trim not in self.lengths:
            raise ValueError(f"trim={trim!r} is not a feature of the items: {sorted(self.lengths)}")
        return self.lengths[trim]


def collate(
    items: Sequence[Any],
    *,
    dtype: torch.dtype | None = None,
    pad_sequences: bool = False,
    pad_value: PadValue = 0,
    padding_side: PaddingSide = "right",
    mask_dtype: torch.dtype = torch.bool,
    buckets: Collection[int] | None = None,
    device: _Device | None = None,
    non_blocking: bool = False,
    pin_memory: bool = False,
    odd_items: OddItems = "raise",
) -> Batch:
    """Stack ``items`` into a :class:`Batch` of tensors.

    ``dtype``: cast every item to it. Without it the items must share a dtype, which the batch keeps (padding
    never changes it); items of different dtypes are refused rather than promoted (int64 token ids must not
    become floats). ``pad_sequences``: items may differ in the length of their first axis; each is padded to
    the longest in the batch with ``pad_value`` (one per feature for dict items), at the end
    (``padding_side="right"``) or at the start (``"left"``, what decoder-only models need so the last position
    is every row's last token), and an attention mask is made. ``buckets``: the allowed batch sizes; the batch
    is padded up to the smallest one that holds it, with rows that repeat the last real item (a row of padding
    can be an input the model cannot take), which :meth:`Batch.split` drops. ``device``: where the tensors go
    (default: where the items are, which must then be one device; with a ``device``, items on several devices
    are each moved there first); ``non_blocking`` and ``pin_memory`` make a copy from the CPU to an
    accelerator asynchronous (both are ignored when nothing moves off the CPU).

    The items must stack: the batch's shape, dtype and device are those most of its items have (on a tie, the
    earliest item's), and an item of another shape (another length but for the first axis with
    ``pad_sequences``), dtype or device, of other features, or that is not a rectangular array of numbers, does
    not. With ``odd_items="raise"`` (the default) such an item makes ``collate`` raise, naming it, its shape and
    dtype and the batch's; with ``"exclude"`` it is left out of the batch (see :attr:`Batch.left_out`).
    """
    items = check_items(items)
    odd = check_odd_items(odd_items)
    side = check_padding_side(padding_side)
    target = None if device is None else _as_device(device)
    pad = _Padding(side, mask_dtype) if pad_sequences else None
    if pad is None and dtype is not None and isinstance(items[0], list | tuple):
        # Lists of numbers with their dtype given: one conversion for the whole batch is 3x faster. Anything it
        # cannot take (ragged, not numbers) goes the slow way, which names the item.
        try:
            stacked = torch.tensor(items, dtype=dtype)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            pass
        else:
            check_array_pad_value(pad_value)
            padded_size = bucket_size(len(items), buckets)
            inputs = to_device(
                _pad_rows(stacked, padded_size), target, non_blocking=non_blocking, pin_memory=pin_memory
            )
            return Batch(inputs, len(items), padded_size, padding_side=side)
    selection = _select(items, dtype, pad, target, odd)
    if not selection.kept:
        return Batch(torch.empty(0), 0, 0, padding_side=side, left_out=selection.left_out)
    size = len(selection.kept)
    padded_size = bucket_size(size, buckets)

    def feature(tensors: list[torch.Tensor], key: str | None, fill: int | float | bool) -> list[torch.Tensor]:
        parts = [_pad_rows(t, padded_size) for t in _stack(tensors, key, pad, fill)]
        return [to_device(t, target, non_blocking=non_blocking, pin_memory=pin_memory) for t in parts]

    if not selection.dicts:
        inputs, *padded = feature(selection.values, None, check_array_pad_value(pad_value))
        mask, lengths = padded if padded else (None, None)
        return Batch(inputs, size, padded_size, mask, lengths, side, selection.left_out)
    check_pad_value_names(pad_value, selection.columns)
    columns = {key: feature(values, key, pad_value_for(pad_value, key)) for key, values in selection.columns.items()}
    return Batch(
        {key: parts[0] for key, parts in columns.items()},
        size,
        padded_size,
        {key: parts[1] for key, parts in columns.items()} if pad else None,
        {key: parts[2] for key, parts in columns.items()} if pad else None,
        side,
        selection.left_out,
    )
