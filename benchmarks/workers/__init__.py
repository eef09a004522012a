"""The Keras example server with 1 worker, 2 workers batching alone and 2 workers sharing one batcher, under the same
load: ``python -m benchmarks.workers`` (``make benchmark-workers``), reports/workers.md.

Each **variant** is the benchmark server (``benchmarks/keras/server.py``, started as ``benchmarks/run.py`` starts
it) with ``--workers 1``, ``--workers 2``, or ``--workers 2 --shared`` (one ``SharedBatcher``, one model, in the
worker that starts first). Each is loaded, on ``/optimized_predict``, by

- **locust**, closed loop, ``--users`` users (the same steps as ``make benchmark``);
- **wrk**, closed loop, as many connections as users (a compiled generator: it leaves the server more CPU);
- **open loop** (``benchmarks/openloop/generate.py``): Poisson arrivals at fixed rates, latency from each request's
  intended send time (no coordinated omission); by default at fractions of the 1-worker variant's best closed-loop
  rate.

For each step: requests/s, p50 and p99, failures, and the items per model call read from ``/metrics`` before and
after (the histograms of every worker added up; with the shared batcher there is one batcher, written by its owner
only). For each variant: the resident memory of all the server's processes summed (RSS, and PSS where
``/proc/<pid>/smaps_rollup`` is readable: shared pages counted once), after each step, the most kept. The report
says whether issue 51's targets are met (:mod:`benchmarks.workers.report`). Traffic to 127.0.0.1 only, each step
bounded in time.
"""
