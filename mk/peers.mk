# The head-to-head: python -m benchmarks.peers (docs/guides/benchmarks.md, "One model, one app, each batcher"). It builds
# a venv per peer under .cache/peers-server/ (pip, needs PyPI; the TensorFlow wheels are downloaded once) and drives
# the servers closed-loop with wrk, then open-loop with benchmarks/openloop/generate.py (Poisson arrivals, and the
# mixed scenario), all in reports/peers.md. PEERS_ARGS passes options through, e.g.
# `make bench-peers PEERS_ARGS=--quick`, `make bench-peers PEERS_ARGS='--ours wait1ms:max_queue_time=0.001'` or
# `make bench-peers PEERS_ARGS='--modes closed'` (wrk only, as before).
.PHONY: bench-peers

# wrk, Debian's package, the load generator: checked, never installed here (tools/check_prereqs.py checks it before
# make test-all, whose smoke tests run it; make test-all INSTALL_SYSTEM=1 installs it).
.PHONY: wrk

wrk:
	@command -v wrk >/dev/null || { echo "the load generator wrk is needed: apt-get install -y wrk" >&2; exit 1; }

bench-peers: $(VENV)/.bench-installed wrk
	$(BIN)/python -m benchmarks.peers $(PEERS_ARGS)
