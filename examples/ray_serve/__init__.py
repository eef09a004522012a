"""The example model on Ray Serve: this package's batcher inside each replica (extra ``[ray]``)."""
