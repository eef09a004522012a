# What gets in (issue 46): python -m benchmarks.admission (docs/guides/admission.md). refuse_late and dedup_key past
# saturation on the dispatch simulator's server (virtual time, seeded), and a process's memory under 10 MB items
# with max_queue_weight (real time, a few seconds); writes reports/admission.md. ADMISSION_ARGS passes options
# through, e.g. `make bench-admission ADMISSION_ARGS=--quick`.
.PHONY: bench-admission

bench-admission: $(VENV)/.bench-overhead-installed
	$(BIN)/python -m benchmarks.admission $(ADMISSION_ARGS)
