"""KerasAsyncBatcher with real (small, untrained) Keras models."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from async_batcher import Limits
from async_batcher.policies import Deadline
from tests.requires import require

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
keras = require("keras", "make test-all installs it (the test-all group: Keras on TensorFlow)")

from async_batcher.ml.keras import KerasAsyncBatcher  # noqa: E402

# Float32 sums run in an order that depends on the batch's shape (the CPU kernels pick their blocking by it), so
# an item's row may differ from the same item predicted in another batch in the last bits: a few float32 ulps
# (measured: 3e-7 relative on the example model). 1e-5 allows for that and nothing more.
RTOL = 1e-5


@pytest.fixture(scope="module")
def regressor() -> Any:
    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [keras.Input(shape=(10,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )


def _rows(n: int, width: int = 10) -> np.ndarray:
    return np.random.default_rng(3).normal(size=(n, width)).astype(np.float32)


async def test_each_caller_gets_its_own_row(regressor: Any) -> None:
    rows = _rows(40)
    async with KerasAsyncBatcher(model=regressor, max_batch_size=16, max_queue_time=0.05) as batcher:
        results = await asyncio.gather(*(batcher.process(list(map(float, row))) for row in rows))
    expected = regressor.predict_on_batch(rows)
    assert len(results) == 40
    assert all(r.shape == (1,) for r in results)
    np.testing.assert_allclose(np.stack(results), expected, rtol=RTOL)
    # The rows are distinct well beyond the tolerance, so a row sent to the wrong caller would fail above.
    assert np.min(np.abs(np.diff(np.sort(expected[:, 0])))) > RTOL * np.max(np.abs(expected))
    assert batcher.stats.batches == 3  # 16 + 16 + 8: batched, not one call per item


async def test_model_runs_off_the_event_loop(regressor: Any) -> None:
    entered, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def held_predict(x: Any) -> Any:
        threads.append(threading.current_thread())
        entered.set()
        if not release.wait(30):
            raise TimeoutError("the test never released the model")
        return regressor.predict_on_batch(x)

    with ThreadPoolExecutor(1) as pool:
        batcher = KerasAsyncBatcher(model=regressor, predict_fn=held_predict, executor=pool, max_queue_time=0)
        async with batcher:
            task = asyncio.ensure_future(batcher.process(_rows(1)[0]))
            # Were the model on the event loop, this wait could never be served: the loop would be blocked.
            assert await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
            assert not task.done()
            release.set()
            result = await task
    assert threads and threads[0] is not threading.main_thread()
    np.testing.assert_allclose(result, regressor.predict_on_batch(_rows(1))[0], rtol=RTOL)


async def test_dict_inputs_and_dict_outputs() -> None:
    keras.utils.set_random_seed(11)
    a = keras.Input(shape=(3,), name="a")
    b = keras.Input(shape=(2,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    model = keras.Model(
        inputs={"a": a, "b": b},
        outputs={"y": keras.layers.Dense(1, name="y")(joined), "z": keras.layers.Dense(2, name="z")(joined)},
    )
    rng = np.random.default_rng(5)
    # Two features, five items: a batcher counting the dict's keys would see a batch of 2.
    items = [{"a": rng.normal(size=3), "b": rng.normal(size=2)} for _ in range(5)]
    async with KerasAsyncBatcher(model=model, dtype=np.float32, max_queue_time=0.05) as batcher:
        results = await asyncio.gather(*(batcher.process(item) for item in items))
    expected = model.predict_on_batch(
        {
            "a": np.stack([i["a"] for i in items]).astype(np.float32),
            "b": np.stack([i["b"] for i in items]).astype(np.float32),
        }
    )
    assert len(results) == 5
    for n, result in enumerate(results):
        assert set(result) == {"y", "z"}
        np.testing.assert_allclose(result["y"], expected["y"][n], rtol=RTOL)
        np.testing.assert_allclose(result["z"], expected["z"][n], rtol=RTOL)


async def test_buckets_pad_the_model_input_and_drop_the_padding(regressor: Any) -> None:
    shapes: list[tuple[int, ...]] = []

    def predict(x: Any) -> Any:
        shapes.append(x.shape)
        return regressor.predict_on_batch(x)

    rows = _rows(3)
    batcher = KerasAsyncBatcher(
        model=regressor, predict_fn=predict, buckets=(1, 4, 8), max_batch_size=8, max_queue_time=0.05
    )
    async with batcher:
        results = await asyncio.gather(*(batcher.process(row) for row in rows))
    assert shapes == [(4, 10)]
    assert len(results) == 3
    np.testing.assert_allclose(np.stack(results), regressor.predict_on_batch(rows), rtol=RTOL)


def test_constructor_is_0_2_2_s(regressor: Any) -> None:
    batcher = KerasAsyncBatcher(model=regressor)
    assert (batcher.max_batch_size, batcher.max_queue_time, batcher.concurrency, batcher.executor) == (
        None,  # no limit (0.2.2 read -1)
        0.01,
        1,
        None,
    )
    assert batcher.model is regressor
    with pytest.raises(TypeError):
        KerasAsyncBatcher(regressor)  # type: ignore[misc]  # keyword-only, as in 0.2.2
    assert KerasAsyncBatcher(model=regressor, max_queue_size=5).max_queue_size == 5  # **kwargs reach the core
    with pytest.raises(TypeError, match="bogus"):
        KerasAsyncBatcher(model=regressor, bogus=1)
    # The grouped settings reach the core too, without a clash with defaults the user never gave.
    grouped = KerasAsyncBatcher(model=regressor, limits=Limits(max_batch_size=8), policy=Deadline(0))
    assert (grouped.max_batch_size, grouped.max_queue_time) == (8, 0)


def test_bad_arguments_are_refused(regressor: Any) -> None:
    with pytest.raises(TypeError, match=r"predict_on_batch.*got object"):
        KerasAsyncBatcher(model=object())
    with pytest.raises(ValueError, match="max_batch_size must be set and fit in the largest bucket, got None"):
        KerasAsyncBatcher(model=regressor, buckets=(4, 8))
    with pytest.raises(ValueError, match="got 16"):
        KerasAsyncBatcher(model=regressor, buckets=(4, 8), max_batch_size=16)
    with pytest.raises(ValueError, match="buckets must be positive ints"):
        KerasAsyncBatcher(model=regressor, buckets=(0, 8), max_batch_size=8)


async def test_an_item_of_another_shape_fails_only_its_caller(regressor: Any) -> None:
    # Issue 26, item 10: one malformed item used to fail every caller of its batch.
    rows = _rows(4)
    items: list[Any] = [list(map(float, row)) for row in rows]
    items.insert(1, [0.0] * 9)
    items.insert(3, ["a"] * 10)
    seen: list[tuple[int, ...]] = []

    def predict(x: Any) -> Any:
        seen.append(x.shape)
        return regressor.predict_on_batch(x)

    batcher = KerasAsyncBatcher(model=regressor, predict_fn=predict, max_batch_size=len(items), max_queue_time=0.05)
    async with batcher:
        calls = (batcher.process(item) for item in items)
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
    assert seen == [(4, 10)]
    good = [outcomes[0], outcomes[2], outcomes[4], outcomes[5]]
    np.testing.assert_allclose(np.stack(good), regressor.predict_on_batch(rows), rtol=RTOL)
    assert isinstance(outcomes[1], ValueError)
    assert "item 1 has shape (9,) of numbers, where the batch's items have shape (10,) of numbers" in str(outcomes[1])
    assert isinstance(outcomes[3], TypeError)
    assert "item 3 has shape (10,) of strings, where the batch's items have shape (10,) of numbers" in str(outcomes[3])


async def test_a_multi_output_model_with_as_many_outputs_as_items_splits_its_list_of_outputs() -> None:
    # predict_on_batch returns a list for a model built with a list of outputs: two outputs of one shape and a
    # batch of two items read both ways, and the batcher reads it as Keras means it.
    keras.utils.set_random_seed(13)
    x = keras.Input(shape=(3,))
    model = keras.Model(x, [keras.layers.Dense(2)(x), keras.layers.Dense(2)(x)])
    rows = _rows(2, width=3)
    async with KerasAsyncBatcher(model=model, max_batch_size=2, max_queue_time=0.05) as batcher:
        results = await asyncio.wait_for(asyncio.gather(*(batcher.process(row) for row in rows)), 60)
    first, second = model.predict_on_batch(rows)
    for n, result in enumerate(results):
        assert isinstance(result, list) and len(result) == 2
        np.testing.assert_allclose(result[0], first[n], rtol=RTOL)
        np.testing.assert_allclose(result[1], second[n], rtol=RTOL)


async def test_with_buckets_the_batch_is_padded_from_the_items_that_stack(regressor: Any) -> None:
    shapes: list[tuple[int, ...]] = []

    def predict(x: Any) -> Any:
        shapes.append(x.shape)
        return regressor.predict_on_batch(x)

    rows = _rows(4)
    items: list[Any] = [*rows[:2], np.zeros(3), *rows[2:]]
    batcher = KerasAsyncBatcher(
        model=regressor, predict_fn=predict, buckets=(4, 8), max_batch_size=8, max_queue_time=0.05
    )
    async with batcher:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(batcher.process(i) for i in items), return_exceptions=True), 60
        )
    assert shapes == [(4, 10)]  # the four rows that stack, in a bucket of 4, not 5 rows in a bucket of 8
    np.testing.assert_allclose(
        np.stack([outcomes[n] for n in (0, 1, 3, 4)]), regressor.predict_on_batch(rows), rtol=RTOL
    )
    assert isinstance(outcomes[2], ValueError) and "item 2 has shape (3,)" in str(outcomes[2])
