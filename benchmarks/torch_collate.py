"""What ``async_batcher.ml.torch.collate`` costs per batch, against plain torch and ``ml.numpy.collate``.

Run: ``python -m benchmarks.torch_collate`` (needs torch and numpy). One intra-op thread, so that the figures
do not depend on what else the machine runs; the best of 5 runs of 200 calls each, in microseconds per call.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from async_batcher.ml.numpy import collate as numpy_collate
from async_batcher.ml.torch import collate


def cases() -> list[tuple[str, Callable[[], Any]]]:
    rng = np.random.default_rng(0)
    lists = [[float(i)] * 10 for i in range(64)]
    vectors = [torch.randn(10) for _ in range(64)]
    ids = [torch.randint(0, 100, (int(n),)) for n in rng.integers(1, 128, 64)]
    return [
        ("64 tensors (10,): ml.torch.collate", lambda: collate(vectors)),
        ("64 tensors (10,): torch.stack", lambda: torch.stack(vectors)),
        ("64 lists of 10 floats: ml.torch.collate", lambda: collate(lists)),
        ("64 lists of 10 floats: ml.torch.collate(dtype=float32)", lambda: collate(lists, dtype=torch.float32)),
        ("64 lists of 10 floats: ml.numpy.collate", lambda: numpy_collate(lists)),
        ("64 id tensors, lengths 1-127: ml.torch.collate, pad right", lambda: collate(ids, pad_sequences=True)),
        (
            "64 id tensors, lengths 1-127: ml.torch.collate, pad left",
            lambda: collate(ids, pad_sequences=True, padding_side="left"),
        ),
        (
            "64 id tensors, lengths 1-127: torch pad_sequence (no mask)",
            lambda: torch.nn.utils.rnn.pad_sequence(ids, batch_first=True),
        ),
        ("64 id tensors, lengths 1-127: ml.numpy.collate, pad", lambda: numpy_collate(ids, pad_sequences=True)),
    ]


def main() -> None:
    torch.set_num_threads(1)
    for name, call in cases():
        best = min(timeit.repeat(call, number=200, repeat=5)) / 200
        print(f"{name:60s} {best * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
