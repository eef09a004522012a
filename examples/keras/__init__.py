"""The Keras example: a model behind FastAPI, concurrent requests batched into one model call."""
