"""``python -m benchmarks.openloop`` (``make bench-open-loop``): the head-to-head of ``benchmarks.peers`` (the same
Keras model, app, peers and servers) driven open-loop only: Poisson and on/off arrivals at fractions of the run's
saturation (``ours-greedy``'s open-loop capacity: a ramp of Poisson steps up to its closed-loop maximum) and at
fixed rates, and the mixed scenario. It writes ``reports/open-loop.md``, ``.csv`` and ``.png``. Every option of
``python -m benchmarks.peers`` applies (``--help``); ``--modes closed,open,mixed`` adds wrk's closed loop."""

from __future__ import annotations

import sys

from benchmarks.peers.__main__ import Defaults, main

OPEN_LOOP = Defaults(
    prog="python -m benchmarks.openloop",
    target="bench-open-loop",
    variable="OPENLOOP_ARGS",
    modes="open,mixed",
    shapes="poisson,onoff",
    report="open-loop",
    title="Open loop: one Keras model, one FastAPI app, one batcher per variant",
)

if __name__ == "__main__":
    sys.exit(main(defaults=OPEN_LOOP))
