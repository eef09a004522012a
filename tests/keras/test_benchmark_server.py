"""The Keras benchmark server, run for real (``python -m benchmarks.keras.server`` on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.servers import KerasServer, keras_server

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Both endpoints run the same weights on float32 rows, but in batches of different sizes, and float32 sums run
# in an order that depends on the batch's shape: an answer may differ from another in its last bits (measured:
# 3e-7 relative at most on this model, a few float32 ulps). 1e-5 allows for that; a row answered to the wrong
# caller differs by far more (checked below: the rows' predictions are further apart than that).
RTOL = 1e-5
ROWS = 48


@pytest.fixture(scope="module")
def server() -> Iterator[KerasServer]:
    # A long max_queue_time, so that concurrent requests surely share batches.
    with keras_server("--max-queue-time", "0.05", "--max-batch-size", "16") as running:
        yield running


@pytest.fixture(scope="module")
def rows_and_expected() -> tuple[np.ndarray, np.ndarray]:
    from benchmarks.keras import model as example_model

    model = example_model.load_or_train()  # the cached model the server loaded
    rows = example_model.sample_inputs(ROWS, seed=1)
    expected = np.asarray(model.predict_on_batch(rows))[:, 0]
    spread = np.min(np.abs(np.diff(np.sort(np.unique(expected)))))
    assert len(np.unique(expected)) == ROWS and spread > RTOL * np.max(np.abs(expected))
    return rows, expected


async def _post_all(url: str, path: str, rows: np.ndarray) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(rows))
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        return await asyncio.gather(*(client.post(path, json=[float(v) for v in row]) for row in rows))


@pytest.mark.single_loop
@pytest.mark.parametrize("path", ["/predict", "/optimized_predict"])
async def test_both_endpoints_answer_the_models_prediction(
    server: KerasServer, rows_and_expected: tuple[np.ndarray, np.ndarray], path: str
) -> None:
    rows, expected = rows_and_expected
    before = server.stats()
    responses = await _post_all(server.url, path, rows)
    assert [r.status_code for r in responses] == [200] * ROWS
    answers = np.array([r.json() for r in responses])
    np.testing.assert_allclose(answers, expected, rtol=RTOL)
    after = server.stats()
    batches, items = after["batches"] - before["batches"], after["processed"] - before["processed"]
    if path == "/optimized_predict":
        assert items == ROWS and batches < ROWS  # they did share batches
    else:
        assert items == 0  # /predict does not go through the batcher


@pytest.mark.single_loop
async def test_echo_health_and_stats(server: KerasServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        echo = await client.post("/echo", json=[0.5] * 10)
        echo_await = await client.post("/echo_await", json=[0.5] * 10)
        health = await client.get("/healthz")
        stats = await client.get("/stats")
    assert (echo.status_code, echo.json()) == (200, 0.0)
    assert (echo_await.status_code, echo_await.json()) == (200, 0.0)
    assert health.json() == {"status": "ok"}
    assert stats.json()["name"] == "keras-benchmark"


@pytest.mark.single_loop
@pytest.mark.parametrize(
    "body",
    [
        b"[1, 2, 3",  # not JSON
        b'{"x": 1}',  # not a list
        b"[1, 2, 3, 4, 5, 6, 7, 8, 9]",  # 9 features
        b"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]",  # 11 features
        b'[1, 2, 3, 4, 5, 6, 7, 8, 9, "10"]',  # a string
        b"[1, 2, 3, 4, 5, 6, 7, 8, 9, NaN]",  # Python's parser reads NaN; the model must not get it
        b"[1, 2, 3, 4, 5, 6, 7, 8, 9, 1e400]",  # infinity
        b"[1, 2, 3, 4, 5, 6, 7, 8, 9, true]",
    ],
)
@pytest.mark.parametrize("path", ["/predict", "/optimized_predict", "/echo", "/echo_await"])
async def test_malformed_bodies_are_422(server: KerasServer, path: str, body: bytes) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        response = await client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text


@pytest.mark.single_loop
async def test_a_422_says_where_without_echoing_the_input(server: KerasServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        bad_value = await client.post("/optimized_predict", content=b'[1, 2, 3, 4, 5, 6, 7, 8, 9, "secret"]')
        empty = await client.post("/predict", content=b"")
    assert bad_value.status_code == empty.status_code == 422
    (error,) = bad_value.json()["detail"]
    assert error["loc"] == ["body", 9] and error["type"] == "float_type"
    assert "secret" not in bad_value.text
    assert empty.json()["detail"][0]["loc"] == ["body"]


@pytest.mark.single_loop
async def test_the_openapi_schema_documents_the_body_and_the_answer(server: KerasServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        spec = (await client.get("/openapi.json")).json()
    for path in ("/predict", "/optimized_predict", "/echo", "/echo_await"):
        post = spec["paths"][path]["post"]
        body = post["requestBody"]["content"]["application/json"]["schema"]
        assert (body["type"], body["items"]["type"], body["minItems"], body["maxItems"]) == ("array", "number", 10, 10)
        assert post["responses"]["200"]["content"]["application/json"]["schema"]["type"] == "number"


@pytest.mark.single_loop
@pytest.mark.parametrize("chunked", [False, True])
async def test_large_bodies_are_413(server: KerasServer, chunked: bool) -> None:
    body = json.dumps([1.0] * 2000).encode()  # 10 KB, over the 4 KiB limit
    content: Any = body
    if chunked:  # no Content-Length to refuse it by: the limit must hold while reading

        async def chunks() -> Any:
            for start in range(0, len(body), 1024):
                yield body[start : start + 1024]

        content = chunks()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        response = await client.post(
            "/optimized_predict", content=content, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413


@pytest.mark.single_loop
async def test_shutdown_answers_the_requests_it_holds(rows_and_expected: tuple[np.ndarray, np.ndarray]) -> None:
    rows, expected = rows_and_expected
    n = 12
    # The first item of a batch waits 3 s for others: the requests are sure to be held in the queue at SIGTERM.
    with keras_server("--max-queue-time", "3", "--max-batch-size", "64") as server:
        requests = asyncio.ensure_future(_post_all(server.url, "/optimized_predict", rows[:n]))
        deadline = asyncio.get_running_loop().time() + 60
        # /stats is the only window on the queue; bounded, and every poll is a request, not a sleep.
        while (await asyncio.to_thread(server.stats))["queued"] < n:
            assert asyncio.get_running_loop().time() < deadline, "the requests never reached the queue"
        server.terminate()
        responses = await requests
        # uvicorn re-raises the signal it shut down for once it is done: a clean exit reads as -SIGTERM.
        assert await asyncio.to_thread(server.wait) in (0, -signal.SIGTERM)
        log = server.log_text()
    assert [r.status_code for r in responses] == [200] * n, log
    assert "Traceback" not in log, log
    np.testing.assert_allclose([r.json() for r in responses], expected[:n], rtol=RTOL)


@pytest.mark.single_loop
async def test_a_full_queue_answers_503_at_once(rows_and_expected: tuple[np.ndarray, np.ndarray]) -> None:
    rows, expected = rows_and_expected
    n, room = 6, 2
    # Room for two; a batch's first item waits 3 s for others, so the two accepted stay queued while the other
    # four are refused: those must come back first, without waiting for the batch.
    with keras_server("--max-queue-size", str(room), "--max-queue-time", "3", "--max-batch-size", "64") as server:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            posts = [client.post("/optimized_predict", json=[float(v) for v in row]) for row in rows[:n]]
            in_order = [await done for done in asyncio.as_completed(posts)]
        stats = server.stats()
    assert [r.status_code for r in in_order] == [503] * (n - room) + [200] * room
    assert all(r.headers["Retry-After"] == "1" for r in in_order[: n - room])
    assert (stats["rejected"], stats["processed"]) == (n - room, room)
    answers = sorted(r.json() for r in in_order[n - room :])
    assert all(np.isclose(expected[:n], a, rtol=RTOL).any() for a in answers)


@pytest.mark.single_loop
async def test_the_server_runs_as_a_file_from_any_folder(rows_and_expected: tuple[np.ndarray, np.ndarray]) -> None:
    # python benchmarks/keras/server.py, as its docstring's reader may start it (and a folder other than the
    # repository's): the imports, and uvicorn's import of the app, must still find the repository.
    rows, expected = rows_and_expected
    with keras_server(as_file=True) as running:
        for path in ("/predict", "/optimized_predict"):
            responses = await _post_all(running.url, path, rows[:4])
            assert [r.status_code for r in responses] == [200] * 4
            np.testing.assert_allclose([r.json() for r in responses], expected[:4], rtol=RTOL)


def test_settings_read_the_environment_and_refuse_bad_values() -> None:
    from benchmarks.keras.server import ServerSettings

    settings = ServerSettings.from_env({"KERAS_SERVER_MAX_BATCH_SIZE": "64", "KERAS_SERVER_MAX_QUEUE_TIME": "0.01"})
    assert (settings.max_batch_size, settings.max_queue_time) == (64, 0.01)
    assert ServerSettings.from_env(settings.to_env()) == settings
    with pytest.raises(ValueError, match=r"KERAS_SERVER_WORKERS='two' is not a valid int"):
        ServerSettings.from_env({"KERAS_SERVER_WORKERS": "two"})
    with pytest.raises(ValueError, match="max_body_bytes must be >= 1, got 0"):
        ServerSettings(max_body_bytes=0)
    with pytest.raises(ValueError, match=r"port must be in 0\.\.65535"):
        ServerSettings(port=70000)


@pytest.mark.single_loop
async def test_metrics_export_the_batchers_statistics(server: KerasServer) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.post("/optimized_predict", json=[0.1] * 10)).status_code == 200
        metrics = await client.get("/metrics/")
    assert metrics.status_code == 200
    lines = [line for line in metrics.text.splitlines() if line.startswith("async_batcher_batches_total")]
    # One series per reason a batch went (stats.reasons): together at least the one batch.
    assert lines and all(
        line.startswith('async_batcher_batches_total{batcher="keras-benchmark",reason="') for line in lines
    )
    assert sum(float(line.split()[-1]) for line in lines) >= 1
