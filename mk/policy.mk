# The dispatch simulator: python -m benchmarks.policy (docs/guides/benchmarks.md, "Dispatch policy on a simulated
# server"). Every scenario at three seeds through the README's settings, the constructor's defaults, a grid of fixed
# settings, the candidates for the default and the peers, on a virtual-time event loop whose cores (fitted) the loop
# and the model share; the calibration, the validation of the decision against the paired real runs, and the
# sensitivity to each constant; writes reports/policy.{md,csv}. The peers run in the environments of
# make bench-overhead under .cache/peers/ (built on first use: pip, needs PyPI). POLICY_ARGS passes options through,
# e.g. `make bench-policy POLICY_ARGS=--quick` or
# `make bench-policy POLICY_ARGS="--variant 'hold2ms:max_queue_time=0,max_hold_time=0.002'"`.
#
# The real measurements it rests on, each on a quiet machine (they refuse a busy one, saying what they saw):
# - make bench-policy-measure: the cost constants (benchmarks/policy/costs.json), pinned, with TensorFlow, then the
#   core count's fit; about 3 minutes. MEASURE_ARGS passes options through.
# - make bench-policy-validate: the paired real runs of the decision (benchmarks/policy/measured/turns-*.csv,
#   reports/turns/turns.md); about 35 minutes at 10 rounds. VALIDATE_ARGS passes options through.
.PHONY: bench-policy bench-policy-measure bench-policy-validate

bench-policy: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.policy $(POLICY_ARGS)

bench-policy-measure: $(VENV)/.bench-installed wrk
	$(BIN)/python -m benchmarks.policy.measure $(MEASURE_ARGS)

bench-policy-validate: $(VENV)/.bench-installed wrk
	$(BIN)/python -m benchmarks.policy.validate $(VALIDATE_ARGS)
