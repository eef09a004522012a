"""The example's model: a deep MLP regressor on scikit-learn's bundled diabetes data set.

It is the workload of async-batcher 0.2.2's Keras example (49 hidden ``Dense(64, relu)`` layers on 10
features): a prediction costs about the same whatever the batch size, op dispatch dominating the arithmetic,
which is exactly the cost that batching amortises. The model is trained on first use (a few seconds) and
cached under ``.cache/``; nothing is downloaded, the data ships inside scikit-learn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Both read when TensorFlow is imported. The C++ start-up notices fill a page of stderr. oneDNN's kernels double
# the cost of this model's small matmuls (measured here: 0.65 ms against 0.33 ms a single-row call, 1.06 against
# 0.90 ms for 256 rows, see reports/keras.md); setdefault leaves both to the user to override.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

if TYPE_CHECKING:
    import keras
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "CACHE_DIR",
    "N_FEATURES",
    "ModelSpec",
    "build_model",
    "compiled_predict",
    "configure_threads",
    "load_or_train",
    "sample_inputs",
]

logger = logging.getLogger("async_batcher.benchmarks.keras")

N_FEATURES = 10
CACHE_DIR = Path(os.environ.get("ASYNC_BATCHER_CACHE", Path(__file__).resolve().parents[2] / ".cache"))


@dataclass(frozen=True)
class ModelSpec:
    """What defines a trained model: two specs that are equal share one cached file."""

    hidden_layers: int = 49
    units: int = 64
    epochs: int = 5
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("hidden_layers", "units", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def cache_path(self) -> Path:
        import keras

        key = json.dumps({**asdict(self), "keras": keras.__version__}, sort_keys=True)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return CACHE_DIR / "keras" / f"diabetes-mlp-{self.hidden_layers}x{self.units}-{digest}.keras"


def configure_threads(intra_op: int | None, inter_op: int | None) -> None:
    """Bound TensorFlow's thread pools; must run before TensorFlow executes its first op.

    On a small machine TensorFlow's default pools (one thread per core each) fight the web server and the load
    generator for the same cores; a tiny model gains nothing from intra-op parallelism anyway.
    """
    import tensorflow as tf

    threading = tf.config.threading
    # Setting a pool to the size it has is a no-op TensorFlow allows at any time: skip it, so that a process
    # that configured, then trained, can configure again (the server's lifespan after its command line).
    if intra_op is not None and threading.get_intra_op_parallelism_threads() != intra_op:
        threading.set_intra_op_parallelism_threads(intra_op)
    if inter_op is not None and threading.get_inter_op_parallelism_threads() != inter_op:
        threading.set_inter_op_parallelism_threads(inter_op)


def build_model(spec: ModelSpec) -> keras.Model:
    import keras

    layers: list[keras.Layer] = [keras.Input(shape=(N_FEATURES,), dtype="float32")]
    layers += [keras.layers.Dense(spec.units, activation="relu") for _ in range(spec.hidden_layers)]
    layers.append(keras.layers.Dense(1))
    return keras.Sequential(layers, name="diabetes_mlp")


def _train(spec: ModelSpec) -> keras.Model:
    import keras
    from sklearn.datasets import load_diabetes

    keras.utils.set_random_seed(spec.seed)
    x, y = load_diabetes(return_X_y=True)
    model = build_model(spec)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mean_squared_error")
    model.fit(x.astype("float32"), y.astype("float32"), epochs=spec.epochs, batch_size=32, verbose=0)
    return model


def load_or_train(spec: ModelSpec | None = None) -> keras.Model:
    """The cached model for ``spec``, training and caching it first if there is none.

    The file is written to a temporary name and renamed, so a server and a test that train at once never see a
    half-written model.
    """
    import keras

    spec = spec or ModelSpec()
    path = spec.cache_path
    if path.exists():
        return keras.models.load_model(path)
    logger.info("training the example model (%s), cached at %s", spec, path)
    model = _train(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".keras")
    os.close(fd)
    try:
        model.save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return model


def compiled_predict(model: keras.Model) -> Any:
    """The model as one traced TensorFlow graph for float32 batches of any size: a ``ConcreteFunction``.

    ``model.predict`` costs tens of milliseconds per call whatever the batch size (it builds a data pipeline
    each time); ``predict_on_batch`` retraces on new batch sizes until it generalises, and a ``tf.function``
    re-binds its arguments and looks its trace up on every call. A concrete function with a free batch
    dimension is traced once and called directly: the least Python per call, which matters because that
    Python holds the GIL the web server's event loop needs (see reports/keras.md).
    """
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, N_FEATURES], tf.float32)])
    def predict(x: tf.Tensor) -> tf.Tensor:
        return model(x, training=False)

    return predict.get_concrete_function()


def sample_inputs(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """``n`` rows of the diabetes data set, distinct while there are enough (442), in a seeded random order."""
    import numpy as np
    from sklearn.datasets import load_diabetes

    x, _ = load_diabetes(return_X_y=True)
    rng = np.random.default_rng(seed)
    return np.asarray(x[rng.choice(len(x), size=n, replace=n > len(x))], dtype=np.float32)
