"""examples/keras/: train.py's model served by app.py under a real uvicorn, as its docstring says to run it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.servers import ThreadServer

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Batches of different sizes sum float32 in different orders: a row's answer may differ in its last bits.
RTOL = 1e-5


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from examples.keras.train import train

    path = tmp_path_factory.mktemp("model") / "model.keras"
    train(str(path), epochs=2)
    return path


@pytest.fixture
def served(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadServer]:
    from examples.keras.app import app

    monkeypatch.setenv("MODEL_PATH", str(model_path))
    server = ThreadServer(app)
    server.start()
    try:
        yield server
    finally:
        server.begin_shutdown()
        server.join()


def _rows(n: int) -> np.ndarray:
    from sklearn.datasets import load_diabetes

    x, _ = load_diabetes(return_X_y=True)
    return x[:n].astype(np.float32)


@pytest.mark.single_loop
async def test_concurrent_requests_share_batches_and_get_their_own_prediction(
    served: ThreadServer, model_path: Path
) -> None:
    import keras

    rows = _rows(32)
    expected = np.asarray(keras.models.load_model(model_path).predict_on_batch(rows))[:, 0]
    limits = httpx.Limits(max_connections=len(rows))
    async with httpx.AsyncClient(base_url=served.url, timeout=60, limits=limits) as client:
        responses = await asyncio.gather(
            *(client.post("/predict", json={"features": [float(v) for v in row]}) for row in rows)
        )
    assert [r.status_code for r in responses] == [200] * len(rows)
    np.testing.assert_allclose([r.json()["prediction"] for r in responses], expected, rtol=RTOL)
    stats = served.state["predictor"].stats
    assert stats.processed == len(rows) and stats.batches < len(rows)  # they did share model calls


@pytest.mark.single_loop
async def test_a_body_of_the_wrong_shape_is_422_and_fails_no_one_else(served: ThreadServer) -> None:
    rows = _rows(6)
    bodies: list[Any] = [{"features": [float(v) for v in row]} for row in rows]
    bodies[2] = {"features": [1.0, 2.0, 3.0]}  # too short: it would fail a whole batch if it reached one
    bodies[4] = {"features": [1.0] * 11}
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
        responses = await asyncio.gather(*(client.post("/predict", json=body) for body in bodies))
    assert [r.status_code for r in responses] == [200, 200, 422, 200, 422, 200]
    assert responses[2].json()["detail"][0]["loc"] == ["body", "features"]


def _tensorflow_loaded(pid: int) -> bool:
    """Whether the process has TensorFlow's library mapped (it imported TensorFlow)."""
    with open(f"/proc/{pid}/maps") as f:
        return "libtensorflow" in f.read()


@pytest.mark.single_loop
def test_two_workers_share_one_batcher_and_one_model(model_path: Path, tmp_path: Path) -> None:
    """``python app.py --workers 2 --shared``, from the example's folder as its docstring runs it: every worker
    answers, the batches hold both workers' requests, and TensorFlow is loaded in one process only."""
    import subprocess
    import sys

    import keras

    from tests.processes import children, kill_group
    from tests.servers import ROOT, STARTUP_TIMEOUT, free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KERAS_EXAMPLE_SHARED"}
    runtime = tempfile.mkdtemp(prefix="ab-", dir="/tmp")  # the socket's folder: this test's own (and short)
    env.update(MODEL_PATH=str(model_path), XDG_RUNTIME_DIR=runtime)
    command = [sys.executable, "app.py", "--workers", "2", "--shared", "--port", str(port)]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, cwd=ROOT / "examples" / "keras", env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    rows = _rows(48)
    expected = np.asarray(keras.models.load_model(model_path).predict_on_batch(rows))[:, 0]
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:  # bounded: up once a request is answered (the owner has loaded the model)
            assert server.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(f"http://127.0.0.1:{port}/predict", json={"features": [0.0] * 10}).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)

        async def load() -> list[httpx.Response]:
            async def one(row: np.ndarray) -> httpx.Response:
                async with httpx.AsyncClient(timeout=60) as client:  # (a connection each: both workers answer)
                    body = {"features": [float(v) for v in row]}
                    return await client.post(f"http://127.0.0.1:{port}/predict", json=body)

            return list(await asyncio.gather(*(one(row) for row in rows)))

        responses = asyncio.run(load())
        assert [r.status_code for r in responses] == [200] * len(rows)
        np.testing.assert_allclose([r.json()["prediction"] for r in responses], expected, rtol=RTOL)
        workers = [pid for pid in children(server.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(workers) == 2
        # One model: the worker that owns the batcher loaded TensorFlow; the other, and uvicorn's supervisor, did not.
        assert sorted(_tensorflow_loaded(pid) for pid in [*workers, server.pid]) == [False, False, True]
    finally:
        left = kill_group(server)
        shutil.rmtree(runtime, ignore_errors=True)
    assert not left and server.returncode == 0, log.read_text()
