"""Stack per-item model inputs into arrays; split a model's batched outputs back into per-item results.

Usable with any array model (Keras, PyTorch via ``torch.from_numpy``, ONNX Runtime, scikit-learn); needs numpy
only. The one entry point is :func:`collate`::

    batch = collate(items, buckets=(1, 8, 32, 64))
    outputs = model(batch.inputs)
    return batch.split(outputs)          # one result per item, the padding rows dropped

An item is an array-like (all items of one shape, or of one shape but the first axis with ``pad_sequences``)
or a ``Mapping`` of feature name to array-like (all items with the same keys). The number of items in a batch
of dict items is the number of dicts, never the number of keys of one of them. With ``odd_items="exclude"``
an item that does not stack with the rest of its batch is left out of it and gets its own error from
:meth:`Batch.split`, which is how a batcher fails only that item's caller.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

try:
    import numpy as np
    import numpy.typing as npt
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("async_batcher.ml.numpy needs numpy: pip install 'async-batcher[numpy]'") from exc

from async_batcher.ml._collate import (
    Lists,
    OddItems,
    PadValue,
    Selection,
    Signature,
    a_type,
    bucket_size,
    check_array_pad_value,
    check_buckets,
    check_fill,
    check_items,
    check_odd_items,
    check_pad_value_names,
    check_rows,
    describe,
    merge_left_out,
    pad_signature,
    pad_value_for,
    select,
    split_structure,
    uniform,
)

__all__ = ["Batch", "Lists", "OddItems", "PadValue", "check_buckets", "collate", "split_outputs"]

_Array: TypeAlias = "npt.NDArray[Any]"
# The stacked inputs, their masks and lengths have one structure: an array, or a dict of arrays.
_Arrays: TypeAlias = "_Array | dict[str, _Array]"


@dataclass(frozen=True)
class Batch:
    """The arrays to feed a model for one batch of items, and how to split its outputs back.

    ``inputs``: the stacked items, ``(padded_size, ...)``; a dict of such arrays for dict items.
    ``mask`` / ``lengths``: with ``pad_sequences`` only (else None), same structure as ``inputs``: the
    attention mask ``(padded_size, longest)`` (true where the item has data) and each item's length
    ``(padded_size,)``. ``size``: the number of real items in ``inputs``; ``padded_size``: rows in the arrays
    (more when a bucket size padded it). ``left_out``: with ``odd_items="exclude"``, the items left out of the
    batch, by their index in ``items``, with the error each gets from :meth:`split`. When every item was left
    out, ``size`` is 0 and ``inputs`` an empty array: do not call the model.
    """

    inputs: _Arrays
    size: int
    padded_size: int
    mask: _Arrays | None = None
    lengths: _Arrays | None = None
    left_out: Mapping[int, Exception] = field(default_factory=dict)

    def split(self, outputs: Any, *, lists: Lists = "auto") -> list[Any]:
        """One result per item given to :func:`collate`, in its order: the item's row of the model's batched
        ``outputs`` (see :func:`split_outputs`), or for an item left out of the batch its error, which a
        batcher's ``process_batch`` returns in its place to fail that caller alone. ``outputs`` is not read
        when ``size`` is 0."""
        rows = split_outputs(outputs, self.size, padded_size=self.padded_size, lists=lists) if self.size else []
        return merge_left_out(rows, self.left_out)


def collate(
    items: Sequence[Any],
    *,
    dtype: npt.DTypeLike | None = None,
    pad_sequences: bool = False,
    pad_value: PadValue = 0,
    mask_dtype: npt.DTypeLike = np.bool_,
    buckets: Collection[int] | None = None,
    odd_items: OddItems = "raise",
) -> Batch:
    """Stack ``items`` into a :class:`Batch`.

    ``dtype``: cast the stacked arrays to it (default: the items' common dtype, kept as it is; padding never
    changes it). ``pad_sequences``: items may differ in the length of their first axis; each is padded at the
    end to the longest in the batch with ``pad_value`` (one per feature for dict items) and an attention mask
    is made. ``buckets``: the allowed batch sizes; the batch is padded up to the smallest one that holds
    it, so a compiled graph sees a few shapes only. Padding rows repeat the last real item (a row of zeros
    can be an input the model cannot take, such as an all-masked sequence) and :meth:`Batch.split` drops
    them.

    The items must stack: the batch's shape is the one most of its items have (on a tie, the earliest item's),
    and an item of another shape (another length but for the first axis with ``pad_sequences``), of strings
    among numbers, of other features, or that is not a rectangular array of numbers, does not. With
    ``odd_items="raise"`` (the default) such an item makes ``collate`` raise, naming it, its shape and the
    batch's; with ``"exclude"`` it is left out of the batch (see :attr:`Batch.left_out`).
    """
    items = check_items(items)
    odd = check_odd_items(odd_items)
    if not pad_sequences and (stacked := _stack_at_once(items, dtype)) is not None:
        selection = Selection(list(range(len(items))), [], {}, {})
        columns: Mapping[Any, _Column] = stacked
    else:
        same = uniform(items, functools.partial(_uniform_column, dtype=dtype, pad=pad_sequences))
        selection = same or select(items, functools.partial(_convert, dtype=dtype, pad=pad_sequences), odd_items=odd)
        if not selection.kept:
            return Batch(inputs=np.empty((0,)), size=0, padded_size=0, left_out=selection.left_out)
        if selection.dicts:
            columns = {name: _column(values, dtype, pad_sequences) for name, values in selection.columns.items()}
        else:
            columns = {None: _column(selection.values, dtype, pad_sequences)}
    size = len(selection.kept)
    padded_size = bucket_size(size, buckets)
    inputs: _Arrays
    mask: _Arrays | None
    lengths: _Arrays | None
    if None in columns:
        fill = check_array_pad_value(pad_value)
        inputs, mask_array, lengths_array = _finish(columns[None], None, padded_size, fill, mask_dtype)
        mask = mask_array if pad_sequences else None
        lengths = lengths_array if pad_sequences else None
    else:
        check_pad_value_names(pad_value, columns)
        features = {
            key: _finish(column, key, padded_size, pad_value_for(pad_value, key), mask_dtype)
            for key, column in columns.items()
        }
        inputs = {key: f[0] for key, f in features.items()}
        mask = {key: f[1] for key, f in features.items()} if pad_sequences else None
        lengths = {key: f[2] for key, f in features.items()} if pad_sequences else None
    return Batch(inputs, size, padded_size, mask, lengths, selection.left_out)


def split_outputs(outputs: Any, size: int, *, padded_size: int | None = None, lists: Lists = "auto") -> list[Any]:
    """Split a model's batched ``outputs`` into ``size`` per-item results, dropping any padding rows.

    What is split, and how (the rule ``ml.torch`` follows too):

    * an array (or anything ``numpy.asarray`` takes that is not a Python container or scalar: a framework's
      tensor) has the items on its first axis: item ``i`` gets row ``i``;
    * a scipy sparse matrix or array (a ``OneHotEncoder``'s ``transform``): item ``i`` gets row ``i`` as a
      1-row CSR matrix of the same kind (``.toarray()`` makes it dense);
    * a dict, a tuple, a namedtuple or a dataclass holds several outputs, by name or position, each split in
      turn: item ``i`` gets the same structure (a plain ``dict`` for a mapping, a dataclass rebuilt with
      ``dataclasses.replace``), at any depth;
    * ``None`` is ``None`` for every item;
    * a list holds several outputs when it holds arrays, and one element per item when it holds only plain
      Python values (numbers, strings, lists or dicts of them); a list of arrays that has as many elements as
      the batch has rows reads both ways and is refused. ``lists="outputs"`` or ``"items"`` says which it is
      (:data:`Lists`);
    * a number, string or 0-d array is a value for the whole batch: refused.

    An output with fewer rows than items, or other than ``padded_size`` rows when given, is an error (naming
    its path in ``outputs``, ``past_key_values[0][1]``, and its shape) rather than a silent misalignment.
    """
    return split_structure(
        outputs, size, lambda value, name: _rows(value, size, padded_size, name), padded_size=padded_size, lists=lists
    )


def _rows(value: Any, size: int, padded_size: int | None, name: str) -> list[Any]:
    if _is_sparse(value):
        return _sparse_rows(value, size, padded_size, name)
    array = np.asarray(value)
    if array.dtype == np.object_ and not array.shape:
        raise TypeError(f"{name} is {a_type(value)}, not an array with one row per item")
    check_rows(array.shape, size, padded_size, name)
    return list(array[:size])


def _is_sparse(value: Any) -> bool:
    """Whether ``value`` is a scipy sparse matrix or array; scipy is never imported for it (none can exist if
    it is not)."""
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and bool(sparse.issparse(value))


def _sparse_rows(value: Any, size: int, padded_size: int | None, name: str) -> list[Any]:
    """Row ``i`` of a 2-D sparse ``value`` for each of the ``size`` items: a 1-row CSR slice, sparse still."""
    shape = tuple(value.shape)
    if len(shape) != 2:
        raise ValueError(
            f"{name} is a {len(shape)}-D sparse {type(value).__name__}, not a matrix with one row per item"
        )
    check_rows(shape, size, padded_size, name)
    csr = value.tocsr()  # rows are slices of CSR; the other formats would copy each one
    return [csr[i : i + 1] for i in range(size)]


@dataclass(frozen=True)
class _Column:
    """One feature's arrays, before padding."""

    arrays: list[_Array]
    dtype: np.dtype[Any]
    pad_sequences: bool
    #: ``arrays`` holds a single array, the whole feature already stacked.
    stacked: bool = False


def _stack_at_once(items: list[Any], dtype: npt.DTypeLike | None) -> dict[Any, _Column] | None:
    """The common case first: one ``np.array`` call per feature over the whole batch (4x faster than an array
    per item on lists of floats); None when an item is ragged, not numbers, or of other features, for
    :func:`select` to find it and name it."""
    if isinstance(items[0], Mapping):
        names = items[0].keys()
        if not all(isinstance(item, Mapping) and item.keys() == names for item in items):
            return None
        values: dict[Any, list[Any]] = {name: [item[name] for item in items] for name in names}
    else:
        values = {None: items}
    columns = {}
    for name, column in values.items():
        try:
            stacked = np.array(column, dtype=dtype)
        except (ValueError, TypeError, OverflowError):
            return None
        # Strings among numbers would all become strings: only arrays of numbers are taken at once.
        if stacked.dtype.kind not in "biufc":
            return None
        columns[name] = _Column([stacked], stacked.dtype, False, stacked=True)
    return columns


def _uniform_column(values: list[Any], dtype: npt.DTypeLike | None, pad: bool) -> list[_Array] | None:
    """``values`` as arrays if they all convert, hold numbers (or all strings) and have one shape (but for the
    first axis when padding); else None."""
    try:
        arrays = [np.asarray(value, dtype=dtype) for value in values]
    except (TypeError, ValueError, OverflowError):
        return None
    kinds = {array.dtype.kind for array in arrays}
    if not (kinds <= _NUMBERS or (len({_KINDS.get(kind) for kind in kinds}) == 1 and kinds <= _KINDS.keys())):
        return None
    if pad:
        if not arrays[0].ndim or len({(array.ndim, array.shape[1:]) for array in arrays}) != 1:
            return None
    elif len({array.shape for array in arrays}) != 1:
        return None
    return arrays


_NUMBERS = frozenset("biufc")
# What numpy promotes into one dtype, besides numbers: strings of any length, datetimes or timedeltas of any unit.
_KINDS = {"U": "strings", "S": "strings", "M": "datetimes", "m": "timedeltas"}


def _convert(
    value: Any, key: Any, index: int, *, dtype: npt.DTypeLike | None, pad: bool
) -> tuple[_Array, Signature, tuple[int, ...]]:
    """One value of an item as an array, with what it must share with its batch: its shape (but for the first
    axis when padding) and whether it holds numbers or strings (numpy promotes the rest)."""
    try:
        array = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as error:
        raise TypeError(f"{describe(key)}: item {index} is not a rectangular array of numbers ({error})") from None
    if array.dtype == np.object_:
        raise TypeError(f"{describe(key)}: item {index} is not a rectangular array of numbers")
    kind = array.dtype.kind
    what = _KINDS.get(kind, "numbers" if kind in _NUMBERS else str(array.dtype))
    shape = pad_signature(array.shape, key, index) if pad else array.shape
    return array, Signature(shape, what), array.shape


def _column(arrays: list[_Array], dtype: npt.DTypeLike | None, pad: bool) -> _Column:
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
