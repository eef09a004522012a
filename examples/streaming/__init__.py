"""The streaming example: a small autoregressive model behind FastAPI, every stream stepped in one batch."""
