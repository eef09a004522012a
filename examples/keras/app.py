"""A Keras model behind FastAPI: concurrent requests share one model call.

    cd examples/keras                        # this folder
    pip install -r requirements.txt
    python train.py model.keras              # or bring your own model: 10 inputs, 1 output
    MODEL_PATH=model.keras uvicorn app:app
    curl -X POST localhost:8000/predict -H 'Content-Type: application/json' \\
        -d '{"features": [0.04, 0.05, 0.06, 0.02, -0.04, -0.03, -0.04, 0.0, 0.02, -0.02]}'
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import keras
import numpy as np
from fastapi import Depends, FastAPI
from pydantic import BaseModel, Field

from async_batcher.fastapi import add_batcher_exception_handlers, batcher_dependency, run_batchers
from async_batcher.ml.keras import KerasAsyncBatcher

N_FEATURES = 10


class Features(BaseModel):
    # Exactly the model's input shape: a request of another length is refused here (422) and never reaches a
    # batch, where it would fail the requests stacked with it.
    features: Annotated[list[float], Field(min_length=N_FEATURES, max_length=N_FEATURES)]


class Prediction(BaseModel):
    prediction: float


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    model = keras.models.load_model(os.environ.get("MODEL_PATH", "model.keras"))
    batcher = KerasAsyncBatcher(
        model=model,
        name="predictor",
        dtype=np.float32,  # the model's input dtype
        max_batch_size=256,
        max_queue_time=0,  # a batch goes as soon as the model is free; the next one fills while it runs
        max_queue_size=4096,  # past that, 503 + Retry-After rather than an ever longer wait
    )
    async with run_batchers(batcher) as batchers:  # started now; drained and stopped at shutdown
        yield batchers  # the lifespan state: batcher_dependency finds the batcher there


app = FastAPI(title="A Keras model, batched", lifespan=lifespan)
add_batcher_exception_handlers(app)
Predictor = Annotated[KerasAsyncBatcher, Depends(batcher_dependency("predictor"))]


@app.post("/predict")
async def predict(body: Features, batcher: Predictor) -> Prediction:
    row = await batcher.process(body.features)  # this request's row of the batch's output
    return Prediction(prediction=float(row[0]))
