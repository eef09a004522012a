"""PyTorch integration (extra ``[torch]``): collate and split torch tensors, and batch a torch model.

* :func:`~async_batcher.ml.torch.tensors.collate` / :class:`~async_batcher.ml.torch.tensors.Batch`: the
  torch twin of :mod:`async_batcher.ml.numpy` (same names and arguments, plus ``padding_side`` and ``device``).
* :class:`~async_batcher.ml.torch.model.TorchAsyncBatcher`: many concurrent single-item awaits become one
  model call, under ``torch.inference_mode()`` in the executor.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:
    raise ImportError("async_batcher.ml.torch needs PyTorch: pip install 'async-batcher[torch]'") from exc

from async_batcher.ml.torch.model import TorchAsyncBatcher
from async_batcher.ml.torch.tensors import (
    Batch,
    Lists,
    OddItems,
    PaddingSide,
    PadValue,
    check_buckets,
    collate,
    split_outputs,
    to_device,
)

__all__ = [
    "Batch",
    "Lists",
    "OddItems",
    "PadValue",
    "PaddingSide",
    "TorchAsyncBatcher",
    "check_buckets",
    "collate",
    "split_outputs",
    "to_device",
]
