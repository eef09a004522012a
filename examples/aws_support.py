"""What the AWS examples (and benchmarks/aws) share: where to send requests, how to drive N items, how to report.

Where: ``--endpoint-url`` if given; else real AWS if credentials are configured (environment or ~/.aws);
else a local server started here (DynamoDB Local or moto's server) and stopped at the end, with dummy
credentials. The credential check reads only the environment and files: it never asks the EC2 metadata
service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tools.aws import dummy_credentials
from tools.servers import LocalServer

__all__ = [
    "MODES",
    "NO_WAIT",
    "ONE_CALL_PER_ITEM",
    "Measure",
    "Measurement",
    "drive",
    "has_aws_credentials",
    "markdown_table",
    "mode_wait",
    "run_example",
    "target_endpoint",
]


def has_aws_credentials() -> bool:
    """Whether credentials are configured in the environment or in ~/.aws (no network lookups)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE"):
        return True
    home = Path.home() / ".aws"
    return (home / "credentials").is_file() or (home / "config").is_file()


@contextlib.contextmanager
def target_endpoint(
    endpoint_url: str | None, server: Callable[[], LocalServer], *, local: bool = False
) -> Iterator[str | None]:
    """The endpoint to use (None: real AWS), starting and stopping a local server when there is no other."""
    if endpoint_url:
        print(f"target: {endpoint_url}")
        yield endpoint_url
        return
    if has_aws_credentials() and not local:
        print("target: AWS (configured credentials); a temporary table/queue is created and deleted")
        yield None
        return
    os.environ.update({**dummy_credentials(), "AWS_EC2_METADATA_DISABLED": "true"})
    with server() as running:
        print(f"target: {running.name} started here at {running.endpoint_url}")
        yield running.endpoint_url


async def drive(n: int, callers: int, submit: Callable[[int], Awaitable[object]]) -> float:
    """``callers`` concurrent tasks submit items 0..n-1 (each waits for its result before taking the next);
    returns the seconds it took. Any failure propagates: the examples count nothing that did not succeed."""
    if n < 1 or callers < 1:
        raise ValueError(f"n and callers must be >= 1, got {n} and {callers}")
    next_item = iter(range(n))

    async def caller() -> None:
        for index in next_item:
            await submit(index)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(min(callers, n)):
            group.create_task(caller())
    return time.perf_counter() - start


@dataclass(frozen=True)
class Measurement:
    """One run: ``items`` items through ``mode`` ("batched" or "one call per item") with ``callers`` callers."""

    service: str
    mode: str
    items: int
    callers: int
    seconds: float
    api_calls: int

    @property
    def items_per_second(self) -> float:
        return self.items / self.seconds

    @property
    def calls_per_item(self) -> float:
        return self.api_calls / self.items


def markdown_table(measurements: list[Measurement]) -> str:
    lines = [
        "| service | mode | callers | items | seconds | items/s | API calls | calls/item |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in measurements:
        lines.append(
            f"| {m.service} | {m.mode} | {m.callers} | {m.items} | {m.seconds:.2f} | {m.items_per_second:,.0f} "
            f"| {m.api_calls} | {m.calls_per_item:.3f} |"
        )
    return "\n".join(lines)


ONE_CALL_PER_ITEM = "one call per item"
NO_WAIT = "batched, max_queue_time=0"
MODES = ("batched", ONE_CALL_PER_ITEM)
"""What the examples compare; the benchmark adds NO_WAIT (batches leave as soon as a slot is free)."""


def mode_wait(mode: str) -> float:
    """The batcher's ``max_queue_time`` in a batched mode: the default 10 ms, or 0 for NO_WAIT."""
    return 0.0 if mode == NO_WAIT else 0.01


Measure = Callable[[str | None, str, int, int, int], Awaitable[Measurement]]
"""(endpoint, mode, n, callers, concurrency) -> the measurement of one run, checked against a read-back."""


def run_example(doc: str, server: Callable[[], LocalServer], measure: Measure, *, default_n: int, what: str) -> None:
    """The command line of an example: parse the arguments, run both modes, print the table."""
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=default_n, help=f"{what} in each mode")
    parser.add_argument("--callers", type=int, default=0, help="concurrent callers (default: n, all at once)")
    parser.add_argument("--concurrency", type=int, default=4, help="batches in flight")
    parser.add_argument("--endpoint-url", default=None, help="the service's endpoint (default: local server or AWS)")
    parser.add_argument("--local", action="store_true", help="use the local server even with AWS credentials")
    args = parser.parse_args()

    async def main() -> list[Measurement]:
        with target_endpoint(args.endpoint_url, server, local=args.local) as endpoint:
            return [await measure(endpoint, mode, args.n, args.callers or args.n, args.concurrency) for mode in MODES]

    print(markdown_table(asyncio.run(main())))
    print(f"the service holds all the {what} (counted back after each run)")
