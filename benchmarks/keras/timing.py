"""Time the example model's three ways of predicting at several batch sizes (the report's model table).

``python -m benchmarks.keras.timing [--json PATH]``: per batch size, the median and p95 latency of
``model.predict``, ``model.predict_on_batch`` and the concrete function the server calls, on TensorFlow
thread pools sized as the server sizes them. Run it apart from the load test: it keeps a core busy.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from benchmarks.keras import model as example_model

__all__ = ["main", "measure"]


def _percentiles(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return times[len(times) // 2] * 1e3, times[min(len(times) - 1, int(len(times) * 0.95))] * 1e3


def measure(sizes: list[int], reps: int, *, hidden_layers: int, intra_op: int, inter_op: int) -> list[dict[str, Any]]:
    """One row per (method, batch size): p50_ms, p95_ms and per_item_us (the median over the batch size)."""
    example_model.configure_threads(intra_op, inter_op)
    model = example_model.load_or_train(example_model.ModelSpec(hidden_layers=hidden_layers))
    compiled = example_model.compiled_predict(model)
    inputs = example_model.sample_inputs(max(sizes))
    methods: dict[str, tuple[Callable[[Any], Any], int]] = {
        # model.predict costs tens of ms a call: a few repetitions tell it.
        "model.predict": (lambda x: model.predict(x, verbose=0), max(5, reps // 20)),
        "model.predict_on_batch": (model.predict_on_batch, reps),
        "concrete function (the server's)": (lambda x: compiled(x).numpy(), reps),
    }
    rows = []
    for size in sizes:
        batch = inputs[:size]
        times: dict[str, list[float]] = {name: [] for name in methods}
        for fn, _ in methods.values():
            fn(batch)  # the first call of a new shape may trace
        # Round-robin, so that a burst of load from elsewhere on the machine hits every method alike.
        for rep in range(reps):
            for name, (fn, n) in methods.items():
                if rep < n:
                    start = time.perf_counter()
                    fn(batch)
                    times[name].append(time.perf_counter() - start)
        for name in methods:
            p50, p95 = _percentiles(times[name])
            rows.append(
                {"method": name, "batch_size": size, "p50_ms": p50, "p95_ms": p95, "per_item_us": p50 * 1e3 / size}
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras.timing", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,8,32,128,256", help="batch sizes, comma-separated")
    parser.add_argument("--reps", type=int, default=200, help="calls timed per size")
    parser.add_argument("--hidden-layers", type=int, default=example_model.ModelSpec.hidden_layers)
    parser.add_argument("--tf-intra-op-threads", type=int, default=1)
    parser.add_argument("--tf-inter-op-threads", type=int, default=1)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if not sizes or min(sizes) < 1 or args.reps < 1:
        parser.error("batch sizes and --reps must be positive")
    rows = measure(
        sizes,
        args.reps,
        hidden_layers=args.hidden_layers,
        intra_op=args.tf_intra_op_threads,
        inter_op=args.tf_inter_op_threads,
    )
    print(f"{'method':24} {'batch':>6} {'p50 ms':>8} {'p95 ms':>8} {'µs/item':>9}")
    for r in rows:
        print(f"{r['method']:24} {r['batch_size']:>6} {r['p50_ms']:>8.3f} {r['p95_ms']:>8.3f} {r['per_item_us']:>9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
