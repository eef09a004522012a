# The dispatch simulator: python -m benchmarks.policy (docs/guides/benchmarks.md, "Dispatch policy on a simulated
# server"). Every scenario through the README's settings, the constructor's defaults, a grid of fixed settings, the
# candidates for the default and the peers, on a virtual-time event loop whose one core the loop and the model share
# (--cores 2: a core each); writes reports/policy.{md,csv}. The peers run in the environments of
# make bench-overhead under .cache/peers/ (built on first use: pip, needs PyPI); the cost constants are
# benchmarks/policy/costs.json (python -m benchmarks.policy.measure measures them again: wrk and TensorFlow, about a
# minute). POLICY_ARGS passes options through, e.g. `make bench-policy POLICY_ARGS=--quick` or
# `make bench-policy POLICY_ARGS="--variant 'hold2ms:max_queue_time=0,max_hold_time=0.002'"`.
.PHONY: bench-policy

bench-policy: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.policy $(POLICY_ARGS)
