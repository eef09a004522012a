"""The Keras example server with two uvicorn workers: one /metrics adding up both, /ready, a clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import children, kill_group
from tests.scaling_targets import SERVER_MODULE, server_module
from tests.servers import ROOT, STARTUP_TIMEOUT, free_port

RTOL = 1e-5  # as in test_example_server.py: float32 sums in another order
REQUESTS = 160


def _get(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Connection": "close"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, row: list[float]) -> float:
    body = json.dumps(row).encode()
    headers = {"Content-Type": "application/json", "Connection": "close"}  # a new connection: either worker
    with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=60) as response:
        return float(json.load(response))


def _metrics_dir(parent: int) -> Path | None:
    """The PROMETHEUS_MULTIPROC_DIR the server's main() made for its workers, read from a worker's environment."""
    for child in children(parent):
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            for entry in environ:
                if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR="):
                    return Path(entry.split(b"=", 1)[1].decode())
    return None


@contextlib.contextmanager
def _server(
    log: Path, *options: str, up: Callable[[str, subprocess.Popen[bytes]], bool]
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """The server with two workers and ``options``, once ``up(url, process)`` (bounded); every process ended after."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_SERVER_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    command = [sys.executable, "-m", SERVER_MODULE, "--port", str(port), "--workers", "2", *options]
    command += ["--max-queue-time", "0.02", "--max-batch-size", "16"]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not up(url, process):  # bounded: the workers import TensorFlow and load the model
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"two workers were not up in {STARTUP_TIMEOUT} s:\n{log.read_text()}"
            time.sleep(0.2)
        directory = _metrics_dir(process.pid)
        assert directory is not None
        yield url, process, directory
    finally:
        left = kill_group(process)
        assert not left, f"left running after a graceful stop: {left}\n{log.read_text()}"


def _both_exporting(url: str, process: subprocess.Popen[bytes]) -> bool:
    """Each worker writes its live gauges once its model is loaded and its batcher runs."""
    directory = _metrics_dir(process.pid)
    return directory is not None and len(list(directory.glob("gauge_livesum_*.db"))) == 2


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    with _server(tmp_path_factory.mktemp("workers") / "server.log", up=_both_exporting) as server:
        yield server


@pytest.mark.single_loop
def test_one_scrape_adds_up_both_workers(two_workers: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    from benchmarks.keras import model as example_model

    url, _, directory = two_workers
    assert _get(url + "/ready") == (200, b'{"ready":true}')
    rows = example_model.sample_inputs(REQUESTS, seed=3)
    expected = np.asarray(example_model.load_or_train().predict_on_batch(rows))[:, 0]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda row: _post(url + "/optimized_predict", [float(v) for v in row]), rows))
    np.testing.assert_allclose(answers, expected, rtol=RTOL)

    families = {f.name: f for f in text_string_to_metric_families(_get(url + "/metrics/")[1].decode())}
    samples = {s.name: s.value for s in families["async_batcher_batch_size"].samples if "le" not in s.labels}
    assert samples["async_batcher_batch_size_sum"] == REQUESTS
    # Each worker's own file holds its share; the scrape is their sum.
    files = sorted(directory.glob("histogram_*.db"))
    assert len(files) == 2
    own = []
    for path in files:
        metrics = {m.name: m for m in MultiProcessCollector.merge([str(path)], accumulate=True)}
        own.append(next(s.value for s in metrics["async_batcher_batch_size"].samples if s.name.endswith("_sum")))
    assert sum(own) == REQUESTS
    assert "async_batcher_batch_queue_wait_seconds" in families
    assert families["async_batcher_queued_items"].type == "gauge"


@pytest.mark.single_loop
def test_a_stop_ends_every_process_and_removes_the_metrics_dir(
    two_workers: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    _, process, directory = two_workers
    assert kill_group(process) == []
    assert process.returncode == 0
    assert not directory.exists()  # main() made it, main() removed it


async def test_ready_is_503_until_the_batcher_runs() -> None:
    server = server_module()
    app = server.create_app(server.ServerSettings())  # its lifespan not run: no model, no batcher
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        response = await client.get("/ready")
    assert (response.status_code, response.json()) == (503, {"ready": False})


@pytest.fixture(scope="module")
def two_workers_sharing(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    roles: set[str] = set()

    def both_healthy(url: str, process: subprocess.Popen[bytes]) -> bool:  # healthy once the owner answers
        with contextlib.suppress(OSError, ValueError):
            status, body = _get(url + "/healthz")
            if status == 200 and json.loads(body)["status"] == "ok":
                roles.add(json.loads(body)["role"])
        return roles == {"owner", "client"}

    with _server(tmp_path_factory.mktemp("shared") / "server.log", "--shared", up=both_healthy) as server:
        yield server


def _tensorflow_loaded(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libtensorflow" in f.read()


@pytest.mark.single_loop
def test_two_workers_sharing_one_batcher_load_one_model_and_scrape_as_one(
    two_workers_sharing: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    from benchmarks.keras import model as example_model

    url, process, directory = two_workers_sharing
    rows = example_model.sample_inputs(REQUESTS, seed=5)
    expected = np.asarray(example_model.load_or_train().predict_on_batch(rows))[:, 0]
    before = _batch_size_sum(url)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda row: _post(url + "/optimized_predict", [float(v) for v in row]), rows))
    np.testing.assert_allclose(answers, expected, rtol=RTOL)
    for _ in range(4):  # either worker answers the scrape: the one batcher, each request once
        assert _batch_size_sum(url) == before + REQUESTS
    # Its histograms are in the owner's file alone: the client worker registered no empty copy.
    assert len(list(directory.glob("histogram_*.db"))) == 1
    # One model: TensorFlow in one worker; not in the other, nor in uvicorn's supervisor.
    workers = [pid for pid in children(process.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(workers) == 2
    assert sorted(_tensorflow_loaded(pid) for pid in [*workers, process.pid]) == [False, False, True]
    # /predict has no model to run outside the owner: refused alike in every worker.
    status, _ = _get_post(url + "/predict")
    assert status == 501


def _batch_size_sum(url: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(_get(url + "/metrics/")[1].decode())}
    family = families.get("async_batcher_batch_size")
    return 0.0 if family is None else next(s.value for s in family.samples if s.name.endswith("_sum"))


def _get_post(url: str) -> tuple[int, bytes]:
    body = json.dumps([0.0] * 10).encode()
    headers = {"Content-Type": "application/json", "Connection": "close"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
