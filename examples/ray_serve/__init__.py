"""The example model on Ray Serve: this package's batcher inside each replica (``pip install "ray[serve]>=2.40"``)."""
