"""The head-to-head (``python -m benchmarks.peers``): one Keras model, one FastAPI app shape, one
batcher per variant."""
