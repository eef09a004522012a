"""TorchAsyncBatcher and ml.torch.collate: an item that does not stack with its batch fails alone (issue 26, item 10).

The batch's shape, dtype and device are those most of its items have (the earliest on a tie); an item of another
one, or that is not an array of numbers, gets an error naming its shape and dtype and the batch's, and the model
runs on the others, which get exactly what they would get alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.requires import require

torch = require("torch", "make test-all installs its CPU build (mk/torch.mk)")

from async_batcher.ml.torch import TorchAsyncBatcher, collate  # noqa: E402

# Each test waits this long at most for its callers: a caller left waiting fails the test instead of hanging it.
WAIT = 60
RTOL, ATOL = 1e-5, 1e-6


class Recorder(torch.nn.Module):
    """A real small model (a linear layer) that records the batches it was called on."""

    def __init__(self, width: int = 4, out: int = 3) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.linear = torch.nn.Linear(width, out)
        self.batches: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(tuple(x.shape))
        out: torch.Tensor = self.linear(x)
        return out


def _alone(model: Recorder, row: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model.linear(row[None])[0]
        return out


async def _gather(batcher: Any, items: list[Any]) -> list[Any]:
    calls = (batcher.process(item) for item in items)
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)


async def test_one_malformed_item_fails_only_its_caller() -> None:
    # Today: "cannot stack items of different shapes" for all six callers.
    model = Recorder().eval()
    rows = [torch.randn(4, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    items: list[Any] = list(rows)
    items[2] = torch.randn(5)  # another width
    items[4] = torch.zeros(4, dtype=torch.float64)  # another dtype
    async with TorchAsyncBatcher(model=model, max_batch_size=6, max_queue_time=0.05) as batcher:
        results = await _gather(batcher, items)
    assert model.batches == [(4, 4)], "the model runs once, on the four rows that stack"
    for index in (0, 1, 3, 5):
        torch.testing.assert_close(results[index], _alone(model, rows[index]), rtol=RTOL, atol=ATOL)
    assert isinstance(results[2], ValueError)
    assert "item 2 has shape (5,) of torch.float32, where the batch's items have shape (4,) of torch.float32" in str(
        results[2]
    )
    assert isinstance(results[4], TypeError)
    assert "item 4 has shape (4,) of torch.float64, where the batch's items have shape (4,) of torch.float32" in str(
        results[4]
    )
    assert batcher.stats.failed == 2 and batcher.stats.succeeded == 4


async def test_the_batch_is_what_most_items_are_even_when_the_first_item_is_the_odd_one() -> None:
    model = Recorder().eval()
    rows = [torch.randn(4) for _ in range(3)]
    async with TorchAsyncBatcher(model=model, max_batch_size=4, max_queue_time=0.05) as batcher:
        results = await _gather(batcher, [torch.randn(7), *rows])
    assert isinstance(results[0], ValueError) and "item 0 has shape (7,)" in str(results[0])
    for row, result in zip(rows, results[1:], strict=True):
        torch.testing.assert_close(result, _alone(model, row), rtol=RTOL, atol=ATOL)


async def test_on_a_tie_the_earliest_item_sets_the_shape() -> None:
    # Two items, two shapes: nothing says which is right; the earlier one runs, the later one fails alone.
    model = Recorder().eval()
    first = torch.randn(4)
    async with TorchAsyncBatcher(model=model, max_batch_size=2, max_queue_time=0.05) as batcher:
        results = await _gather(batcher, [first, torch.randn(6)])
    torch.testing.assert_close(results[0], _alone(model, first), rtol=RTOL, atol=ATOL)
    assert isinstance(results[1], ValueError) and "shape (6,)" in str(results[1])


async def test_items_that_are_not_arrays_of_numbers_fail_alone() -> None:
    model = Recorder().eval()
    good = torch.randn(4)
    items: list[Any] = [good, "abcd", [1.0, [2.0, 3.0], 4.0, 5.0], None, (x for x in range(4)), {"x": good}]
    async with TorchAsyncBatcher(model=model, max_batch_size=len(items), max_queue_time=0.05) as batcher:
        results = await _gather(batcher, items)
    torch.testing.assert_close(results[0], _alone(model, good), rtol=RTOL, atol=ATOL)
    for index in (1, 2, 3, 4):
        assert isinstance(results[index], TypeError), results[index]
        assert f"item {index} is not a rectangular array of numbers" in str(results[index])
    assert isinstance(results[5], TypeError)
    assert "item 5 is a dict of features, where the batch's items are arrays (shape (4,) of torch.float32)" in str(
        results[5]
    )
    assert model.batches == [(1, 4)]


async def test_when_no_item_stacks_the_model_is_not_called() -> None:
    model = Recorder().eval()
    async with TorchAsyncBatcher(model=model, max_batch_size=3, max_queue_time=0.05) as batcher:
        results = await _gather(batcher, ["a", None, object()])
        assert all(isinstance(r, TypeError) for r in results)
        assert model.batches == []
        # and the batcher serves on
        row = torch.randn(4)
        torch.testing.assert_close(
            await asyncio.wait_for(batcher.process(row), WAIT), _alone(model, row), rtol=RTOL, atol=ATOL
        )


async def test_a_batch_of_one_malformed_item_gets_the_models_error() -> None:
    # Alone, an item is its batch's shape: the model itself refuses it, and only its caller is in the batch.
    model = Recorder().eval()
    async with TorchAsyncBatcher(model=model, max_queue_time=0) as batcher:
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            await asyncio.wait_for(batcher.process(torch.randn(5)), WAIT)
        assert (await asyncio.wait_for(batcher.process(torch.randn(4)), WAIT)).shape == (3,)


async def test_dict_items_with_other_features_or_an_odd_feature_fail_alone() -> None:
    seen: list[dict[str, tuple[int, ...]]] = []

    def model(ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        seen.append({"ids": tuple(ids.shape), "weights": tuple(weights.shape)})
        return (ids * weights).sum(1)

    def item(n: int) -> dict[str, torch.Tensor]:
        return {"ids": torch.full((3,), float(n)), "weights": torch.ones(3)}

    items: list[Any] = [item(1), {"ids": torch.ones(3)}, item(2), {**item(3), "weights": torch.ones(2)}]
    items.append({**item(4), "extra": torch.ones(1)})
    items.append(torch.ones(3))
    items.append(item(5))
    async with TorchAsyncBatcher(model=model, max_batch_size=len(items), max_queue_time=0.05) as batcher:
        results = await _gather(batcher, items)
    assert [results[0].item(), results[2].item(), results[6].item()] == [3.0, 6.0, 15.0]
    assert seen == [{"ids": (3, 3), "weights": (3, 3)}]
    assert isinstance(results[1], ValueError)
    assert "item 1 has other features than the batch's items: missing ['weights'], unexpected []" in str(results[1])
    assert isinstance(results[3], ValueError)
    assert "feature 'weights' of different shapes: item 3 has shape (2,)" in str(results[3])
    assert isinstance(results[4], ValueError) and "unexpected ['extra']" in str(results[4])
    assert isinstance(results[5], TypeError)
    assert "item 5 is a Tensor, where the batch's items are mappings of features ['ids', 'weights']" in str(results[5])


async def test_padded_sequences_odd_trailing_shape_or_scalar_fails_alone() -> None:
    # With pad_sequences only the first axis may differ: an item of another feature width, or a scalar, fails alone.
    def model(x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=(1, 2))

    items: list[Any] = [torch.ones(2, 3), torch.ones(5, 3), torch.ones(2, 4), torch.tensor(1.0), torch.ones(1, 3)]
    batcher = TorchAsyncBatcher(model=model, pad_sequences=True, buckets=(4, 8), max_batch_size=8, max_queue_time=0.05)
    async with batcher:
        results = await _gather(batcher, items)
    assert [results[0].item(), results[1].item(), results[4].item()] == [6.0, 15.0, 3.0]
    assert isinstance(results[2], ValueError)
    assert "cannot pad items of different shapes: item 2 has shape (2, 4) of torch.float32, where the batch's" in str(
        results[2]
    )
    assert "shape (*, 3) of torch.float32 (only the first axis may differ)" in str(results[2])
    assert isinstance(results[3], ValueError) and "item 3 is a scalar; pad_sequences needs a sequence axis" in str(
        results[3]
    )


def test_collate_raises_by_default_and_leaves_out_on_request() -> None:
    items = [torch.zeros(3), torch.zeros(2), torch.zeros(3)]
    with pytest.raises(ValueError, match=r"item 1 has shape \(2,\)"):
        collate(items)
    batch = collate(items, odd_items="exclude", buckets=(4,))
    assert (batch.size, batch.padded_size, tuple(batch.inputs.shape)) == (2, 4, (4, 3))
    assert list(batch.left_out) == [1]
    results = batch.split(batch.inputs + 1)
    assert [r.tolist() for r in (results[0], results[2])] == [[1.0] * 3] * 2
    assert results[1] is batch.left_out[1]
    with pytest.raises(ValueError, match="odd_items must be 'raise' or 'exclude', got 'skip'"):
        collate(items, odd_items="skip")  # type: ignore[arg-type]


def test_nothing_left_gives_an_empty_batch_whose_split_reads_no_output() -> None:
    batch = collate(["x", None], odd_items="exclude", buckets=(4,))
    assert (batch.size, batch.padded_size, batch.inputs.numel()) == (0, 0, 0)
    assert [type(r) for r in batch.split(None)] == [TypeError, TypeError]


def test_items_on_several_devices_move_to_the_target_or_fail_alone() -> None:
    # The meta device stands in for an accelerator: a CPU tensor moves there, a meta tensor cannot come back.
    moved = collate([torch.zeros(2), torch.zeros(2, device="meta"), torch.ones(2)], device="meta")
    assert moved.inputs.device.type == "meta" and moved.size == 3 and not moved.left_out
    back = collate([torch.zeros(2), torch.zeros(2, device="meta"), torch.ones(2)], device="cpu", odd_items="exclude")
    assert back.size == 2 and list(back.left_out) == [1]
    assert "item 1 on meta cannot be moved to cpu" in str(back.left_out[1])
    # Without a target, the batch's device is where most items are.
    where = collate([torch.zeros(2, device="meta"), torch.zeros(2), torch.zeros(2)], odd_items="exclude")
    assert where.inputs.device.type == "cpu" and list(where.left_out) == [0]
    assert "item 0 has shape (2,) of torch.float32 on meta, where the batch's items have shape (2,) of" in str(
        where.left_out[0]
    )


def test_a_cast_dtype_makes_dtypes_agree_and_lists_take_the_fast_path_when_they_can() -> None:
    batch = collate([torch.zeros(2, dtype=torch.int64), torch.zeros(2)], dtype=torch.float16)
    assert batch.inputs.dtype == torch.float16 and batch.size == 2
    fast = collate([[1, 2], [3, 4]], dtype=torch.float32)
    assert fast.size == 2 and not fast.left_out
    slow = collate([[1, 2], [3, 4, 5], [6, 7]], dtype=torch.float32, odd_items="exclude")
    assert slow.inputs.tolist() == [[1.0, 2.0], [6.0, 7.0]] and list(slow.left_out) == [1]


# ---------------------------------------------------------------------- odd items a hostile user sends


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
