# PyTorch (async_batcher.ml.torch): tests/torch and the whole type check (torch ships its types) need torch, in
# make test-all. Its CPU build, from PyTorch's CPU index (PyPI's default build for Linux carries CUDA, gigabytes of
# it; where that index cannot be reached, pip says so and takes a wheel of that version from its find-links, if
# any), then what it depends on from the default index. TORCH_PIP_ARGS= (empty) takes torch from there too.
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?= --index-url https://download.pytorch.org/whl/cpu

$(VENV)/.torch-installed: $(VENV)/.test-installed mk/torch.mk
	$(BIN)/python -m pip install -q --no-deps $(TORCH_PIP_ARGS) 'torch==$(TORCH_VERSION)'
	$(BIN)/python -m pip install -q 'torch==$(TORCH_VERSION)'
	touch $@

TEST_ALL_PREREQS += $(VENV)/.torch-installed
