# Scaling out: Ray Serve (examples/ray_serve, tests/ray_serve), the Kubernetes manifests' check
# (tests/kubernetes) and two benchmarks: `make bench-ray` (reports/ray.md), `make benchmark-workers`
# (reports/workers.md). RAY_BENCH_ARGS / WORKERS_ARGS pass options through.
.PHONY: bench-ray benchmark-workers

# The ray dependency group and kubernetes-validate (Kubernetes' schemas, bundled: no network at test time).
$(VENV)/.scaling-installed: $(VENV)/.test-installed pyproject.toml
	$(BIN)/python -m pip install -q --group ray 'kubernetes-validate>=1.30'
	touch $@

TEST_PREREQS += $(VENV)/.scaling-installed

bench-ray: $(VENV)/.scaling-installed $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.ray_serve $(RAY_BENCH_ARGS)

benchmark-workers: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.workers $(WORKERS_ARGS)
