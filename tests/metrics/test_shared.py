"""A shared batcher under prometheus_client's multiprocess mode: one batcher in the scrape, whichever worker answers
it, written by the worker that owns it alone, and its counts going on across a hand-over."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.multiprocess import MultiProcessCollector

from tests.metrics.test_multiprocess import get, scrape, until, value
from tests.processes import kill_group
from tests.servers import free_port
from tests.shared.conftest import address as address  # (the fixture: a socket's path in a private folder)

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 200


def pids_writing(directory: Path, batcher: str = "doubler") -> set[int]:
    """The processes whose files hold a series of ``batcher``."""
    pids = set()
    for path in directory.glob("*.db"):
        for metric in MultiProcessCollector.merge([str(path)], accumulate=True):
            if any(s.labels.get("batcher") == batcher for s in metric.samples):
                pids.add(int(path.stem.rsplit("_", 1)[1]))
    return pids


def test_two_workers_sharing_one_batcher_scrape_as_one(address: str, tmp_path: Path) -> None:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "SHARED_TEST_ADDRESS": address}
    command = [sys.executable, "-m", "uvicorn", "tests.metrics.shared_app:app", "--workers", "2"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def both_up() -> bool:
            roles = set()
            for _ in range(8):
                try:
                    roles.add(json.loads(get(f"{url}/double/0"))["role"])
                except OSError:
                    return False
            return roles == {"owner", "client"}

        until(lambda: server.poll() is not None or both_up(), "an owner and a client answering", timeout=60)
        assert server.poll() is None, log.read_text()
        warm_up = value(scrape(url), "async_batcher_batch_size_sum")  # the requests of both_up()
        with ThreadPoolExecutor(16) as pool:  # (a connection each: both workers answer)
            answers = list(pool.map(lambda x: json.loads(get(f"{url}/double/{x}")), range(1, REQUESTS + 1)))
        assert [a["result"] for a in answers] == [2 * x for x in range(1, REQUESTS + 1)]
        roles = {a["pid"]: a["role"] for a in answers}
        assert sorted(roles.values()) == ["client", "owner"]
        (owner,) = [pid for pid, role in roles.items() if role == "owner"]

        until(lambda: value(scrape(url), "async_batcher_items_total", outcome="processed") == REQUESTS + warm_up,
              "the counters copied")  # fmt: skip
        for _ in range(6):  # scraped from either worker: the same one batcher, each item once
            samples = scrape(url)
            assert value(samples, "async_batcher_items_total", outcome="processed") == REQUESTS + warm_up
            assert value(samples, "async_batcher_items_total", outcome="submitted") == REQUESTS + warm_up
            assert value(samples, "async_batcher_batch_size_sum") == REQUESTS + warm_up
            assert value(samples, "async_batcher_queued_items") == 0
        assert pids_writing(directory) == {owner}  # the client registered nothing: no empty copy beside it

        # kill -9 of the owner: the client takes over (uvicorn starts a worker in the dead one's place, a client).
        before = value(scrape(url), "async_batcher_batch_size_sum")
        os.kill(owner, signal.SIGKILL)

        def taken_over() -> bool:
            with contextlib.suppress(OSError):
                answer = json.loads(get(f"{url}/double/0"))
                return bool(answer["role"] == "owner" and answer["pid"] != owner)
            return False

        until(taken_over, "the next owner", timeout=60)
        after = value(scrape(url), "async_batcher_batch_size_sum")
        assert after >= before  # the dead owner's batches still count
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda x: get(f"{url}/double/{x}"), range(REQUESTS)))
        samples = scrape(url)
        assert value(samples, "async_batcher_batch_size_sum") == after + REQUESTS  # the next owner's add on
        # The dead owner's live gauges are gone; the next owner's are copied within a second.
        until(lambda: value(scrape(url), "async_batcher_queued_items") == 0, "the queue's gauge at zero")
        (next_owner,) = pids_writing(directory) - {owner}
        assert next_owner in roles  # the worker that was the client
        # The worker uvicorn started in the dead one's place answers before the server stops (stopped while it
        # still imports, it prints a KeyboardInterrupt's traceback).
        until(both_up, "the new worker, a client, answering", timeout=60)
    finally:
        left = kill_group(server)
    text = log.read_text()
    assert not left and server.returncode == 0, text
    assert "Traceback" not in text, text


HANDOVER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    from async_batcher.metrics_multiprocess import MultiprocessExporter
    from async_batcher.shared import SharedBatcher
    from tests.shared.models import Model

    def make():
        return Model(name="doubler", max_batch_size=8, max_queue_time=0.005)

    def scrape():
        registry = CollectorRegistry()
        MultiProcessCollector(registry, os.environ["PROMETHEUS_MULTIPROC_DIR"])
        return {f"{s.name}{sorted(s.labels.items())}": s.value for f in registry.collect() for s in f.samples
                if s.labels.get("batcher") == "doubler" and ("outcome" in s.labels or s.name.endswith("_sum")
                or s.name == "async_batcher_queued_items")}

    async def main():
        address = sys.argv[1]
        first, second = SharedBatcher(make, address=address), SharedBatcher(make, address=address)
        # A copy interval longer than the test: what is written is what adopting, leaving and stopping write.
        one, two = MultiprocessExporter(first, interval=3600), MultiprocessExporter(second, interval=3600)
        async with one, two:
            async with first:
                async with second:
                    roles = [first.role, second.role]
                    await asyncio.gather(*(b.process(x) for x in range(5) for b in (first, second)))
                    await first.stop()  # hands over to the second
                    while second.role != "owner":
                        await asyncio.sleep(0.01)
                    roles.append(second.role)
                    await asyncio.gather(*(second.process(x) for x in range(7)))
                    await second.stop()
            after_stops = scrape()
        print(json.dumps({"roles": roles, "after_stops": after_stops, "at_exit": scrape()}))

    asyncio.run(main())
    """
)


def test_a_hand_over_writes_the_last_owners_final_counts_and_the_next_ones(address: str, tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", HANDOVER, address], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["roles"] == ["owner", "client", "owner"]
    for scraped in (seen["after_stops"], seen["at_exit"]):
        assert scraped["async_batcher_items_total[('batcher', 'doubler'), ('outcome', 'processed')]"] == 17
        assert scraped["async_batcher_items_total[('batcher', 'doubler'), ('outcome', 'submitted')]"] == 17
        assert scraped["async_batcher_batch_size_sum[('batcher', 'doubler')]"] == 17
    assert seen["after_stops"]["async_batcher_queued_items[('batcher', 'doubler')]"] == 0
