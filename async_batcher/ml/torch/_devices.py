"""Where tensors go: a ``device`` argument made a ``torch.device`` (a ValueError naming it otherwise), and a tensor
moved there, pinned first when that makes the copy to an accelerator asynchronous."""

from __future__ import annotations

from typing import TypeAlias

import torch

__all__ = ["_Device", "_as_device", "to_device"]

_Device: TypeAlias = "torch.device | str | int"


def to_device(
    tensor: torch.Tensor, device: torch.device | None, *, non_blocking: bool = False, pin_memory: bool = False
) -> torch.Tensor:
    """``tensor`` on ``device`` (unchanged if None or already there); pinned first when ``pin_memory`` and it
    moves from the CPU to an accelerator."""
    if device is None or tensor.device == device:
        return tensor
    if pin_memory and tensor.device.type == "cpu" and device.type not in ("cpu", "meta"):
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=non_blocking)


def _as_device(device: _Device) -> torch.device:
    if isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from None
