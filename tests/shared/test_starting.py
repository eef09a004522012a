"""The owner's start, while its factory loads: a factory that hangs (its callers' timeouts still hold, stop() ends
the start), raises, or returns something that is not a batcher; ``python -m async_batcher.serve`` stopped while its
factory loads."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from async_batcher import BatcherStoppedError
from async_batcher.shared import SharedBatcher
from tests.loops import until
from tests.shared.models import Model
from tests.shared.procs import ROOT, wait_for


async def test_a_callers_timeout_holds_while_the_owners_factory_loads(address: str) -> None:
    gate = asyncio.Event()

    async def make() -> Model:
        await gate.wait()
        return Model(max_queue_time=0)

    shared = SharedBatcher(make, address=address, name="m")
    try:
        async with asyncio.timeout(5):
            with pytest.raises(TimeoutError, match="still starting"):
                await shared.process(1, timeout=0.1)  # (it starts the shared batcher, this process the owner)
            with pytest.raises(TimeoutError, match="still starting"):
                await shared.process_many([1, 2], timeout=0.1)
            with pytest.raises(TimeoutError, match="still starting"):
                [part async for part in shared.stream(1, timeout=0.1)]
        gate.set()
        assert await shared.process(2, timeout=5) == 4
    finally:
        gate.set()
        await shared.stop()


@pytest.mark.parametrize("kind", ["async", "thread"])
async def test_stop_ends_a_start_whose_factory_hangs(address: str, kind: str) -> None:
    release = threading.Event()

    async def hangs() -> Model:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def hangs_in_its_thread() -> Model:
        release.wait(30)
        return Model()

    shared = SharedBatcher(hangs if kind == "async" else hangs_in_its_thread, address=address, name="m")
    try:
        shared.start()
        waiting = asyncio.ensure_future(shared.process(1))
        await until(lambda: shared._seat is not None and shared._seat.election.held)
        async with asyncio.timeout(5):
            await shared.stop(timeout=1)
            with pytest.raises(BatcherStoppedError):
                await waiting
        assert not await shared.is_running()
        async with SharedBatcher(Model, address=address, name="m", role="owner") as other:  # the lock is free
            assert await other.process(1) == 2
    finally:
        release.set()  # (the thread's factory returns; what it made is dropped)
        await shared.stop()


async def test_a_factory_that_raises_or_makes_no_batcher_fails_the_start_and_frees_the_lock(address: str) -> None:
    def broken() -> Model:
        raise OSError("no model at /models/m.keras")

    def not_a_batcher() -> object:
        return {"model": "m"}

    with pytest.raises(OSError, match="no model at"):
        async with SharedBatcher(broken, address=address, name="m"):
            pass
    with pytest.raises(TypeError, match="not an AsyncBatcher") as raised:
        async with SharedBatcher(not_a_batcher, address=address, name="m"):  # type: ignore[arg-type]
            pass
    assert "not_a_batcher" in str(raised.value)  # (names the user's factory)
    async with SharedBatcher(Model, address=address, name="m", role="owner") as shared:
        assert await shared.process(1) == 2


def test_serve_stopped_while_its_factory_loads_exits(address: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "async_batcher.serve", "tests.shared.models:never", "--address", address]
    server = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: _locked_by(address, server.pid) or server.poll() is not None, 30, "serve to take the lock")
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=10)
        assert server.returncode == 0, err.decode()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


def _locked_by(address: str, pid: int) -> bool:
    path = Path(address + ".lock")
    return path.exists() and path.read_text() == str(pid)


async def test_a_start_that_failed_unawaited_is_not_reported_as_a_lost_error(
    address: str, loop_errors: list[dict[str, Any]]
) -> None:
    def broken() -> Model:
        raise OSError("no model")

    async def start_and_stop() -> None:
        shared = SharedBatcher(broken, address=address, name="m")
        shared.start()  # (nobody awaits the start: the error is the next caller's, or nobody's)
        startup = shared._startup
        assert startup is not None
        await until(startup.done)
        with pytest.raises(BatcherStoppedError, match=r"its start failed: OSError\('no model'\)"):
            await shared.process(1)  # (says why)
        await shared.stop()

    await start_and_stop()
    gc.collect()  # (a task's error never retrieved is reported as the task goes)
    assert not loop_errors
