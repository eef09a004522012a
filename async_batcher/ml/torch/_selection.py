"""Which items of a batch go into it, as tensors: each value converted (cast to ``dtype``, moved to the target
device), checked against the batch's shape, dtype and device (see ``select``), the odd ones left out or refused."""

from __future__ import annotations

import functools
from typing import Any

import torch

from async_batcher.ml._collate import OddItems, Selection, Signature, describe, pad_signature, select, uniform
from async_batcher.ml.torch._devices import to_device
from async_batcher.ml.torch._stacking import _Padding

__all__ = ["_select"]


def _select(
    items: list[Any], dtype: torch.dtype | None, pad: _Padding | None, target: torch.device | None, odd: OddItems
) -> Selection:
    """The items that stack, as tensors, and the errors of the others (see ``select``)."""
    if (same := uniform(items, functools.partial(_uniform_column, dtype=dtype, pad=pad is not None))) is not None:
        return same
    convert = functools.partial(_convert, dtype=dtype, pad=pad is not None, target=target)
    selection = select(items, convert, odd_items=odd)
    if target is None:
        return selection
    # With a target device, where an item is does not decide whether it stacks: items on several devices are
    # moved to the target one by one (a batch on one device moves in one copy, after stacking).
    devices = {t.device for t in selection.values} | {t.device for c in selection.columns.values() for t in c}
    if len(devices) > 1:
        selection = Selection(
            selection.kept,
            [to_device(t, target) for t in selection.values],
            {key: [to_device(t, target) for t in column] for key, column in selection.columns.items()},
            selection.left_out,
        )
    return selection


def _uniform_column(values: list[Any], dtype: torch.dtype | None, pad: bool) -> list[torch.Tensor] | None:
    """``values`` if they are dense tensors of one shape (but for the first axis when padding), dtype (unless
    ``dtype`` casts them) and device; else None."""
    # Sets over the batch, not one loop comparing each item: half the cost, for the common case.
    # type() is, not isinstance: subclasses (a Parameter, a nested tensor) go the careful way.
    if any(type(value) is not torch.Tensor for value in values):
        return None
    if len({value.device for value in values}) != 1 or len({value.layout for value in values}) != 1:
        return None
    if dtype is None and len({value.dtype for value in values}) != 1:
        return None
    first = values[0]
    if first.layout != torch.strided or first.is_nested:
        return None
    if pad:
        if not first.dim() or len({(value.dim(), value.shape[1:]) for value in values}) != 1:
            return None
    elif len({value.shape for value in values}) != 1:
        return None
    return values if dtype is None else [value.to(dtype) for value in values]


def _convert(
    value: Any, key: Any, index: int, *, dtype: torch.dtype | None, pad: bool, target: torch.device | None
) -> tuple[torch.Tensor, Signature, tuple[int, ...]]:
    """One value of an item as a tensor, with what it must share with its batch: its shape (but for the first
    axis when padding), its dtype (unless ``dtype`` casts it) and its device (unless there is a target)."""
    if isinstance(value, torch.Tensor):
        tensor = value
        if target is not None and tensor.device != target and tensor.device.type != "cpu":
            # On another accelerator: moved alone (a CPU tensor waits, to move with the batch in one copy).
            try:
                tensor = tensor.to(target)
            except (RuntimeError, NotImplementedError) as error:
                raise ValueError(
                    f"{describe(key)}: item {index} on {tensor.device} cannot be moved to {target}: {error}"
                ) from None
        if dtype is not None:
            tensor = tensor.to(dtype)
    else:
        try:
            tensor = torch.as_tensor(value, dtype=dtype)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise TypeError(f"{describe(key)}: item {index} is not a rectangular array of numbers ({exc})") from None
    if tensor.layout != torch.strided or tensor.is_nested:
        raise TypeError(f"{describe(key)}: item {index} is a {tensor.layout} tensor; items must be dense")
    shape = tuple(tensor.shape)
    signature = Signature(
        pad_signature(shape, key, index) if pad else shape,
        tensor.dtype if dtype is None else None,
        tensor.device if target is None else None,
    )
    return tensor, signature, shape
