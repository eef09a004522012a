"""Train the example's model on scikit-learn's bundled diabetes data (10 features) and save it.

python train.py model.keras      # from this folder, after pip install -r requirements.txt
"""

from __future__ import annotations

import sys

import keras
from sklearn.datasets import load_diabetes

N_FEATURES = 10


def train(path: str, *, epochs: int = 20) -> keras.Model:
    x, y = load_diabetes(return_X_y=True)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(shape=(N_FEATURES,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mean_squared_error")
    model.fit(x.astype("float32"), y.astype("float32"), epochs=epochs, verbose=0)
    model.save(path)
    return model


if __name__ == "__main__":
    train(sys.argv[1] if len(sys.argv) > 1 else "model.keras")
