"""One batcher for the processes of a machine, without a model server: :class:`SharedBatcher`.

.. code-block:: python

    from async_batcher.shared import SharedBatcher

    predictor = SharedBatcher(make_predictor, name="predictor")  # make_predictor() runs in the owner only

    async with predictor:                                        # in each worker's lifespan
        y = await predictor.process(x, timeout=1.0)              # batched with every worker's callers

The first process to start owns the batcher (a lock file elects it) and serves it on a Unix socket (owner-only
permissions, an HMAC challenge with a key); the others send it their items, gathered per loop turn into one
message, and get their outcomes back the same way. When the owner stops, it drains and a client takes over; when it
dies, the items it had put in a batch fail with :class:`~async_batcher.OutcomeUnknownError` and the others go to the
next owner. :class:`Sharing` holds the settings (address, role, key, limits), also for ``@batch(shared=...)``; ``python
-m async_batcher.serve module:factory`` runs a dedicated owner. The guide: "Past one process".
"""

from __future__ import annotations

from async_batcher.shared._batcher import SharedBatcher
from async_batcher.shared._sharing import Sharing

__all__ = ["SharedBatcher", "Sharing"]
