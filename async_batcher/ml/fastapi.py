"""The FastAPI helpers' earlier path: everything here is :mod:`async_batcher.fastapi`, which new code imports."""

from __future__ import annotations

from async_batcher.fastapi import (
    add_batcher_exception_handlers,
    batcher_dependency,
    batcher_lifespan,
    run_batchers,
)

__all__ = ["add_batcher_exception_handlers", "batcher_dependency", "batcher_lifespan", "run_batchers"]
