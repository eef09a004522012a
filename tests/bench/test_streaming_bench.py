"""The streaming benchmark: its three servers stream the model's own tokens, and ``--quick`` runs end to end.

The servers run under a real uvicorn on 127.0.0.1; the smoke run starts them as ``make bench-streaming`` does
(subprocesses, the load from a process of its own) on 1 and 8 streams, and builds its report from what came
back. No assertion on speed: only that every row was measured, without errors, and batched where it should be.
"""

from __future__ import annotations

import asyncio
import csv
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.streaming.client import MAX_TOKENS, MIN_TOKENS, PROMPT_BYTES, request_body
from benchmarks.streaming.server import MODES, create_app
from examples.streaming.model import CharModel
from tests.servers import ROOT, ThreadServer
from tests.streaming.sse import read_stream

pytestmark = pytest.mark.single_loop


@pytest.fixture(params=MODES)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, ThreadServer]]:
    server = ThreadServer(create_app(request.param))
    server.start()
    try:
        yield request.param, server
    finally:
        server.begin_shutdown()
        server.join()


async def test_every_mode_streams_the_tokens_of_each_prompt_alone(served: tuple[str, ThreadServer]) -> None:
    mode, server = served
    rng = random.Random(1)
    bodies = [request_body(rng) for _ in range(5)]
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        streams = await asyncio.gather(*(read_stream(client, b["prompt"], b["max_tokens"]) for b in bodies))
        stats = (await client.get("/stats")).json()
    model = CharModel()
    for body, stream in zip(bodies, streams, strict=True):
        assert stream.ended == "end" and stream.tokens == model.generate(body["prompt"].encode(), body["max_tokens"])
    assert stats["prefilled"] == len(bodies) and stats["rows"] == sum(b["max_tokens"] - 1 for b in bodies)
    if mode == "single":
        assert stats["steps"] == stats["rows"]  # a row per step: no batching
    else:
        assert stats["steps"] < stats["rows"]


@pytest.mark.parametrize("mode", ["continuous", "static"])
async def test_a_request_that_arrives_mid_batch_joins_it_only_with_continuous_batching(mode: str) -> None:
    server = ThreadServer(create_app(mode))
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            async with client.stream("POST", "/generate", json={"prompt": "first", "max_tokens": 200}) as first:
                lines = first.aiter_lines()
                assert (await anext(lines)).startswith("data: ")  # its batch is running
                second = await read_stream(client, "second", 5)  # arrives while the first one streams
                rest = [line async for line in lines]
            stats = (await client.get("/stats")).json()
    finally:
        server.begin_shutdown()
        server.join()
    assert second.ended == "end" and "event: end" in rest
    # Continuously batched, the second joined the first one's batch; in static batches it waited for the next.
    assert stats["batches"] == (1 if mode == "continuous" else 2)


def test_the_client_draws_prompts_and_lengths_in_its_bounds() -> None:
    rng = random.Random(0)
    bodies = [request_body(rng) for _ in range(1000)]
    assert all(PROMPT_BYTES[0] <= len(b["prompt"].encode()) <= PROMPT_BYTES[1] for b in bodies)
    assert {b["max_tokens"] for b in bodies} == set(range(MIN_TOKENS, MAX_TOKENS + 1))
    assert request_body(random.Random(3)) == request_body(random.Random(3))


def test_quick_run_measures_every_mode_and_writes_the_report(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.streaming", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "streaming.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["mode"], int(r["streams"])) for r in rows) == sorted((m, n) for m in MODES for n in (1, 8))
    for r in rows:
        assert r["errors"] == "0" and float(r["tokens_per_s"]) > 0 and int(r["ttft_count"]) > 0, r
        assert float(r["ttft_p50_ms"]) <= float(r["ttft_p95_ms"]), r
    by = {(r["mode"], int(r["streams"])): r for r in rows}
    assert float(by["single", 8]["rows_per_step"]) == 1.0
    assert float(by["continuous", 8]["rows_per_step"]) > 1.0  # eight streams, stepped together
    text = (tmp_path / "streaming.md").read_text()
    assert "| 8 | batched, continuous batching |" in text and "python -m benchmarks.streaming --quick" in text
    assert (tmp_path / "streaming.png").read_bytes().startswith(b"\x89PNG")
