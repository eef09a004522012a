# The open-loop benchmark: python -m benchmarks.openloop (docs/guides/benchmarks.md, "Open loop"). The servers and
# peers of make bench-peers (their venvs under .cache/peers-server/, built on first use: pip, needs PyPI), driven by
# benchmarks/openloop/generate.py: Poisson and on/off arrivals at fractions of ours-greedy's open-loop capacity
# (a ramp of Poisson steps, first), latency from each request's intended send time, and the mixed scenario. It writes reports/open-loop.{md,csv,png}.
# OPENLOOP_ARGS passes options through, e.g. `make bench-open-loop OPENLOOP_ARGS=--quick` or
# `make bench-open-loop OPENLOOP_ARGS='--ours adaptive:max_latency=0.025 --rates 1000,3000,6000'`.
.PHONY: bench-open-loop

bench-open-loop: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.openloop $(OPENLOOP_ARGS)
