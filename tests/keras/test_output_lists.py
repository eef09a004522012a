"""How ml.numpy reads a list in a model's outputs (issue 26, item 13): never two ways.

A list of plain Python values is one element per item; a list of arrays is several outputs; a list of arrays that
could be both (as many elements as the batch has rows, each with that many rows) is refused, naming the shapes,
unless ``lists=`` says which it is. The case that used to go wrong silently: a model that returns a plain list of
per-item rows whose width is the batch size.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import pytest
import scipy.sparse

from async_batcher.ml.numpy import split_outputs
from tests.requires import require

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
WAIT = 60
RTOL = 1e-5


def _rows(n: int, width: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(9).normal(size=(n, width)).astype(np.float32)


async def test_a_keras_predict_fn_returning_a_plain_list_of_rows_as_wide_as_the_batch_gives_each_caller_its_row() -> (
    None
):
    # Today: the list is read as three outputs, and caller i gets column i: [row0[i], row1[i], row2[i]].
    keras = require("keras", "make test-all installs it (the test-all group: Keras on TensorFlow)")
    from async_batcher.ml.keras import KerasAsyncBatcher

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3)])
    rows = _rows(3, 4)

    def predict(x: Any) -> Any:
        return model.predict_on_batch(x).tolist()  # 3 items, rows of 3: a list of 3 lists of 3 floats

    batcher = KerasAsyncBatcher(model=model, predict_fn=predict, max_batch_size=3, max_queue_time=0.05)
    async with batcher:
        results = await asyncio.wait_for(asyncio.gather(*(batcher.process(row) for row in rows)), WAIT)
    assert batcher.stats.batches == 1
    expected = model.predict_on_batch(rows)
    assert not np.allclose(expected, expected.T, rtol=RTOL)  # a transposed answer would fail below
    for n, result in enumerate(results):
        np.testing.assert_allclose(result, expected[n], rtol=RTOL)


def test_a_plain_list_is_one_element_per_item() -> None:
    assert split_outputs([[1, 2], [3, 4]], 2) == [[1, 2], [3, 4]]
    assert split_outputs(["cat", "dog", "pad"], 2, padded_size=3) == ["cat", "dog"]
    assert split_outputs([{"label": "cat", "p": 0.9}, {"label": "dog", "p": 0.8}], 2)[1] == {"label": "dog", "p": 0.8}
    # A list of labels among the outputs, next to an array
    labels, scores = zip(*split_outputs((["cat", "dog"], np.array([0.9, 0.8])), 2), strict=True)
    assert labels == ("cat", "dog") and [float(s) for s in scores] == [0.9, 0.8]
    with pytest.raises(ValueError, match=r"the output \(a list read as one element per item\) has 3 rows for a batch"):
        split_outputs([[1, 2], [3, 4], [5, 6]], 2, padded_size=2)


def test_a_list_of_arrays_that_reads_two_ways_is_refused_naming_the_shapes() -> None:
    per_item_rows = list(np.arange(4.0).reshape(2, 2))  # two items' rows, each 2 wide: or two outputs of 2 rows
    with pytest.raises(
        ValueError, match=r"the output is ambiguous: a list of 2 elements .* \(shape \(2,\), shape \(2,\)\)"
    ):
        split_outputs(per_item_rows, 2)
    assert [r.tolist() for r in split_outputs(per_item_rows, 2, lists="items")] == [[0.0, 1.0], [2.0, 3.0]]
    assert [[a.item(), b.item()] for a, b in split_outputs(per_item_rows, 2, lists="outputs")] == [[0, 2], [1, 3]]


def test_a_list_of_arrays_is_several_outputs_when_it_cannot_be_one_per_item() -> None:
    outputs = [np.array([[1], [2], [3]]), np.array([4, 5, 6])]
    assert [(a.tolist(), int(b)) for a, b in split_outputs(outputs, 3)] == [([1], 4), ([2], 5), ([3], 6)]
    # rows of another width than the batch: an error that says how the list was read, and how to say otherwise
    with pytest.raises(ValueError, match=r"output\[0\] has 3 rows for a batch of 2 rows .*outputs: pass lists='items'"):
        split_outputs(list(np.zeros((2, 3))), 2, padded_size=2)
    assert [r.shape for r in split_outputs(list(np.zeros((2, 3))), 2, padded_size=2, lists="items")] == [(3,), (3,)]
    with pytest.raises(ValueError, match="lists must be 'auto', 'outputs' or 'items', got 'rows'"):
        split_outputs([np.zeros(2)], 2, lists="rows")  # type: ignore[arg-type]


def test_values_for_the_whole_batch_and_objects_are_refused() -> None:
    with pytest.raises(ValueError, match=r"the output is a scalar, not a batch of 1 row"):
        split_outputs(np.float32(1.0), 1)
    with pytest.raises(TypeError, match=r"the output is an int \(3\), not a batch of 2 rows"):
        split_outputs(3, 2)
    with pytest.raises(TypeError, match=r"model is an object, not an array with one row per item"):
        split_outputs({"scores": np.zeros(2), "model": object()}, 2)
    with pytest.raises(TypeError, match=r"the output is a generator, not an array"):
        split_outputs((x for x in range(2)), 2)


@pytest.mark.parametrize("kind", ["csr_matrix", "csc_matrix", "coo_array", "csr_array"])
def test_a_sparse_output_gives_each_item_its_row_as_a_one_row_csr(kind: str) -> None:
    dense = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    sparse = getattr(scipy.sparse, kind)(dense)
    rows = split_outputs({"onehot": sparse}, 2, padded_size=3)
    for n, row in enumerate(rows):
        assert scipy.sparse.issparse(row["onehot"]) and row["onehot"].format == "csr"
        assert row["onehot"].shape == (1, 3)
        np.testing.assert_array_equal(row["onehot"].toarray()[0], dense[n])
    with pytest.raises(ValueError, match=r"onehot has 3 rows for a batch of 4 rows \(shape \(3, 3\)\)"):
        split_outputs({"onehot": sparse}, 2, padded_size=4)
    with pytest.raises(ValueError, match="the output is a 1-D sparse coo_array, not a matrix"):
        split_outputs(scipy.sparse.coo_array(np.array([1.0, 0.0])), 2)
