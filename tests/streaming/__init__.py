"""examples/streaming/: the autoregressive model and its FastAPI app streaming server-sent events."""
