"""The framework-free part of the collate helpers (``ml.numpy``, ``ml.torch``): argument checks, bucket sizes,
dict features, shape checks, and the walk over a model's outputs that splits them per item.

Each helper raises the error a user sees, naming the bad value, so both frameworks word them alike.
"""

from __future__ import annotations

import cmath
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, TypeAlias

#: A pad value for every feature, or one per feature name (dict inputs); features not named get 0.
PadValue: TypeAlias = "int | float | bool | Mapping[str, int | float | bool]"
#: Where padding goes: after each sequence (``"right"``, for encoders) or before it (``"left"``, for
#: decoder-only models, which read their next token off the last position).
PaddingSide: TypeAlias = Literal["right", "left"]


def check_buckets(buckets: Collection[int]) -> tuple[int, ...]:
    """``buckets`` sorted, after checking that they are a non-empty collection of positive ints."""
    if not buckets or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in buckets):
        raise ValueError(f"buckets must be positive ints, got {buckets!r}")
    return tuple(sorted(buckets))


def bucket_size(size: int, buckets: Collection[int] | None) -> int:
    """The rows of a batch of ``size`` items: ``size``, or the smallest bucket that holds it."""
    if buckets is None:
        return size
    fitting = [b for b in check_buckets(buckets) if b >= size]
    if not fitting:
        raise ValueError(f"a batch of {size} items is larger than the largest bucket size {max(buckets)}")
    return min(fitting)


def check_bucketed_batch_size(buckets: Collection[int] | None, max_batch_size: int) -> tuple[int, ...] | None:
    """A batcher's ``buckets`` sorted, after checking that its ``max_batch_size`` is set and fits the largest."""
    if buckets is None:
        return None
    checked = check_buckets(buckets)
    if max_batch_size < 1 or max_batch_size > checked[-1]:
        raise ValueError(
            f"with buckets {checked} max_batch_size must be set and fit in the largest bucket, got {max_batch_size}"
        )
    return checked


def check_padding_side(padding_side: object) -> PaddingSide:
    """``padding_side`` if it is ``"right"`` or ``"left"``; a ValueError naming it otherwise."""
    if padding_side == "right" or padding_side == "left":
        return padding_side
    raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")


def check_items(items: Sequence[Any]) -> list[Any]:
    """``items`` as a list, refusing an empty batch."""
    items = list(items)
    if not items:
        raise ValueError("cannot collate an empty batch")
    return items


def common_keys(items: list[Any], pad_value: PadValue) -> list[str]:
    """The feature names of dict ``items`` (the first item's order), checking that every item has the same ones
    and that a ``pad_value`` mapping names no other feature (a misspelt name would pad with 0 silently)."""
    keys = list(items[0])
    expected = set(keys)
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TypeError(f"item 0 is a mapping but item {index} is a {type(item).__name__}")
        if set(item) != expected:
            missing = sorted(map(str, expected - set(item)))
            extra = sorted(map(str, set(item) - expected))
            raise ValueError(f"item {index} has other features than item 0: missing {missing}, unexpected {extra}")
    if isinstance(pad_value, Mapping) and (unknown := set(pad_value) - expected):
        raise ValueError(f"pad_value names features the items do not have: {sorted(map(str, unknown))}")
    return keys


def check_array_pad_value(pad_value: PadValue) -> int | float | bool:
    """The pad value of items that are not dicts: a mapping of feature names makes no sense for them."""
    if isinstance(pad_value, Mapping):
        raise TypeError("a pad_value mapping names features of dict items; these items are not dicts")
    return pad_value


def pad_value_for(pad_value: PadValue, key: str) -> int | float | bool:
    """The pad value of feature ``key``."""
    if isinstance(pad_value, Mapping):
        return pad_value.get(key, 0)
    return pad_value


def describe(key: str | None) -> str:
    """How error messages name the values of one feature: ``items``, or ``feature 'ids'``."""
    return "items" if key is None else f"feature {key!r}"


def check_shapes(shapes: Sequence[tuple[int, ...]], key: str | None, *, pad: bool) -> None:
    """Refuse shapes that cannot be stacked: all equal, or (``pad``) equal but for a first axis every item has."""
    what = describe(key)
    first = shapes[0]
    for index, shape in enumerate(shapes):
        if pad:
            if not shape:
                raise ValueError(f"{what}: item {index} is a scalar; pad_sequences needs a sequence axis")
            if shape[1:] != first[1:]:
                raise ValueError(
                    f"cannot pad {what}: item 0 has shape {first} but item {index} has shape {shape}"
                    " (only the first axis may differ)"
                )
        elif shape != first:
            raise ValueError(
                f"cannot stack {what} of different shapes: item 0 has shape {first}, item {index} has shape {shape}"
            )


def check_fill(pad_value: int | float | bool, fill: Any, *, floating: bool, dtype: object, key: str | None) -> None:
    """Refuse a pad value that its dtype changed into ``fill``: a float in an int tensor, -1 in uint8, 300 in
    int8, 2 in bool, 1e40 in float32. A float dtype may round the value (0.1 in float32) but not overflow it."""
    try:
        exact = (cmath.isfinite(fill) or not cmath.isfinite(pad_value)) if floating else bool(fill == pad_value)
    except (TypeError, ValueError):
        exact = False
    if not exact:
        what = "" if key is None else f" of feature {key!r}"
        raise ValueError(f"pad value {pad_value!r}{what} cannot be represented in dtype {dtype}")


def check_rows(shape: tuple[int, ...], size: int, padded_size: int | None, name: str) -> None:
    """Refuse an output of ``shape`` that does not hold one row per item (and per padding row)."""
    if not shape:
        raise ValueError(f"{name} is a scalar, not a batch of {size} rows")
    if padded_size is not None and shape[0] != padded_size:
        raise ValueError(f"{name} has {shape[0]} rows for a batch of {padded_size} rows")
    if shape[0] < size:
        raise ValueError(f"{name} has {shape[0]} rows for {size} items")


def split_structure(outputs: Any, size: int, rows: Callable[[Any, str], Sequence[Any]]) -> list[Any]:
    """Split ``outputs`` (one batched value, or a dict / list / tuple of them) into ``size`` per-item results.

    ``rows(value, name)`` gives the first ``size`` rows of one batched value (``name`` is for its errors); the
    result for item ``i`` has the structure of ``outputs`` with row ``i`` of each value.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if isinstance(outputs, Mapping):
        columns = {key: rows(value, repr(key)) for key, value in outputs.items()}
        return [{key: column[i] for key, column in columns.items()} for i in range(size)]
    if isinstance(outputs, list | tuple):
        parts = [rows(value, f"output {n}") for n, value in enumerate(outputs)]
        if hasattr(outputs, "_fields"):  # a namedtuple takes its fields as arguments
            return [type(outputs)(*(part[i] for part in parts)) for i in range(size)]
        return [type(outputs)(part[i] for part in parts) for i in range(size)]
    return list(rows(outputs, "the output"))
