"""A Keras model behind FastAPI: concurrent requests share one model call.

    cd examples/keras                        # this folder
    pip install -r requirements.txt
    python train.py model.keras              # or bring your own model: 10 inputs, 1 output
    MODEL_PATH=model.keras uvicorn app:app
    curl -X POST localhost:8000/predict -H 'Content-Type: application/json' \\
        -d '{"features": [0.04, 0.05, 0.06, 0.02, -0.04, -0.03, -0.04, 0.0, 0.02, -0.02]}'

Several worker processes (``--workers N``) each load the model and batch their own requests; with ``--shared``
they share one batcher and one model instead (an ``async_batcher.shared.SharedBatcher``): the first worker to
start imports TensorFlow and loads the model, the others import neither and send it their requests, so that a
batch holds every worker's requests and the model sits in memory once:

    MODEL_PATH=model.keras python app.py --workers 4 --shared
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI
from pydantic import BaseModel, Field

from async_batcher.fastapi import add_batcher_exception_handlers, batcher_dependency, batcher_lifespan, run_batchers
from async_batcher.ml.keras import KerasAsyncBatcher
from async_batcher.shared import SharedBatcher

N_FEATURES = 10
SHARED = os.environ.get("KERAS_EXAMPLE_SHARED") == "1"  # set by --shared, read by every worker


class Features(BaseModel):
    # Exactly the model's input shape: a request of another length is refused here (422) and never reaches a
    # batch, where it would fail the requests stacked with it.
    features: Annotated[list[float], Field(min_length=N_FEATURES, max_length=N_FEATURES)]


class Prediction(BaseModel):
    prediction: float


def make_predictor() -> KerasAsyncBatcher:
    import keras  # here, not above: with --shared only the worker that owns the batcher loads TensorFlow

    model = keras.models.load_model(os.environ.get("MODEL_PATH", "model.keras"))
    return KerasAsyncBatcher(
        model=model,
        name="predictor",
        dtype=np.float32,  # the model's input dtype
        max_batch_size=256,
        max_queue_time=0,  # a batch goes as soon as the model is free; the next one fills while it runs
        max_queue_size=4096,  # past that, 503 + Retry-After rather than an ever longer wait
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    async with run_batchers(make_predictor()) as batchers:  # started now; drained and stopped at shutdown
        yield batchers  # the lifespan state: batcher_dependency finds the batcher there


if SHARED:  # one batcher for every worker: made (and the model loaded) by the first to start, in a thread
    predictor = SharedBatcher(make_predictor, name="predictor")
    app = FastAPI(title="A Keras model, batched across workers", lifespan=batcher_lifespan(predictor))
else:
    app = FastAPI(title="A Keras model, batched", lifespan=lifespan)
add_batcher_exception_handlers(app)  # with --shared too: a full queue in the owner is a 503 in every worker
Predictor = Annotated[KerasAsyncBatcher, Depends(batcher_dependency("predictor"))]


@app.post("/predict")
async def predict(body: Features, batcher: Predictor) -> Prediction:
    row = await batcher.process(body.features)  # this request's row of the batch's output
    return Prediction(prediction=float(row[0]))


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="The Keras example behind uvicorn.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--shared", action="store_true", help="the workers share one batcher and one model")
    args = parser.parse_args()
    os.environ["KERAS_EXAMPLE_SHARED"] = "1" if args.shared else "0"  # (the workers import this module anew)
    here = os.path.dirname(os.path.abspath(__file__))
    uvicorn.run("app:app", app_dir=here, host=args.host, port=args.port, workers=args.workers)


if __name__ == "__main__":
    main()
