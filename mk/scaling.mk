# Scaling out: Ray Serve (examples/ray_serve, tests/ray_serve), the Kubernetes manifests' check
# (tests/kubernetes) and three benchmarks: `make bench-ray` (reports/ray.md), `make benchmark-workers`
# (reports/workers.md: the Keras example with 1 worker, 2 workers batching alone and 2 sharing one batcher; locust,
# wrk and open loop; wrk must be installed) and `make bench-shared` (reports/shared.md: the shared batcher's hop on a
# no-op model). RAY_BENCH_ARGS / WORKERS_ARGS / SHARED_BENCH_ARGS pass options through.
.PHONY: bench-ray benchmark-workers bench-shared

# tests/ray_serve and tests/kubernetes get Ray and kubernetes-validate from the test-all group; the benchmark
# installs the ray group beside make benchmark's environment.
$(VENV)/.ray-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --group ray
	touch $@

bench-ray: $(VENV)/.ray-installed $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.ray_serve $(RAY_BENCH_ARGS)

benchmark-workers: $(VENV)/.bench-installed wrk
	$(BIN)/python -m benchmarks.workers $(WORKERS_ARGS)

bench-shared: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.shared --out reports $(SHARED_BENCH_ARGS)
