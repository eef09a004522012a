"""The out-of-memory split on a real PyTorch model on CPU (issue 45, part 4): a memory limit that raises
``torch.OutOfMemoryError`` above a batch size that changes during the test."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from async_batcher.failures import SplitOn, out_of_memory
from tests.requires import require

torch = require("torch", "make test-all installs its CPU build (mk/torch.mk)")

from async_batcher.ml.torch import TorchAsyncBatcher  # noqa: E402

pytestmark = pytest.mark.single_loop

FEATURES = 16


class MemoryLimited(torch.nn.Module):  # type: ignore[misc]
    """A small MLP whose forward pass refuses, as a GPU out of memory does, a batch whose activations would take more
    than ``budget`` bytes (the budget is the test's to move)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.budget = 1 << 40
        self.sizes: list[int] = []

    def forward(self, x: Any) -> Any:
        self.sizes.append(int(x.shape[0]))
        needed = x.shape[0] * 64 * x.element_size()
        if needed > self.budget:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {needed} bytes (budget {self.budget} bytes)"
            )
        return self.net(x)


async def test_a_real_model_is_split_under_a_moving_memory_limit() -> None:
    model = MemoryLimited().eval()
    inputs = [torch.randn(FEATURES) for _ in range(256)]
    with torch.inference_mode():
        expected = [model.net(x.unsqueeze(0))[0] for x in inputs]
    batcher = TorchAsyncBatcher(
        model=model, max_batch_size=64, max_queue_time=0.05, split_on=SplitOn(torch.OutOfMemoryError, grow_after=2)
    )
    async with batcher:
        per_row = 64 * 4
        # The limit moves between rounds: 64 rows fit, then 10, then 40, then 3, then everything again.
        for rows in (64, 10, 40, 3, 64):
            model.budget = rows * per_row
            results = await asyncio.gather(*(batcher.process(x) for x in inputs))
            for got, want in zip(results, expected, strict=True):
                assert torch.allclose(got, want, atol=1e-6)
        stats = batcher.stats
    assert stats.splits > 0 and stats.failed == 0
    # Every call that ran did so under the limit of its moment or was split; none that fitted was refused.
    assert max(model.sizes) == 64
    assert min(model.sizes) <= 3


async def test_a_single_row_that_does_not_fit_fails_alone_with_the_models_error() -> None:
    class Lengthy(MemoryLimited):
        def forward(self, x: Any) -> Any:
            if bool((x[:, 0] > 100).any()) and x.shape[0] > 0:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
            return super().forward(x)

    model = Lengthy().eval()
    inputs = [torch.randn(FEATURES) for _ in range(32)]
    inputs[5][0] = 1000.0  # the one input too big for the device whatever its batch
    async with TorchAsyncBatcher(model=model, max_batch_size=32, max_queue_time=0.05, split_on=SplitOn()) as batcher:
        results = await asyncio.gather(*(batcher.process(x) for x in inputs), return_exceptions=True)
    assert isinstance(results[5], torch.OutOfMemoryError)
    assert all(isinstance(r, torch.Tensor) for i, r in enumerate(results) if i != 5)


def test_out_of_memory_recognises_the_frameworks_errors() -> None:
    assert out_of_memory(MemoryError())
    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 1.2 GB)"))
    assert not out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not out_of_memory(ValueError("out of memory"))  # not an error a framework raises for it
    wrapped = ValueError("inference failed")
    wrapped.__cause__ = MemoryError()
    assert out_of_memory(wrapped)
