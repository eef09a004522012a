# The README's commands: `make test` (the fast tier), `make test-all` (every test: what .ci/run runs) and
# `make benchmark`. Each builds its own .venv. Integrations add their own targets, and the full tier's
# prerequisites, in mk/*.mk (included below).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The library's extras the tests import (each integration's tests need its extra; the test-all group adds
# scikit-learn, PyTorch comes from mk/torch.mk).
TEST_EXTRAS := numpy,keras,fastapi,metrics,aws,sqlalchemy,opentelemetry
# More options for pytest, e.g. make test PYTEST_ARGS='-x tests/aws'.
PYTEST_ARGS ?=
# INSTALL_SYSTEM=1: make test-all installs the Debian packages it needs (apt-get, as root) instead of naming them.
INSTALL_SYSTEM ?=
# The tests start many interpreters: let them cache their bytecode, which some machines turn off.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: test test-all prereqs prereqs-all lint typecheck typecheck-all unit unit-all docs clean
.DEFAULT_GOAL := test

# pip >= 25.1 installs the PEP 735 dependency groups of pyproject.toml (--group).
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade 'pip>=25.1'

# Each install reruns when pyproject.toml changes. Lint needs the lint group only (ruff, mypy).
$(VENV)/.lint-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --group lint
	touch $@

# The fast tier: the library with its extras, and the test group (no TensorFlow, PyTorch, Ray, server).
$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(TEST_EXTRAS)]' --group test
	touch $@

# The full tier: the test-all group besides; mk/*.mk append what comes from elsewhere (PyTorch's CPU build,
# DynamoDB Local, actionlint).
$(VENV)/.test-all-installed: $(VENV)/.test-installed pyproject.toml
	$(BIN)/python -m pip install -q --group test-all
	touch $@

TEST_ALL_PREREQS := $(VENV)/.test-all-installed

include $(sort $(wildcard mk/*.mk))

# What each tier needs from the machine, checked before anything is installed (tools/check_prereqs.py).
prereqs:
	@$(PYTHON) tools/check_prereqs.py test

prereqs-all:
	@$(PYTHON) tools/check_prereqs.py test-all $(if $(INSTALL_SYSTEM),--install)

lint: $(VENV)/.lint-installed
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --no-cache --check .

# mypy --strict on the package; in the fast tier without async_batcher/ml/torch, whose types are PyTorch's.
typecheck: $(VENV)/.test-installed
	$(BIN)/mypy --strict async_batcher --exclude '^async_batcher/ml/torch/'

typecheck-all: $(TEST_ALL_PREREQS)
	$(BIN)/mypy --strict async_batcher

# The tiers' pytest runs (tests/conftest.py): the fast one leaves the `integration` tests out, runs a few hundred
# examples per property and uvloop on the core's tests only; --durations names the slowest tests every run.
unit: $(VENV)/.test-installed
	$(BIN)/python -m pytest -m 'not integration' --durations=15 $(PYTEST_ARGS)

unit-all: $(TEST_ALL_PREREQS)
	$(BIN)/python -m pytest --hypothesis-profile=full --every-loop --durations=30 $(PYTEST_ARGS)

test: prereqs lint typecheck unit

test-all: prereqs-all lint typecheck-all unit-all

$(VENV)/.docs-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e . --group docs
	touch $@

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or reference fails it.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis site
