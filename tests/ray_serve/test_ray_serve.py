"""The Ray Serve example for real: a local Ray, two replicas each with this package's batcher, HTTP on 127.0.0.1.

One Ray for the module (it takes half a minute to start on two cores): ``python -m examples.ray_serve`` as a
subprocess, stopped by SIGTERM at the end, after which no process it started may be left. Every process it
starts inherits a marker in its environment, which is how the test finds them all, whatever process group or
parent Ray gave them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from examples.ray_serve.local import replica_stats
from tests.processes import alive, descendants, with_environment
from tests.requires import require
from tests.servers import ROOT, free_port

require("ray.serve", "make test-all installs it (the test-all group includes the ray group)")

MARKER = "ASYNC_BATCHER_RAY_TEST"
STARTUP_TIMEOUT = 300.0  # Ray, then two replicas that import TensorFlow, on two cores
RTOL = 1e-5  # float32 sums in another order (batches of other sizes): see tests/keras/test_example_server.py
ROWS = 96


@dataclass
class RayExample:
    process: subprocess.Popen[bytes]
    url: str
    marker: str
    log: Path

    def ray_processes(self) -> set[int]:
        return {p for p in descendants(self.process.pid) | with_environment(MARKER, self.marker) if alive(p)}


def _post(url: str, body: Any) -> tuple[int, Any, str | None]:
    request = urllib.request.Request(url + "/", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response), response.headers["x-replica"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc), exc.headers.get("x-replica")


@pytest.fixture(scope="module")
def ray_example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayExample]:
    home_ray = Path.home() / ".ray"
    home_ray_before = home_ray.exists()
    log = tmp_path_factory.mktemp("ray") / "ray_example.log"
    port = free_port()
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER: marker}
    command = [sys.executable, "-m", "examples.ray_serve", "--port", str(port), "--replicas", "2"]
    command += ["--max-batch-size", "16", "--max-queue-time", "0.02"]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    example = RayExample(process, f"http://127.0.0.1:{port}", marker, log)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while b"ready http" not in log.read_bytes():  # bounded: the example prints it once a replica answers
            assert process.poll() is None, f"the example exited with {process.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"not ready in {STARTUP_TIMEOUT} s:\n{log.read_text()}"
            time.sleep(0.5)
        yield example
    finally:
        # Whatever the tests did, nothing of this Ray outlives the module: SIGKILL what a stop left behind.
        left = example.ray_processes()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(90)
            except subprocess.TimeoutExpired:
                left |= {process.pid}
        for pid in left | example.ray_processes():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait(30)
        if not home_ray_before:
            assert not home_ray.exists(), "Ray wrote into the home folder"


@pytest.mark.single_loop
def test_every_answer_is_the_models_and_both_replicas_batch(ray_example: RayExample) -> None:
    from benchmarks.keras import model as example_model

    rows = example_model.sample_inputs(ROWS, seed=5)
    expected = np.asarray(example_model.load_or_train().predict_on_batch(rows))[:, 0]
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda row: _post(ray_example.url, [float(v) for v in row]), rows))
    assert [status for status, _, _ in answers] == [200] * ROWS
    np.testing.assert_allclose([value for _, value, _ in answers], expected, rtol=RTOL)
    replicas = {replica for _, _, replica in answers if replica}
    assert len(replicas) == 2, f"one replica served everything: {replicas}"

    stats = replica_stats(ray_example.url, replicas)
    assert sum(s["processed"] for s in stats.values()) == ROWS
    for replica, s in stats.items():
        assert s["processed"] > 0, replica
        assert s["model_rows"] == s["processed"]  # each item reached the model once
        assert s["model_calls"] == s["batches"]
    # Concurrent requests shared model calls: batches formed inside the replicas.
    assert sum(s["batches"] for s in stats.values()) < ROWS


@pytest.mark.single_loop
def test_a_bad_item_fails_its_own_caller_only(ray_example: RayExample) -> None:
    good = [[0.01 * i] * 10 for i in range(15)]
    bodies: list[Any] = [*good[:7], [1.0, 2.0], *good[7:]]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda body: _post(ray_example.url, body), bodies))
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * 7 + [422] + [200] * 8
    assert answers[7][1] == {"detail": "an item must be a list of 10 finite numbers, got a list of 2"}
    # The bad item's replica counted one failed item, the only one this module's tests send.
    bad_replica = answers[7][2]
    assert bad_replica is not None
    stats = replica_stats(ray_example.url, {replica for _, _, replica in answers if replica})
    assert {replica: s["failed"] for replica, s in stats.items() if s["failed"]} == {bad_replica: 1}


@pytest.mark.single_loop
def test_sigterm_stops_ray_and_leaves_no_process(ray_example: RayExample) -> None:
    started = ray_example.ray_processes()
    assert len(started) > 5, started  # Ray's daemons, the controller, the proxy and the two replicas at least
    ray_example.process.send_signal(signal.SIGTERM)
    assert ray_example.process.wait(90) == 0, ray_example.log.read_text()
    deadline = time.monotonic() + 30
    while (
        left := {pid for pid in started if alive(pid)} | ray_example.ray_processes()
    ) and time.monotonic() < deadline:
        time.sleep(0.2)  # bounded: Ray's daemons end as their parent does, a moment later
    assert not left, f"left running after the stop: {left}"
    assert b"stopped" in ray_example.log.read_bytes()
