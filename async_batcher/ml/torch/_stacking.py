"""Stacking the tensors of one feature: in one tensor, or padded to the longest sequence of the batch (on the right
or on the left) with the attention mask and the lengths; the rows of a batch padded up to a bucket size; a pad value
checked against the dtype it fills."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from async_batcher.ml._collate import PaddingSide, check_fill

__all__ = ["_Padding", "_pad_rows", "_stack"]


@dataclass(frozen=True)
class _Padding:
    """How collate pads sequences: the side, and the dtype of the mask."""

    side: PaddingSide
    mask_dtype: torch.dtype


def _stack(
    tensors: list[torch.Tensor], key: str | None, pad: _Padding | None, pad_value: int | float | bool
) -> list[torch.Tensor]:
    """One feature's tensors (of one shape, dtype and device, but for the first axis when padding) stacked:
    ``[stacked]``, or with ``pad`` ``[padded, mask, lengths]``."""
    first = tensors[0]
    if pad is None:
        return [torch.stack(tensors)]
    fill = _fill_value(pad_value, first.dtype, key)
    sizes = [t.shape[0] for t in tensors]
    longest = max(sizes)
    lengths = torch.tensor(sizes, dtype=torch.int64, device=first.device)
    positions = torch.arange(longest, device=first.device)[None, :]
    if pad.side == "right":
        mask = positions < lengths[:, None]
    else:
        mask = positions >= (longest - lengths)[:, None]
    padded = torch.full((len(tensors), longest, *first.shape[1:]), fill, dtype=first.dtype, device=first.device)
    # One copy for the whole batch: the positions the mask holds, in order, are where the items' data goes, row
    # by row, whichever side the padding is on. (masked_scatter_, not padded[mask] = ...: 100x faster on a CPU.)
    padded.masked_scatter_(mask.view(*mask.shape, *[1] * (first.dim() - 1)).expand_as(padded), torch.cat(tensors))
    return [padded, mask.to(pad.mask_dtype), lengths]


def _pad_rows(tensor: torch.Tensor, padded_size: int) -> torch.Tensor:
    """``tensor`` with its last row repeated up to ``padded_size`` rows."""
    extra = padded_size - len(tensor)
    if not extra:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(extra, *tensor.shape[1:])])


def _fill_value(pad_value: int | float | bool, dtype: torch.dtype, key: str | None) -> int | float | bool | complex:
    """``pad_value`` in ``dtype``, refusing a value it would change (see ``check_fill``)."""
    try:
        exact = torch.tensor(pad_value, dtype=torch.float64 if isinstance(pad_value, float) else None)
        fill: Any = exact.to(dtype).item()
    except (OverflowError, RuntimeError, TypeError, ValueError):
        fill = None
    check_fill(pad_value, fill, floating=dtype.is_floating_point or dtype.is_complex, dtype=dtype, key=key)
    return fill  # type: ignore[no-any-return]
