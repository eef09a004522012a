"""How TorchAsyncBatcher reads a list in a model's outputs (issue 26, item 13): never two ways.

The case that used to go wrong silently: a model that returns a plain list of per-item rows whose width is the
batch size; callers got each other's columns. A list of per-item tensors that could also be several outputs is
refused, naming the shapes, unless ``lists=`` says which it is.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.requires import require

torch = require("torch", "make test-all installs its CPU build (mk/torch.mk)")

from async_batcher.ml.torch import Batch, TorchAsyncBatcher  # noqa: E402

WAIT = 60
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def linear() -> torch.nn.Linear:
    torch.manual_seed(17)
    return torch.nn.Linear(4, 3).eval()


def _rows(n: int) -> torch.Tensor:
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(n))


async def _gather(batcher: Any, items: Any) -> list[Any]:
    calls = (batcher.process(item) for item in items)
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)


async def test_a_plain_list_of_rows_as_wide_as_the_batch_gives_each_caller_its_row(linear: torch.nn.Linear) -> None:
    # Three callers, rows three wide, the model's rows as Python lists. Today caller i silently gets column i.
    def forward(batch: Batch) -> Any:
        return linear(batch.inputs).tolist()

    rows = _rows(3)
    batcher = TorchAsyncBatcher(model=linear, predict_fn=forward, max_batch_size=3, max_queue_time=0.05)
    async with batcher:
        results = await _gather(batcher, rows)
    assert batcher.stats.batches == 1
    with torch.inference_mode():
        expected = linear(rows)
    assert not torch.allclose(expected, expected.T)  # a transposed answer would fail below
    for n, result in enumerate(results):
        assert isinstance(result, list)
        torch.testing.assert_close(torch.tensor(result), expected[n], rtol=RTOL, atol=ATOL)


async def test_a_list_of_per_item_tensors_is_refused_unless_said_and_never_misread(linear: torch.nn.Linear) -> None:
    def forward(batch: Batch) -> Any:
        return list(linear(batch.inputs))  # one tensor of 3 per item: or 3 outputs of 3 rows

    rows = _rows(3)
    with torch.inference_mode():
        expected = linear(rows)
    async with TorchAsyncBatcher(model=linear, predict_fn=forward, max_batch_size=3, max_queue_time=0.05) as batcher:
        outcomes = await _gather(batcher, rows)
    assert all(isinstance(o, ValueError) for o in outcomes)
    assert "the output is ambiguous: a list of 3 elements that hold arrays (shape (3,), shape (3,), shape (3,))" in str(
        outcomes[0]
    )
    batcher = TorchAsyncBatcher(model=linear, predict_fn=forward, lists="items", max_batch_size=3, max_queue_time=0.05)
    async with batcher:
        results = await _gather(batcher, rows)
    for n, result in enumerate(results):
        torch.testing.assert_close(result, expected[n], rtol=RTOL, atol=ATOL)


async def test_a_list_of_outputs_is_split_per_output_and_refused_when_the_batch_is_as_long(
    linear: torch.nn.Linear,
) -> None:
    def forward(batch: Batch) -> Any:
        out = linear(batch.inputs)
        return [out, out.softmax(1)]  # two outputs, of one shape

    for size, lists, ok in ((3, "auto", True), (2, "auto", False), (2, "outputs", True)):
        batcher = TorchAsyncBatcher(
            model=linear, predict_fn=forward, lists=lists, max_batch_size=size, max_queue_time=0.05
        )
        rows = _rows(size)
        async with batcher:
            results = await _gather(batcher, rows)
        assert batcher.stats.batches == 1
        if not ok:
            assert all(isinstance(r, ValueError) and "ambiguous" in str(r) for r in results)
            continue
        with torch.inference_mode():
            logits = linear(rows)
        for n, result in enumerate(results):
            assert isinstance(result, list) and len(result) == 2
            torch.testing.assert_close(result[0], logits[n], rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(result[1], logits[n].softmax(0), rtol=RTOL, atol=ATOL)


def test_a_bad_lists_value_is_refused(linear: torch.nn.Linear) -> None:
    with pytest.raises(ValueError, match="lists must be 'auto', 'outputs' or 'items', got 'rows'"):
        TorchAsyncBatcher(model=linear, lists="rows")  # type: ignore[arg-type]
