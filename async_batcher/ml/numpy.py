"""Stack per-item model inputs into arrays; split a model's batched outputs back into per-item results.

Usable with any array model (Keras, PyTorch via ``torch.from_numpy``, ONNX Runtime, scikit-learn); needs numpy
only. The one entry point is :func:`collate`::

    batch = collate(items, buckets=(1, 8, 32, 64))
    outputs = model(batch.inputs)
    return batch.split(outputs)          # one result per item, the padding rows dropped

An item is an array-like (all items of one shape, or of one shape but the first axis with ``pad_sequences``)
or a ``Mapping`` of feature name to array-like (all items with the same keys). The number of items in a batch
of dict items is the number of dicts, never the number of keys of one of them.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

try:
    import numpy as np
    import numpy.typing as npt
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("async_batcher.ml.numpy needs numpy: pip install 'async-batcher[numpy]'") from exc

from async_batcher.ml._collate import (
    PadValue,
    bucket_size,
    check_array_pad_value,
    check_buckets,
    check_fill,
    check_items,
    check_rows,
    check_shapes,
    common_keys,
    describe,
    pad_value_for,
    split_structure,
)

__all__ = ["Batch", "PadValue", "check_buckets", "collate", "split_outputs"]

_Array: TypeAlias = "npt.NDArray[Any]"
# The stacked inputs, their masks and lengths have one structure: an array, or a dict of arrays.
_Arrays: TypeAlias = "_Array | dict[str, _Array]"


@dataclass(frozen=True)
class Batch:
    """The arrays to feed a model for one batch of items, and how to split its outputs back.

    ``inputs``: the stacked items, ``(padded_size, ...)``; a dict of such arrays for dict items.
    ``mask`` / ``lengths``: with ``pad_sequences`` only (else None), same structure as ``inputs``: the
    attention mask ``(padded_size, longest)`` (true where the item has data) and each item's length
    ``(padded_size,)``. ``size``: the number of real items; ``padded_size``: rows in the arrays (more when a
    bucket size padded it).
    """

    inputs: _Arrays
    size: int
    padded_size: int
    mask: _Arrays | None = None
    lengths: _Arrays | None = None

    def split(self, outputs: Any) -> list[Any]:
        """One result per real item from the model's batched ``outputs``; see :func:`split_outputs`."""
        return split_outputs(outputs, self.size, padded_size=self.padded_size)


def collate(
    items: Sequence[Any],
    *,
    dtype: npt.DTypeLike | None = None,
    pad_sequences: bool = False,
    pad_value: PadValue = 0,
    mask_dtype: npt.DTypeLike = np.bool_,
    buckets: Collection[int] | None = None,
) -> Batch:
    """Stack ``items`` into a :class:`Batch`.

    ``dtype``: cast the stacked arrays to it (default: the items' common dtype, kept as it is; padding never
    changes it). ``pad_sequences``: items may differ in the length of their first axis; each is padded at the
    end to the longest in the batch with ``pad_value`` (one per feature for dict items) and an attention mask
    is made. ``buckets``: the allowed batch sizes; the batch is padded up to the smallest one that holds
    it, so a compiled graph sees a few shapes only. Padding rows repeat the last real item (a row of zeros
    can be an input the model cannot take, such as an all-masked sequence) and :meth:`Batch.split` drops
    them.
    """
    items = check_items(items)
    padded_size = bucket_size(len(items), buckets)
    if isinstance(items[0], Mapping):
        keys = common_keys(items, pad_value)
        columns = {key: _stack_feature([item[key] for item in items], key, dtype, pad_sequences) for key in keys}
        features = {
            key: _finish(column, key, padded_size, pad_value_for(pad_value, key), mask_dtype)
            for key, column in columns.items()
        }
        inputs: _Arrays = {key: f[0] for key, f in features.items()}
        mask: _Arrays | None = {key: f[1] for key, f in features.items()} if pad_sequences else None
        lengths: _Arrays | None = {key: f[2] for key, f in features.items()} if pad_sequences else None
    else:
        fill = check_array_pad_value(pad_value)
        column = _stack_feature(items, None, dtype, pad_sequences)
        inputs, mask_array, lengths_array = _finish(column, None, padded_size, fill, mask_dtype)
        mask = mask_array if pad_sequences else None
        lengths = lengths_array if pad_sequences else None
    return Batch(inputs=inputs, size=len(items), padded_size=padded_size, mask=mask, lengths=lengths)


def split_outputs(outputs: Any, size: int, *, padded_size: int | None = None) -> list[Any]:
    """Split a model's batched ``outputs`` into ``size`` per-item results, dropping any padding rows.

    ``outputs`` is an array (or tensor: anything ``numpy.asarray`` takes) with the items on its first axis, or
    a dict / list / tuple of those (a multi-output model); the result for item ``i`` has the same structure
    with row ``i`` of each array. Outputs with fewer rows than items, or other than ``padded_size`` rows when
    given, are an error rather than a silent misalignment.
    """
    return split_structure(outputs, size, lambda value, name: _rows(value, size, padded_size, name))


def _rows(value: Any, size: int, padded_size: int | None, name: str) -> list[Any]:
    array = np.asarray(value)
    check_rows(array.shape, size, padded_size, name)
    return list(array[:size])


@dataclass(frozen=True)
class _Column:
    """One feature's arrays, before padding."""

    arrays: list[_Array]
    dtype: np.dtype[Any]
    pad_sequences: bool
    #: ``arrays`` holds a single array, the whole feature already stacked.
    stacked: bool = False


def _stack_feature(values: list[Any], key: str | None, dtype: npt.DTypeLike | None, pad: bool) -> _Column:
    if not pad:
        # The common case first: one np.array call over the whole batch (4x faster than an array per item on
        # lists of floats). Ragged or non-numeric items make it fail, or give objects: then the slow path below
        # finds the offending item and names it.
        try:
            stacked = np.array(values, dtype=dtype)
        except (ValueError, TypeError):
            pass
        else:
            if stacked.dtype != np.object_:
                return _Column([stacked], stacked.dtype, pad, stacked=True)
    arrays = [np.asarray(v) if dtype is None else np.asarray(v, dtype=dtype) for v in values]
    for index, array in enumerate(arrays):
        if array.dtype == np.object_:
            raise TypeError(f"{describe(key)}: item {index} is not a rectangular array of numbers")
    check_shapes([array.shape for array in arrays], key, pad=pad)
    # reduce, not np.result_type(*arrays): that takes a bounded number of arguments, batches do not have one.
    result_dtype = (
        np.dtype(dtype) if dtype is not None else functools.reduce(np.promote_types, (a.dtype for a in arrays))
    )
    return _Column(arrays, result_dtype, pad)


def _finish(
    column: _Column,
    key: str | None,
    padded_size: int,
    pad_value: int | float | bool,
    mask_dtype: npt.DTypeLike,
) -> tuple[_Array, _Array, _Array]:
    """Stack (padding the sequence axis if asked), then repeat the last row up to ``padded_size``."""
    arrays, dtype = column.arrays, column.dtype
    if column.stacked:
        stacked = arrays[0]
        lengths = np.zeros(len(stacked), dtype=np.int64)
        mask = np.zeros((len(stacked), 0), dtype=mask_dtype)
    elif column.pad_sequences:
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        longest = int(lengths.max())
        fill = _fill_value(pad_value, dtype, key)
        stacked = np.full((len(arrays), longest, *arrays[0].shape[1:]), fill, dtype=dtype)
        for row, array in enumerate(arrays):
            stacked[row, : len(array)] = array
        mask = (np.arange(longest)[None, :] < lengths[:, None]).astype(mask_dtype)
    else:
        stacked = np.stack(arrays).astype(dtype, copy=False)
        lengths = np.zeros(len(arrays), dtype=np.int64)
        mask = np.zeros((len(arrays), 0), dtype=mask_dtype)
    extra = padded_size - len(stacked)
    if extra:
        stacked, mask, lengths = (
            np.concatenate([a, np.repeat(a[-1:], extra, axis=0)]) for a in (stacked, mask, lengths)
        )
    return stacked, mask, lengths


def _fill_value(pad_value: int | float | bool, dtype: np.dtype[Any], key: str | None) -> Any:
    """``pad_value`` in ``dtype``, refusing a value it would change (a float in an int array, -1 in uint8).

    A float dtype may round the value (0.1 in float32) but not overflow it to infinity.
    """
    try:
        with np.errstate(all="ignore"):
            fill = np.array(pad_value).astype(dtype, casting="unsafe")
    except (OverflowError, ValueError, TypeError):
        fill = None
    check_fill(pad_value, fill, floating=dtype.kind in "fc", dtype=dtype, key=key)
    return fill
