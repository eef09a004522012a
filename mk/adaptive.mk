# The adaptive wait against fixed waits: python -m benchmarks.adaptive; writes reports/adaptive.*.
# ADAPTIVE_ARGS passes options through, e.g. `make bench-adaptive ADAPTIVE_ARGS=--quick`.
.PHONY: bench-adaptive

bench-adaptive: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.adaptive $(ADAPTIVE_ARGS)
