"""A server restarted under the AWS batchers that write or send: killed (SIGKILL) while calls are under way, then
started again on the same port, the batcher still running with its client and its pooled connections.

DynamoDB Local runs on a database file here (``-dbPath``), so what it held before the kill is still there after
the restart, and every caller, before and after, is checked against the table read back: a caller told "applied"
has its write there, one told "not applied" (the connection was refused, or its call never left) has not.

moto's server keeps its data in memory: a restart loses it, so the callers cut off by the kill cannot be checked
against it. The test checks that each of them got an outcome promptly, none told "not applied" by an error that
does not say so, and that the batchers, on the restarted server (queue, topic and stream made again under the
same names), send what comes next and tell each caller what the data bears out.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from async_batcher import OutcomeUnknownError
from async_batcher.aws.base import AwsBatcher, never_sent
from async_batcher.aws.errors import RetriesExhaustedError
from async_batcher.aws.retry import RetryPolicy
from tests.aws.services import Service, check_outcomes
from tools.aws import DynamoDBLocal, MotoServer

pytestmark = pytest.mark.single_loop

# One attempt per call, short timeouts: a dead server is noticed at once.
ONE_ATTEMPT = AioConfig(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=20)
RETRY = RetryPolicy(max_attempts=3, base_delay=0.001, max_delay=0.004)


class PersistentDynamoDBLocal(DynamoDBLocal):
    """DynamoDB Local on a database file in ``db_dir``, which outlives the process."""

    def __init__(self, db_dir: Path) -> None:
        super().__init__()
        self.db_dir = db_dir

    def command(self, port: int) -> list[str]:
        command = super().command(port)
        at = command.index("-inMemory")
        command[at : at + 1] = ["-dbPath", str(self.db_dir)]
        return command


async def kill_under_load(
    server: Any, batchers: list[AwsBatcher[Any, Any]], items: list[list[Any]]
) -> list[list[object]]:
    """Submit each batcher's items at once, kill ``server`` once any caller has its outcome, and return every
    caller's outcome. Bounded: a caller still waiting 60 s later fails the test."""
    first_done = asyncio.Event()

    async def submit(batcher: AwsBatcher[Any, Any], item: Any) -> object:
        try:
            return await batcher.process(item)
        except Exception as error:
            return error
        finally:
            first_done.set()

    tasks = [[asyncio.ensure_future(submit(b, item)) for item in its] for b, its in zip(batchers, items, strict=True)]
    await asyncio.wait_for(first_done.wait(), 60)
    server.kill()
    return [list(await asyncio.wait_for(asyncio.gather(*group), 60)) for group in tasks]


def kinds_of(outcomes: list[object]) -> set[str]:
    return {
        "applied" if not isinstance(o, BaseException) else "unknown" if isinstance(o, OutcomeUnknownError) else "not"
        for o in outcomes
    }


@pytest.mark.usefixtures("dynamodb_local_jar")
async def test_dynamodb_local_restarted_mid_run(tmp_path: Path) -> None:
    server = PersistentDynamoDBLocal(tmp_path)
    with server:
        port = server.port
        service_ = Service("dynamodb", server.endpoint_url)
        async with asyncio.timeout(120), service_.opened() as service:
            before = service.items(300, prefix="a")
            after = service.items(30, prefix="b")
            batcher = service.batcher(
                server.endpoint_url, config=ONE_ATTEMPT, retry=RETRY, max_batch_size=25, concurrency=4,
                max_queue_time=0.001,
            )  # fmt: skip
            async with batcher:
                (cut,) = await kill_under_load(server, [batcher], [before])
                await asyncio.to_thread(server.start, port)
                later = await asyncio.gather(*(batcher.process(item) for item in after), return_exceptions=True)
            stored = await service.stored()
    check_outcomes(service, before + after, cut + list(later), stored)
    assert "applied" in kinds_of(cut), "the kill came before any write"
    assert len(kinds_of(cut)) > 1, "the kill came after every write: nothing was cut"
    assert "applied" in kinds_of(list(later)), later[:3]


async def test_moto_restarted_mid_run() -> None:
    # Batches of 10 (SQS, SNS: one call each; Kinesis the same, for a kill to find several under way), and
    # botocore's retries as the batchers set them (standard mode, 2 attempts): a call whose first attempt is cut
    # by the kill and whose second finds the port closed is "unknown", not "not applied".
    settings: dict[str, Any] = {"retry": RETRY, "max_queue_time": 0.001, "max_batch_size": 10}
    settings["config"] = AioConfig(connect_timeout=2, read_timeout=20)
    server = MotoServer()
    with server:
        port = server.port
        async with asyncio.timeout(120), contextlib.AsyncExitStack() as stack:
            services = [Service(kind, server.endpoint_url) for kind in ("sqs", "sns", "kinesis")]
            for service in services:
                await stack.enter_async_context(service.opened())
            batchers = [service.batcher(server.endpoint_url, **settings) for service in services]
            async with contextlib.AsyncExitStack() as running:
                for batcher in batchers:
                    await running.enter_async_context(batcher)
                cut = await kill_under_load(server, batchers, [service.items(150, prefix="a") for service in services])
                await asyncio.to_thread(server.start, port)
                for service in services:
                    await service.create_again()
                after = [service.items(20, prefix="b") for service in services]
                later = [
                    list(await asyncio.gather(*(b.process(item) for item in its), return_exceptions=True))
                    for b, its in zip(batchers, after, strict=True)
                ]
            stored = [await service.stored() for service in services]
    for service, outcomes, items, held, answers in zip(services, cut, after, stored, later, strict=True):
        assert len(kinds_of(outcomes)) > 1, f"{service.kind}: the kill came after every item: nothing was cut"
        for outcome in outcomes:
            # Each batch here is one call: a plain transport error, which says "not applied", may only be one for
            # a connection that never opened.
            if isinstance(outcome, Exception) and not isinstance(outcome, OutcomeUnknownError):
                assert never_sent(outcome) or isinstance(outcome, ClientError | RetriesExhaustedError), repr(outcome)
        check_outcomes(service, items, answers, held)
        assert "applied" in kinds_of(answers), f"{service.kind}: nothing went through after the restart"
