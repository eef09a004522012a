"""The example model alone: the time of one step at several batch sizes, and of a prefill.

``python -m benchmarks.streaming.timing`` prints JSON; the streaming benchmark runs it in a process of its own
with the server's thread settings, and puts the figures in its report. Best of a few repetitions each.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from examples.streaming.model import CharModel

__all__ = ["time_model"]


def _best(fn: Any, repeats: int = 5, calls: int = 20) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def time_model(sizes: tuple[int, ...] = (1, 8, 32, 128)) -> dict[str, Any]:
    model = CharModel()
    steps = {}
    for n in sizes:
        states, tokens = np.zeros((model.layers, n, model.width)), np.arange(n) % 256
        steps[n] = 1000 * _best(lambda states=states, tokens=tokens: model.step(states, tokens))
    prompt = b"the a stream of tokens"
    return {
        "layers": model.layers,
        "width": model.width,
        "step_ms": steps,
        "prefill_ms": {"bytes": len(prompt), "ms": 1000 * _best(lambda: model.prefill([prompt]))},
    }


if __name__ == "__main__":
    print(json.dumps(time_model()))
