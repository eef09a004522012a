"""Split a model's batched outputs into per-item tensors (``split_outputs``): views of the real rows, on their device
or another one, each sequence output cut back to its item's length on request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from async_batcher._checks import plural
from async_batcher.ml._collate import Lists, PaddingSide, a_type, check_padding_side, check_rows, split_structure
from async_batcher.ml.torch._devices import _as_device, _Device, to_device

__all__ = ["split_outputs"]


def split_outputs(
    outputs: Any,
    size: int,
    *,
    padded_size: int | None = None,
    lengths: torch.Tensor | None = None,
    padding_side: PaddingSide = "right",
    device: _Device | None = None,
    lists: Lists = "auto",
) -> list[Any]:
    """Split a model's batched ``outputs`` into ``size`` per-item results, dropping any padding rows.

    What is split, and how (the rule of ``ml.numpy``'s ``split_outputs`` too):

    * a tensor has the items on its first axis: item ``i`` gets row ``i``, a view of it on its device (or on
      ``device``); a nested tensor gives item ``i`` its ``i``-th tensor; a numpy array or anything else
      ``torch.as_tensor`` takes that is not a Python container or scalar is made a tensor first; a sparse
      tensor is refused (``.to_dense()`` it in ``predict_fn``);
    * a dict, a tuple, a namedtuple or a dataclass holds several outputs, by name or position, each split in
      turn: item ``i`` gets the same structure, at any depth. A transformers ``ModelOutput`` (a dataclass) is
      rebuilt with ``dataclasses.replace``, so ``result.logits`` works; a plain mapping becomes a ``dict``;
      ``{"logits": ..., "past_key_values": ((k, v), ...)}`` gives item ``i`` its logits and its ``(k, v)`` rows;
    * ``None`` is ``None`` for every item (an optional output the model did not compute);
    * a list holds several outputs when it holds tensors, and one element per item when it holds only plain
      Python values (numbers, strings, lists or dicts of them); a list of tensors that has as many elements
      as the batch has rows reads both ways and is refused. ``lists="outputs"`` or ``"items"`` says which it
      is (:data:`Lists`); elements read per item are handed out as they are;
    * a number, string or 0-d tensor is a value for the whole batch (a loss): refused.

    With ``lengths`` (one per row), each row is cut on axis 1 to its item's length, from the start or
    (``padding_side="left"``) from the end; an output whose axis 1 is not the padded sequence axis is then an
    error. An output with fewer rows than items, or other than ``padded_size`` rows when given, is an error
    (naming its path in ``outputs``, ``past_key_values[0][1]``, and its shape) rather than a silent
    misalignment.
    """
    side = check_padding_side(padding_side)
    target = None if device is None else _as_device(device)
    keep = None if lengths is None else _kept_lengths(lengths, size)
    longest = 0 if lengths is None or not len(lengths) else int(lengths.max())

    def rows(value: Any, name: str) -> Sequence[Any]:
        tensor = value if isinstance(value, torch.Tensor) else _output_tensor(value, name)
        if tensor.is_nested:
            check_rows((tensor.size(0), *([1] if tensor.dim() > 1 else [])), size, padded_size, name)
            nested = to_device(tensor, target).unbind(0)[:size]
            return nested if keep is None else _trimmed(nested, keep, None, side, name)
        if tensor.layout != torch.strided:
            raise TypeError(
                f"{name} is a sparse tensor ({tensor.layout}): splitting it per item is not supported; make it"
                " dense (.to_dense()) in predict_fn"
            )
        check_rows(tuple(tensor.shape), size, padded_size, name)
        if keep is None:
            return to_device(tensor[:size], target).unbind(0)
        if tensor.dim() < 2 or tensor.shape[1] != longest:
            raise ValueError(
                f"cannot trim {name} of shape {tuple(tensor.shape)}: its axis 1 is not the padded sequence axis"
                f" ({longest} positions)"
            )
        return _trimmed(to_device(tensor[:size], target).unbind(0), keep, longest, side, name)

    return split_structure(outputs, size, rows, padded_size=padded_size, lists=lists)


def _trimmed(
    per_item: Sequence[torch.Tensor], keep: list[int], longest: int | None, side: PaddingSide, name: str
) -> list[torch.Tensor]:
    """Each row cut to its item's length on its first axis (axis 1 of the batch): the start of it, or the end
    with left padding."""
    if longest is None:
        raise ValueError(f"cannot trim {name}, a nested tensor: its rows have no padded sequence axis")
    if side == "right":
        return [row[:n] for row, n in zip(per_item, keep, strict=True)]
    return [row[longest - n :] for row, n in zip(per_item, keep, strict=True)]


def _output_tensor(value: Any, name: str) -> torch.Tensor:
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} is {a_type(value)}, not a tensor with one row per item") from None


def _kept_lengths(lengths: torch.Tensor, size: int) -> list[int]:
    """The lengths of the ``size`` real items, as ints."""
    if lengths.dim() != 1 or len(lengths) < size:
        raise ValueError(
            f"lengths of shape {tuple(lengths.shape)} do not give one length for each of {plural(size, 'item')}"
        )
    return [int(n) for n in lengths[:size].tolist()]
