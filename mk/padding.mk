# The padding preferred_batch_sizes saves on the Keras benchmark server with buckets: python -m benchmarks.padding;
# writes reports/padding.md and .csv (about 2 minutes). PADDING_ARGS passes options through, e.g.
# `make bench-padding PADDING_ARGS='--users 64 --step-seconds 5'`. The environment is make benchmark's (mk/keras.mk).
.PHONY: bench-padding

bench-padding: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.padding $(PADDING_ARGS)
