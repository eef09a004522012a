"""Keras integration: :class:`~async_batcher.ml.keras.model.KerasAsyncBatcher`.

Extra ``[keras]``: it installs numpy only. The model, Keras and its backend (TensorFlow, JAX, PyTorch) are yours.
"""

from __future__ import annotations

from async_batcher.ml.keras.model import KerasAsyncBatcher

__all__ = ["KerasAsyncBatcher"]
