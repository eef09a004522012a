# Scaling out: Ray Serve (examples/ray_serve, tests/ray_serve), the Kubernetes manifests' check
# (tests/kubernetes) and two benchmarks: `make bench-ray` (reports/ray.md), `make benchmark-workers`
# (reports/workers.md). RAY_BENCH_ARGS / WORKERS_ARGS pass options through.
.PHONY: bench-ray benchmark-workers

# tests/ray_serve and tests/kubernetes get Ray and kubernetes-validate from the test-all group; the benchmark
# installs the ray group beside make benchmark's environment.
$(VENV)/.ray-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --group ray
	touch $@

bench-ray: $(VENV)/.ray-installed $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.ray_serve $(RAY_BENCH_ARGS)

benchmark-workers: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.workers $(WORKERS_ARGS)
