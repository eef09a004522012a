# The overhead benchmark on pyperf: python -m benchmarks.overhead (docs/guides/benchmarks.md, "Overhead: what the
# batcher itself costs"). It builds one virtual environment per published peer, with pyperf, under .cache/peers/
# (pip, needs PyPI) on first use.
# OVERHEAD_ARGS passes options through, e.g. `make bench-overhead OVERHEAD_ARGS=--quick`.
.PHONY: bench-overhead bench-overhead-quick

$(VENV)/.bench-overhead-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e . --group bench
	touch $@

bench-overhead: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.overhead $(OVERHEAD_ARGS)

bench-overhead-quick: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.overhead --quick $(OVERHEAD_ARGS)

# The instruction counts (python -m benchmarks.overhead.instructions, and their test in make test-all) need
# valgrind, Debian's package: tools/check_prereqs.py checks it before make test-all. bench-overhead-instructions
# writes them into reports/overhead.md, as its section of instruction counts (about 15 minutes);
# INSTRUCTIONS_ARGS passes options through, e.g. INSTRUCTIONS_ARGS='--shapes executor --impls floor,ours'.
.PHONY: bench-overhead-instructions

bench-overhead-instructions: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.overhead.instructions --write reports/overhead.md $(INSTRUCTIONS_ARGS)
