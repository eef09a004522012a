# Token streaming (examples/streaming): continuous batching, static batches and one generation per request under
# closed-loop load, at 1, 8, 32 and 128 streams: python -m benchmarks.streaming; writes reports/streaming.*.
# STREAMING_ARGS passes options through, e.g. `make bench-streaming STREAMING_ARGS='--quick --out /tmp/streaming'`.
.PHONY: bench-streaming

$(VENV)/.bench-streaming-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[numpy,fastapi]' --group bench-streaming
	touch $@

bench-streaming: $(VENV)/.bench-streaming-installed
	$(BIN)/python -m benchmarks.streaming $(STREAMING_ARGS)
