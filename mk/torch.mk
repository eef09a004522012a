# PyTorch (async_batcher.ml.torch): tests/torch and the type check (torch ships its types) need torch.
# Pinned: pip takes this version's CPU build from the wheels the machines keep on disk (its find-links); an
# unpinned install could pull a CUDA build of several GB. Elsewhere, get the CPU build from PyTorch's index:
#   make test TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu'
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=

$(VENV)/.torch-installed: $(VENV)/.test-installed mk/torch.mk
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) 'torch==$(TORCH_VERSION)'
	touch $@

TEST_PREREQS += $(VENV)/.torch-installed
typecheck: $(VENV)/.torch-installed
