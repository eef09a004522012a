# The Keras benchmark: `make benchmark` load-tests benchmarks/keras/server.py with locust and writes
# reports/keras.md. Its .venv gets the library's extras the server imports and the bench-keras group (TensorFlow,
# locust); the test-all group holds what tests/keras needs.
.PHONY: benchmark benchmark-report

$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[keras,fastapi,metrics]' --group bench-keras
	touch $@

# BENCH_ARGS passes options through, e.g. make benchmark BENCH_ARGS='--step-seconds 60 --users 16,64,256'
benchmark: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

# Render reports/keras.md again from the last run's reports/keras/results.json.
benchmark-report: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.report
