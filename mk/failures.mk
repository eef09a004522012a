# What the failure handling costs (issue 45): python -m benchmarks.failures, on the virtual clock; writes
# reports/failures.md.
.PHONY: bench-failures

bench-failures: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.failures
