"""scikit-learn integration (extra ``[sklearn]``): :class:`~async_batcher.ml.sklearn.model.SklearnAsyncBatcher`."""

from __future__ import annotations

from async_batcher.ml.sklearn.model import SklearnAsyncBatcher

__all__ = ["SklearnAsyncBatcher"]
