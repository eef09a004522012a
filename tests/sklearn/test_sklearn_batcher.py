"""SklearnAsyncBatcher on models trained here on scikit-learn's bundled data sets (iris, wine)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse
from sklearn.datasets import load_iris, load_wine
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.multioutput import MultiOutputClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from async_batcher.ml.sklearn import SklearnAsyncBatcher
from async_batcher.ml.sklearn.model import SklearnAsyncBatcher as Original
from tests.snippets import run_snippet


def iris_classifier() -> tuple[Any, np.ndarray[Any, Any]]:
    features, labels = load_iris(return_X_y=True)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(features, labels)
    return model, features


async def test_each_caller_gets_its_own_prediction() -> None:
    model, features = iris_classifier()
    batcher = SklearnAsyncBatcher(model=model, max_batch_size=32)
    async with batcher:
        predictions = await asyncio.gather(*(batcher.process(list(row)) for row in features))
    assert np.array_equal(np.array(predictions), model.predict(features))
    assert batcher.stats.batches >= len(features) // 32  # batched, not one call per row
    assert batcher.stats.batches < len(features) // 4


@pytest.mark.parametrize("method", ["predict_proba", "decision_function"])
async def test_a_chosen_method_gives_each_caller_its_row(method: str) -> None:
    model, features = iris_classifier()
    async with SklearnAsyncBatcher(model=model, method=method, dtype=np.float32) as batcher:
        rows = await asyncio.gather(*(batcher.process(row) for row in features[::7]))
    expected = getattr(model, method)(features[::7].astype(np.float32))
    assert all(row.shape == (3,) for row in rows)
    np.testing.assert_allclose(np.stack(rows), expected, rtol=1e-6)


async def test_transform() -> None:
    features, _ = load_wine(return_X_y=True)
    pca = make_pipeline(StandardScaler(), PCA(n_components=2)).fit(features)
    async with SklearnAsyncBatcher(model=pca, method="transform") as batcher:
        rows = await batcher.process_many(list(features))
    np.testing.assert_allclose(np.stack(rows), pca.transform(features))


async def test_a_row_of_the_wrong_shape_fails_only_its_caller() -> None:
    model, features = iris_classifier()
    rows: list[Any] = [list(features[0]), [1.0, 2.0], list(features[1]), "abcd", [[1, 2, 3, 4]], list(features[2])]
    async with SklearnAsyncBatcher(model=model, max_batch_size=len(rows)) as batcher:
        results = await asyncio.gather(*(batcher.process(row) for row in rows), return_exceptions=True)
    assert [results[0], results[2], results[5]] == list(model.predict(features[:3]))
    assert isinstance(results[1], ValueError) and "takes rows of 4 features, got 2" in str(results[1])
    assert isinstance(results[3], ValueError) and "1-D sequence of numbers" in str(results[3])
    assert isinstance(results[4], ValueError) and "shape (1, 4)" in str(results[4])


async def test_a_sparse_transform_gives_each_caller_its_row_as_a_sparse_row() -> None:
    # Issue 26, item 12: a default OneHotEncoder returns a CSR matrix, which every caller got as "the output is a
    # scalar, not a batch of 3 rows".
    rows = np.array([[0, 10], [1, 20], [2, 30], [1, 10], [0, 30]])
    encoder = OneHotEncoder().fit(rows)
    expected = encoder.transform(rows)
    assert scipy.sparse.issparse(expected)
    async with SklearnAsyncBatcher(model=encoder, method="transform", max_batch_size=5, max_queue_time=0.05) as b:
        results = await asyncio.wait_for(asyncio.gather(*(b.process(list(row)) for row in rows)), 60)
    assert b.stats.batches == 1
    for n, result in enumerate(results):
        assert scipy.sparse.issparse(result) and result.format == "csr" and result.shape == (1, 6)
        np.testing.assert_array_equal(result.toarray(), expected[n].toarray())


async def test_a_list_of_outputs_of_a_multi_output_classifier_is_split_per_output() -> None:
    # predict_proba of a multi-output classifier is a list of arrays, one per output. With as many outputs as
    # rows in the batch it reads two ways: lists="outputs" says which.
    features, labels = load_iris(return_X_y=True)
    targets = np.stack([labels, labels % 2], axis=1)
    model = MultiOutputClassifier(LogisticRegression(max_iter=500)).fit(features, targets)
    for size, lists in ((3, "auto"), (2, "outputs")):
        batcher = SklearnAsyncBatcher(
            model=model, method="predict_proba", lists=lists, max_batch_size=size, max_queue_time=0.05
        )
        async with batcher:
            rows = features[:size]
            results = await asyncio.wait_for(asyncio.gather(*(batcher.process(row) for row in rows)), 60)
        first, second = model.predict_proba(rows)
        for n, result in enumerate(results):
            assert isinstance(result, list) and len(result) == 2
            np.testing.assert_allclose(result[0], first[n])
            np.testing.assert_allclose(result[1], second[n])
    async with SklearnAsyncBatcher(model=model, method="predict_proba", max_batch_size=2, max_queue_time=0.05) as b:
        calls = (b.process(row) for row in features[:2])
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
    assert all(isinstance(o, ValueError) and "the output is ambiguous" in str(o) for o in outcomes)


async def test_rows_of_another_width_fail_alone_with_a_model_that_does_not_say_its_width() -> None:
    class Width:  # a model without n_features_in_: the batcher cannot check widths before stacking
        def predict(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            return x.sum(axis=1)

    async with SklearnAsyncBatcher(model=Width(), max_batch_size=3, max_queue_time=0.05) as batcher:
        calls = (batcher.process(row) for row in ([1.0, 2.0], [1.0, 2.0, 3.0], [3.0, 4.0]))
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
    assert outcomes[0] == 3.0 and outcomes[2] == 7.0
    assert isinstance(outcomes[1], ValueError) and "item 1 has shape (3,)" in str(outcomes[1])


async def test_a_custom_estimator_returning_a_list_of_labels_gives_each_caller_its_label() -> None:
    model, features = iris_classifier()

    class Named:  # a custom estimator whose predict returns a plain list, as scikit-learn's array-like allows
        n_features_in_ = 4

        def predict(self, x: np.ndarray[Any, Any]) -> list[str]:
            return [["setosa", "versicolor", "virginica"][label] for label in model.predict(x)]

    async with SklearnAsyncBatcher(model=Named(), max_batch_size=3, max_queue_time=0.05) as batcher:
        labels = await asyncio.wait_for(asyncio.gather(*(batcher.process(row) for row in features[[0, 60, 120]])), 60)
    assert labels == Named().predict(features[[0, 60, 120]]) == ["setosa", "versicolor", "virginica"]


def test_a_model_without_the_method_is_refused() -> None:
    model, _ = iris_classifier()
    with pytest.raises(TypeError, match="model Pipeline has no method 'transform'"):
        SklearnAsyncBatcher(model=model, method="transform")
    assert SklearnAsyncBatcher is Original


def test_a_missing_numpy_names_the_extra() -> None:
    code = "import sys; sys.modules['numpy'] = None; import async_batcher.ml.sklearn"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "pip install 'async-batcher[sklearn]'" in done.stderr


def test_the_documentation_snippet_runs(tmp_path: Path) -> None:
    assert "[0.982 0.018 0.   ]" in run_snippet("docs/snippets/sklearn_predict.py", tmp_path)
