# The two commands of the README: `make test` and `make benchmark`. Each builds its own .venv.
# Integrations add their own targets and test prerequisites in mk/*.mk (included below).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The library's extras the tests import (each integration's tests need its extra).
TEST_EXTRAS := numpy,keras,fastapi,metrics,aws,sqlalchemy,sklearn

.PHONY: test lint typecheck unit docs clean
.DEFAULT_GOAL := test

# pip >= 25.1 installs the PEP 735 dependency groups of pyproject.toml (--group).
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade 'pip>=25.1'

# The install reruns when pyproject.toml changes.
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(TEST_EXTRAS)]' --group test
	touch $@

# What `unit` needs besides the test group (local servers, trained models, ...): mk/*.mk append to it.
TEST_PREREQS := $(VENV)/.test-installed

include $(sort $(wildcard mk/*.mk))

lint: $(VENV)/.test-installed
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --no-cache --check .

typecheck: $(VENV)/.test-installed
	$(BIN)/mypy --strict async_batcher

unit: $(TEST_PREREQS)
	$(BIN)/python -m pytest

# Java 17 and Node first (mk/prereqs.mk): they are what a fresh machine most often lacks.
test: prereqs lint typecheck unit

$(VENV)/.docs-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e . --group docs
	touch $@

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or reference fails it.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis site
