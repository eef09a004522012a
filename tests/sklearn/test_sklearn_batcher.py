"""SklearnAsyncBatcher on models trained here on scikit-learn's bundled data sets (iris, wine)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_iris, load_wine
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

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
