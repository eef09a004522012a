"""Benchmarks: the Keras server load test (``make benchmark``), overhead, adaptive wait, AWS."""
