"""When a batch fails: isolate the bad item, retry only what failed, split on out-of-memory.

Batching multiplies the blast radius of one bad input and of one oversized moment: one malformed row fails every
caller of its batch, one throttled call fails items that would succeed a second later, one long input makes a batch
run out of memory. Three keywords of :class:`~async_batcher.AsyncBatcher` (and ``@batch``), each off by default:

.. code-block:: python

    import httpx
    import torch
    from async_batcher import AsyncBatcher
    from async_batcher.failures import Isolate, Retry, RetryPolicy, SplitOn

    class Embedder(AsyncBatcher[str, list[float]]):
        async def process_batch(self, batch):
            ...  # an element Retry(error) for an item throttled, an Exception for an item refused

    dead_letters = []  # (item, error) of each item that failed alone

    embedder = Embedder(
        retry=RetryPolicy(attempts=5, retry_on=(httpx.ReadTimeout,)),  # transient failures tried again
        # a batch that raises: bisected to its bad items, each seen by on_poison(item, error)
        on_batch_error=Isolate(on_poison=lambda item, error: dead_letters.append((item, error))),
        split_on=SplitOn(torch.OutOfMemoryError, MemoryError),  # a batch out of memory: split, its size learned
    )

The guide: docs/guides/failures.md.
"""

from __future__ import annotations

from async_batcher._core.failures import (
    ErrorMatcher,
    Isolate,
    Retry,
    RetryBudget,
    RetryPolicy,
    SplitOn,
    matches,
    out_of_memory,
)
from async_batcher.exceptions import TransientError

__all__ = [
    "ErrorMatcher",
    "Isolate",
    "Retry",
    "RetryBudget",
    "RetryPolicy",
    "SplitOn",
    "TransientError",
    "matches",
    "out_of_memory",
]
