"""Serve a scikit-learn model's predictions to concurrent callers.

One model call per batch, in a thread: the event loop stays free.
"""

import asyncio

from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from async_batcher.ml.sklearn import SklearnAsyncBatcher


async def main() -> None:
    features, labels = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=500).fit(features, labels)

    async with SklearnAsyncBatcher(model=model, max_batch_size=64) as batcher:
        # 150 concurrent single-row predictions become 3 predict() calls.
        predictions = await asyncio.gather(*(batcher.process(row) for row in features))
    async with SklearnAsyncBatcher(
        model=model, method="predict_proba"
    ) as probabilities:
        first = await probabilities.process([5.1, 3.5, 1.4, 0.2])
    print(predictions[:3], first.round(3))  # [0, 0, 0] [0.98 0.02 0.  ]
    assert list(predictions) == list(model.predict(features))


if __name__ == "__main__":
    asyncio.run(main())
