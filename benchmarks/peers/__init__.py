"""The head-to-head of issue 14 (``python -m benchmarks.peers``): one Keras model, one FastAPI app shape, one
batcher per variant."""
