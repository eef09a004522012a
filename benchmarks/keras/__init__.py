"""The Keras benchmark: the example model behind a tuned server, with and without batching (make benchmark)."""
