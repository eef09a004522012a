"""TorchAsyncBatcher and ml.torch attacked as a hostile user would: what each attack found, kept as a test.

Every wait is bounded (WAIT): a caller left waiting fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.requires import require

torch = require("torch", "make test-all installs its CPU build (mk/torch.mk)")

from async_batcher.ml.torch import Batch, TorchAsyncBatcher, collate, split_outputs  # noqa: E402

WAIT = 60


async def _gather(batcher: Any, items: Any) -> list[Any]:
    calls = (batcher.process(item) for item in items)
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)


async def test_every_item_left_out_with_trim_gives_each_caller_its_own_error() -> None:
    # Found: Batch.split asked for the lengths to trim by before seeing that no item was left, so every caller
    # got "trim needs the lengths of padded sequences" instead of the error of its own item.
    calls: list[Any] = []
    batcher = TorchAsyncBatcher(
        model=calls.append, pad_sequences=True, trim=True, max_batch_size=2, max_queue_time=0.05
    )
    async with batcher:
        outcomes = await _gather(batcher, ["text", None])
    assert calls == []
    assert [type(o) for o in outcomes] == [TypeError, TypeError]
    assert "item 0 is not a rectangular array" in str(outcomes[0]) and "item 1" in str(outcomes[1])


async def test_trim_with_an_odd_item_trims_the_others_to_their_own_lengths() -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        return x * 10

    items: list[Any] = [torch.ones(2), torch.ones(3, 2), torch.ones(3)]
    batcher = TorchAsyncBatcher(model=model, pad_sequences=True, trim=True, max_batch_size=3, max_queue_time=0.05)
    async with batcher:
        outcomes = await _gather(batcher, items)
    assert outcomes[0].tolist() == [10.0, 10.0] and outcomes[2].tolist() == [10.0, 10.0, 10.0]
    assert isinstance(outcomes[1], ValueError) and "item 1 has shape (3, 2)" in str(outcomes[1])


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda x: x[:-1], ValueError, r"the output has 2 rows for a batch of 3 rows \(shape \(2, 2\)\)"),
        (lambda x: torch.cat([x, x]), ValueError, r"the output has 6 rows for a batch of 3 rows"),
        (lambda x: (row for row in x), TypeError, r"the output is a generator, not a tensor with one row per item"),
        (lambda x: {"logits": x, "loss": x.sum()}, ValueError, r"loss is a scalar, not a batch of 3 rows"),
        (lambda x: x.sum().item(), TypeError, r"the output is a float \(.*\), not a batch of 3 rows"),
        (lambda x: torch.eye(3).to_sparse(), TypeError, r"the output is a sparse tensor \(torch\.sparse_coo\)"),
    ],
    ids=["too few rows", "too many rows", "a generator", "a 0-d loss", "a float", "a sparse tensor"],
)
async def test_outputs_the_batch_cannot_be_split_by_fail_the_batch_and_the_batcher_serves_on(
    make: Any, error: type[Exception], message: str
) -> None:
    answers = iter([make, lambda x: x])

    def model(x: torch.Tensor) -> Any:
        return next(answers)(x)

    async with TorchAsyncBatcher(model=model, max_batch_size=3, max_queue_time=0.05) as batcher:
        outcomes = await _gather(batcher, [torch.zeros(2), torch.ones(2), torch.full((2,), 2.0)])
        assert all(isinstance(o, error) for o in outcomes), outcomes
        assert re.search(message, str(outcomes[0])), str(outcomes[0])
        assert (await asyncio.wait_for(batcher.process(torch.ones(2)), WAIT)).tolist() == [1.0, 1.0]


async def test_a_cyclic_output_is_refused_naming_where_not_recursed_into() -> None:
    def model(x: torch.Tensor) -> Any:
        out: dict[str, Any] = {"logits": x}
        out["cache"] = [x, out]
        return out

    async with TorchAsyncBatcher(model=model, max_batch_size=2, max_queue_time=0.05) as batcher:
        outcomes = await _gather(batcher, [torch.zeros(2), torch.ones(2)])
    assert all(isinstance(o, ValueError) for o in outcomes)
    assert "cache[1] holds itself: a cyclic output cannot be split" in str(outcomes[0])


async def test_a_huge_odd_item_never_reaches_the_model() -> None:
    shapes: list[tuple[int, ...]] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return x.sum(1)

    items: list[Any] = [torch.ones(4), torch.ones(4_000_000), torch.ones(4)]
    async with TorchAsyncBatcher(model=model, max_batch_size=3, max_queue_time=0.05) as batcher:
        outcomes = await _gather(batcher, items)
    assert shapes == [(2, 4)]
    assert [outcomes[0].item(), outcomes[2].item()] == [4.0, 4.0]
    assert isinstance(outcomes[1], ValueError) and "shape (4000000,)" in str(outcomes[1])


async def test_all_items_of_different_shapes_the_earliest_runs_and_the_rest_fail_alone() -> None:
    async with TorchAsyncBatcher(model=lambda x: x * 2, max_batch_size=4, max_queue_time=0.05) as batcher:
        outcomes = await _gather(batcher, [torch.ones(n) for n in (1, 2, 3, 4)])
    assert outcomes[0].tolist() == [2.0]
    assert [type(o) for o in outcomes[1:]] == [ValueError] * 3
    assert "where the batch's items have shape (1,)" in str(outcomes[3])


async def test_process_many_with_a_generator_of_items_and_an_odd_one() -> None:
    async with TorchAsyncBatcher(model=lambda x: x + 1, max_batch_size=8, max_queue_time=0.05) as batcher:
        rows = (torch.zeros(2) if n != 3 else torch.zeros(5) for n in range(6))
        results = await asyncio.wait_for(batcher.process_many(rows, return_exceptions=True), WAIT)
    assert [r.tolist() for n, r in enumerate(results) if n != 3] == [[1.0, 1.0]] * 5
    assert isinstance(results[3], ValueError)


async def test_a_batch_of_one_item_that_is_not_an_array_never_calls_the_model() -> None:
    calls: list[Any] = []
    async with TorchAsyncBatcher(model=calls.append, max_queue_time=0) as batcher:
        with pytest.raises(TypeError, match="item 0 is not a rectangular array of numbers"):
            await asyncio.wait_for(batcher.process({"a": "text"}), WAIT)
    assert calls == []


def test_zero_d_items_stack_into_a_vector_and_zero_d_among_vectors_is_odd() -> None:
    assert collate([torch.tensor(1.0), torch.tensor(2.0)]).inputs.tolist() == [1.0, 2.0]
    batch = collate([torch.tensor(1.0), torch.zeros(1), torch.zeros(1)], odd_items="exclude")
    assert list(batch.left_out) == [0] and batch.size == 2


def test_items_that_are_not_dense_or_overflow_are_odd() -> None:
    items: list[Any] = [torch.eye(2).to_sparse()[0], [2**70, 1], torch.zeros(2), torch.zeros(2)]
    batch = collate(items, odd_items="exclude")
    assert batch.size == 2 and sorted(batch.left_out) == [0, 1]
    assert "item 0 is a torch.sparse_coo tensor; items must be dense" in str(batch.left_out[0])
    assert "item 1 is not a rectangular array of numbers" in str(batch.left_out[1])


def test_empty_batches_and_negative_sizes() -> None:
    with pytest.raises(ValueError, match="cannot collate an empty batch"):
        collate([])
    assert split_outputs(torch.zeros(3, 2), 0) == []
    with pytest.raises(ValueError, match="size must be >= 0, got -1"):
        split_outputs(torch.zeros(2), -1)
    assert Batch(torch.empty(0), 0, 0).split(object()) == []
