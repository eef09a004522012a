"""``python -m benchmarks.shared``: the shared batcher's own cost (async_batcher.shared), on a no-op model.

- **throughput**: items/s through one owner process with 1..N client processes, each keeping ``--callers``
  callers busy in a closed loop; and the owner's CPU time per item (its user + system time over the items);
- **latency**: one caller awaiting one item after the other, p50 and p99 of a round trip through a client (the hop
  over the socket) against the owner's own caller (no hop), both with ``max_queue_time=0``;
- **transfer**: numpy arrays of 1 KB .. 64 MB as items: pickle protocol 5 with the array out of band over the
  socket (what the shared batcher does) against shared memory (the array copied into a
  ``multiprocessing.shared_memory`` block, its name sent, the owner's model reading it in place).

Each process a fresh interpreter (``multiprocessing``'s spawn); ``--loop uvloop`` runs every process on uvloop.
Figures are wall-clock: on a loaded machine, say so (``--seconds`` longer evens the load out).
"""
