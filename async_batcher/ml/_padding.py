"""Padding, checked: of each sequence to the longest of its batch (the side, the pad values and whether a dtype
holds them, the shape an item shares with the batch), and of a batch to a bucket size."""

from __future__ import annotations

import cmath
from collections.abc import Collection, Mapping
from typing import Any, Literal, TypeAlias

from async_batcher._checks import plural
from async_batcher.ml._naming import describe

__all__ = [
    "PadValue",
    "PaddingSide",
    "bucket_size",
    "check_array_pad_value",
    "check_bucketed_batch_size",
    "check_buckets",
    "check_fill",
    "check_pad_value_names",
    "check_padding_side",
    "pad_signature",
    "pad_value_for",
]

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
    """The rows of a batch of ``size`` items: ``size``, or the smallest bucket that holds it (0 for no item)."""
    if buckets is None or size == 0:
        return size
    fitting = [b for b in check_buckets(buckets) if b >= size]
    if not fitting:
        raise ValueError(f"a batch of {plural(size, 'item')} is larger than the largest bucket size {max(buckets)}")
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


def check_array_pad_value(pad_value: PadValue) -> int | float | bool:
    """The pad value of items that are not dicts: a mapping of feature names makes no sense for them."""
    if isinstance(pad_value, Mapping):
        raise TypeError("a pad_value mapping names features of dict items; these items are not dicts")
    return pad_value


def check_pad_value_names(pad_value: PadValue, names: Collection[Any]) -> None:
    """Refuse a ``pad_value`` mapping that names a feature the items do not have (a misspelt name would pad
    with 0 silently)."""
    if isinstance(pad_value, Mapping) and (unknown := set(pad_value) - set(names)):
        raise ValueError(f"pad_value names features the items do not have: {sorted(map(str, unknown))}")


def pad_value_for(pad_value: PadValue, key: str) -> int | float | bool:
    """The pad value of feature ``key``."""
    if isinstance(pad_value, Mapping):
        return pad_value.get(key, 0)
    return pad_value


def pad_signature(shape: tuple[int, ...], key: Any, index: int) -> tuple[int | None, ...]:
    """The shape an item's value shares with the batch when sequences are padded: any first axis."""
    if not shape:
        raise ValueError(f"{describe(key)}: item {index} is a scalar; pad_sequences needs a sequence axis")
    return (None, *shape[1:])


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
