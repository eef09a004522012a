"""The overhead benchmark: what the batcher itself costs; run it as ``python -m benchmarks.overhead``."""
