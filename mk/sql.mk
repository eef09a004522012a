# SQL integration (async_batcher.sqlalchemy): the benchmark against a throwaway PostgreSQL cluster and SQLite.
.PHONY: bench-sql

# Batched vs one INSERT per call from 1000 callers; writes reports/sql.md, reports/sql.csv and reports/sql.png.
bench-sql: $(VENV)/.test-all-installed
	$(BIN)/python -m benchmarks.sql.run $(SQL_ARGS)
