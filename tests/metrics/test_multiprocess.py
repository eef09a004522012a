"""Multiprocess metrics for real: uvicorn with two workers, one PROMETHEUS_MULTIPROC_DIR, one /metrics for both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import alive, children, kill_group
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 400
STARTUP_TIMEOUT = 60.0
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(url: str) -> bytes:
    # A fresh connection each time (no keep-alive): the kernel hands each to either worker.
    request = urllib.request.Request(url, headers={"Connection": "close"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
        return body


def scrape(url: str) -> Samples:
    families = text_string_to_metric_families(get(url + "/metrics").decode())
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset({"batcher": "doubler", **labels}.items())), 0.0)


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` (bounded): the counters are copied to the files every second, not at each batch."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def live_gauge_pids(directory: Path) -> set[int]:
    return {int(f.stem.rsplit("_", 1)[1]) for f in directory.glob("gauge_livesum_*.db")}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    # The documentation's snippet (docs/guides/metrics.md) is the app.
    snippet = ROOT / "docs/snippets/metrics_multiprocess.py"
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(snippet.parent)]
    command += [f"{snippet.stem}:app", "--workers", "2"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # Each worker writes its live gauges as its lifespan starts: two files, two workers up.
        until(lambda: len(live_gauge_pids(directory)) == 2 or process.poll() is not None, "two workers")
        assert process.poll() is None, log.read_text()
        yield process, f"http://127.0.0.1:{port}", directory
    finally:
        left = kill_group(process)
        text = log.read_text()
        assert not left, f"processes left after a graceful stop: {left}\n{text}"
        assert "Traceback" not in text and "Warning" not in text, text


def per_worker_batches(directory: Path) -> dict[int, float]:
    """Each worker's own count of batches, read from its histogram file alone."""
    counts = {}
    for path in directory.glob("histogram_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        metrics = {m.name: m for m in MultiProcessCollector.merge([str(path)], accumulate=True)}
        samples = metrics["async_batcher_batch_size"].samples
        counts[pid] = next(s.value for s in samples if s.name.endswith("_count") and s.labels["batcher"] == "doubler")
    return counts


def test_two_workers_histograms_add_up_in_one_scrape(server: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    _, url, directory = server
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda x: json.loads(get(f"{url}/double/{x}")), range(REQUESTS)))
    assert [a["result"] for a in answers] == [2 * x for x in range(REQUESTS)]
    pids = {a["pid"] for a in answers}
    assert len(pids) == 2, f"every request went to one worker: {pids}"

    samples = scrape(url)
    batches = value(samples, "async_batcher_batch_size_count")
    # The histograms are written as each batch ends, before its callers are answered: exact at once.
    assert value(samples, "async_batcher_batch_size_sum") == REQUESTS
    assert value(samples, "async_batcher_batch_queue_wait_seconds_count") == batches
    assert value(samples, "async_batcher_batch_process_seconds_count") == batches
    assert value(samples, "async_batcher_batch_size_bucket", le="+Inf") == batches
    assert 0 < batches <= REQUESTS
    # The scrape added up two workers' files, each with its own share.
    own = per_worker_batches(directory)
    assert set(own) == pids
    assert all(count > 0 for count in own.values())
    assert sum(own.values()) == batches
    # The counters follow within a copy interval; the gauges are the sum over the live workers.
    until(
        lambda: sum(v for (n, _), v in scrape(url).items() if n == "async_batcher_batches_total") == batches,
        "the batch counter (over its reasons)",
    )
    samples = scrape(url)
    assert value(samples, "async_batcher_items_total", outcome="processed") == REQUESTS
    assert value(samples, "async_batcher_items_total", outcome="submitted") == REQUESTS
    assert value(samples, "async_batcher_items_total", outcome="failed") == 0
    for counter in ("async_batcher_held_batches_total", "async_batcher_hold_probes_total"):  # (no hold set)
        assert ((counter, frozenset({("batcher", "doubler")}))) in samples and value(samples, counter) == 0
    assert (("async_batcher_queued_items", frozenset({("batcher", "doubler")}))) in samples
    assert value(samples, "async_batcher_queued_items") == 0
    assert value(samples, "async_batcher_in_flight_batches") == 0


def test_a_killed_worker_keeps_its_counts_and_loses_its_live_gauges(
    server: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    process, url, directory = server
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda x: get(f"{url}/double/{x}"), range(100)))
    before = value(scrape(url), "async_batcher_batch_size_sum")
    assert before == 100
    workers = live_gauge_pids(directory) & set(children(process.pid))  # (one more child: multiprocessing's)
    assert len(workers) == 2
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)  # no lifespan shutdown: it cannot remove its own gauges
    until(lambda: not alive(victim), "the worker's death")
    samples = scrape(url)  # the scrape drops the dead worker's live gauges first
    assert victim not in live_gauge_pids(directory)
    assert value(samples, "async_batcher_batch_size_sum") == before  # its batches happened: they still count
    # uvicorn starts a worker in its place: let it come up, so that the stop does not interrupt it mid-import (a
    # KeyboardInterrupt traceback in the server's log).
    until(lambda: len(live_gauge_pids(directory) - {victim}) == 2, "the replacement worker")


def test_a_graceful_stop_removes_every_live_gauge(server: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    process, url, directory = server
    assert json.loads(get(f"{url}/double/21"))["result"] == 42
    assert kill_group(process) == []
    assert process.returncode == 0
    assert live_gauge_pids(directory) == set()  # each worker marked itself dead on its way out
    assert list(directory.glob("histogram_*.db"))  # the counts stay for the next scrape's aggregation
