"""The streaming benchmark's load: ``streams`` closed-loop clients, each posting /generate and reading its events.

``python -m benchmarks.streaming.client --url http://127.0.0.1:8000 --streams 32 --seconds 8`` prints one JSON
object: tokens/s over the measured window, time-to-first-token percentiles, streams completed. Each client sends
a request (a prompt of 8 to 32 bytes, ``max_tokens`` drawn from 16 to 64, seeded), reads its server-sent events to
the end, then sends the next: ``streams`` streams are open at every moment. The first ``--warmup`` seconds are
not counted: tokens count when they arrive inside the window, a first token when its request was sent inside
it. At the end of the window the clients leave mid-stream (the server drops them from its batch). Traffic goes
to 127.0.0.1 only (``--url``), for a bounded time. A separate process from the server: it takes its own core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

__all__ = ["main", "request_body"]

MIN_TOKENS, MAX_TOKENS = 16, 64
PROMPT_BYTES = (8, 32)
WORDS = "the a stream of tokens one at a time batched together while others join leave and wait".split()


def request_body(rng: random.Random) -> dict[str, Any]:
    """A request as the benchmark sends it: an ASCII prompt of 8 to 32 bytes and a max_tokens of 16 to 64."""
    length = rng.randint(*PROMPT_BYTES)
    prompt = ""
    while len(prompt) < length:
        prompt += rng.choice(WORDS) + " "
    return {"prompt": prompt[:length], "max_tokens": rng.randint(MIN_TOKENS, MAX_TOKENS)}


@dataclass
class Tally:
    start: float
    end: float
    tokens: int = 0
    completed: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)

    def counts(self, t: float) -> bool:
        return self.start <= t < self.end


async def _client(session: aiohttp.ClientSession, url: str, seed: int, tally: Tally) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < tally.end:
        body = request_body(rng)
        sent = time.perf_counter()
        first = True
        try:
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    tally.errors += 1
                    await response.read()
                    continue
                async for line in response.content:
                    if line.startswith(b'data: {"token"'):
                        now = time.perf_counter()
                        if first and tally.counts(sent):
                            tally.ttft.append(now - sent)
                        first = False
                        tally.tokens += tally.counts(now)
                    elif line.startswith(b"event: end"):
                        tally.completed += 1
                    elif line.startswith(b"event: error"):
                        tally.errors += 1
        except aiohttp.ClientError:
            tally.errors += 1


def _rank(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(url: str, streams: int, seconds: float, warmup: float, seed: int) -> dict[str, Any]:
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the benchmark sends load to this machine only, not {url!r}")
    now = time.perf_counter()
    tally = Tally(start=now + warmup, end=now + warmup + seconds)
    connector = aiohttp.TCPConnector(limit=streams)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        clients = [asyncio.ensure_future(_client(session, url + "/generate", seed + i, tally)) for i in range(streams)]
        await asyncio.sleep(max(0.0, tally.end - time.perf_counter()))
        for client in clients:
            client.cancel()  # leave mid-stream: the measurement is over
        await asyncio.gather(*clients, return_exceptions=True)
    return {
        "streams": streams,
        "seconds": seconds,
        "tokens": tally.tokens,
        "tokens_per_s": tally.tokens / seconds,
        "completed": tally.completed,
        "errors": tally.errors,
        "ttft_count": len(tally.ttft),
        "ttft_p50_ms": None if (p := _rank(tally.ttft, 0.50)) is None else 1000 * p,
        "ttft_p95_ms": None if (p := _rank(tally.ttft, 0.95)) is None else 1000 * p,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streaming.client", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the server, on 127.0.0.1")
    parser.add_argument("--streams", type=int, required=True, help="concurrent streams (closed-loop clients)")
    parser.add_argument("--seconds", type=float, default=8.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before the window")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.streams < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--streams must be >= 1, --seconds > 0 and --warmup >= 0")
    result = asyncio.run(run(args.url.rstrip("/"), args.streams, args.seconds, args.warmup, args.seed))
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
