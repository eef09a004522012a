"""The framework-free part of the collate helpers (``ml.numpy``, ``ml.torch``): argument checks, bucket sizes,
the choice of the items that go into a batch, shape checks, and the walk over a model's outputs that splits them
per item.

Each helper raises the error a user sees, naming the bad value, so both frameworks word them alike.

This module gathers them from a module per concern: :mod:`~async_batcher.ml._padding` (sequences and buckets),
:mod:`~async_batcher.ml._selection` (the items that go into a batch, and the odd ones),
:mod:`~async_batcher.ml._split` (a model's outputs split per item) and :mod:`~async_batcher.ml._naming` (how
errors name a value).
"""

from __future__ import annotations

from async_batcher.ml._naming import a_type, describe
from async_batcher.ml._padding import (
    PaddingSide,
    PadValue,
    bucket_size,
    check_array_pad_value,
    check_bucketed_batch_size,
    check_buckets,
    check_fill,
    check_pad_value_names,
    check_padding_side,
    pad_signature,
    pad_value_for,
)
from async_batcher.ml._selection import (
    Convert,
    OddItems,
    Selection,
    Signature,
    check_items,
    check_odd_items,
    merge_left_out,
    select,
    uniform,
)
from async_batcher.ml._split import Lists, check_lists, check_rows, split_structure

__all__ = [
    "Convert",
    "Lists",
    "OddItems",
    "PadValue",
    "PaddingSide",
    "Selection",
    "Signature",
    "a_type",
    "bucket_size",
    "check_array_pad_value",
    "check_bucketed_batch_size",
    "check_buckets",
    "check_fill",
    "check_items",
    "check_lists",
    "check_odd_items",
    "check_pad_value_names",
    "check_padding_side",
    "check_rows",
    "describe",
    "merge_left_out",
    "pad_signature",
    "pad_value_for",
    "select",
    "split_structure",
    "uniform",
]
