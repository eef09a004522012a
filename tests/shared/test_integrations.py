"""The shared batcher in the rest of the package: ``@batch(shared=...)``, the FastAPI helpers, blocking callers,
``python -m async_batcher.serve``, and OpenTelemetry's trace context across the socket."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import Depends, FastAPI

from async_batcher import AsyncBatcher, batch
from async_batcher.fastapi import add_batcher_exception_handlers, batcher_dependency, batcher_lifespan
from async_batcher.shared import SharedBatcher, Sharing
from tests.loops import until
from tests.shared.models import Model
from tests.shared.procs import ROOT, wait_for


async def test_the_decorator_shares_a_function_among_processes(address: str) -> None:
    calls: list[list[int]] = []

    async def double(xs: list[int]) -> list[int]:
        calls.append(xs)
        return [2 * x for x in xs]

    owner = batch(max_batch_size=8, max_queue_time=0.01, shared=Sharing(address=address))(double)
    client = batch(max_batch_size=8, max_queue_time=0.01, shared=Sharing(address=address))(double)
    first, second = owner.batcher, client.batcher
    assert isinstance(first, SharedBatcher) and isinstance(second, SharedBatcher)
    assert first.name.endswith("double")
    async with first, second:
        assert (first.role, second.role) == ("owner", "client")
        assert list(await asyncio.gather(owner(1), client(2), client(3))) == [2, 4, 6]
        assert isinstance(first.batcher, AsyncBatcher) and second.batcher is None
        assert sorted(x for c in calls for x in c) == [1, 2, 3]
        assert await asyncio.to_thread(client.sync, 5) == 10  # a blocking caller, from a thread


def test_the_decorator_refuses_what_cannot_be_shared() -> None:
    async def double(xs: list[int]) -> list[int]:
        return xs

    with pytest.raises(TypeError, match=r"shared must be True, False or an async_batcher\.shared\.Sharing"):
        batch(shared="yes")(double)  # type: ignore[call-overload]

    class Scaler:
        async def scale(self, xs: list[int]) -> list[int]:
            return xs

    with pytest.raises(TypeError, match="a method's batcher belongs to its instance"):
        batch(shared=True)(Scaler.scale)
    shared = batch(shared=True)(double)
    assert isinstance(shared.batcher, SharedBatcher)
    assert shared.batcher._address is None  # nothing touched at decoration: the address is computed at start


async def test_fastapi_serves_a_client_and_a_full_queue_is_503_across(address: str) -> None:
    gate = asyncio.Event()

    async def make() -> Model:
        return Model(gate=gate, max_batch_size=1, max_queue_time=0, concurrency=1, max_queue_size=1)

    client: SharedBatcher[Any, Any] = SharedBatcher(make, address=address, name="predictor", role="client")
    app = FastAPI(lifespan=batcher_lifespan(client))
    add_batcher_exception_handlers(app, retry_after=2)

    @app.post("/double")
    async def double(x: int, predictor: Any = Depends(batcher_dependency("predictor"))) -> Any:  # noqa: B008
        return await predictor.process(x)

    async with SharedBatcher(make, address=address, name="predictor") as owner, LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            first = asyncio.ensure_future(http.post("/double", params={"x": 1}))
            await until(lambda: isinstance(owner.batcher, Model) and owner.batcher.batches)
            second = asyncio.ensure_future(http.post("/double", params={"x": 2}))
            await until(lambda: owner.stats.submitted == 2)
            refused = await http.post("/double", params={"x": 3})
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "2"
            gate.set()
            assert [(await r).json() for r in (first, second)] == [2, 4]


def test_serve_owns_a_batcher_until_sigterm(address: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARED_TEST_LOG": str(tmp_path)}
    command = [sys.executable, "-m", "async_batcher.serve", "tests.shared.models:model", "--address", address]
    server = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: os.path.exists(address) or server.poll() is not None, 30, "the socket")

        async def use() -> list[int]:
            async with SharedBatcher(Model, address=address, role="client", name="model") as client:
                return list(await asyncio.gather(*(client.process(i) for i in range(5))))

        assert asyncio.run(use()) == [0, 2, 4, 6, 8]
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
        assert server.returncode == 0, err.decode()
        assert b"serving at " + address.encode() in err
        assert not os.path.exists(address)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
    bad = subprocess.run(
        [sys.executable, "-m", "async_batcher.serve", "tests.shared.models:nothing"], cwd=ROOT, env=env,
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and b"has no 'nothing'" in bad.stderr


async def test_the_callers_trace_context_crosses_to_the_batch_span(address: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from async_batcher.opentelemetry import instrument

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def make() -> Model:
        model = Model(max_batch_size=8, max_queue_time=0.01)
        instrument(model, tracer_provider=provider)  # (in the owner, where the batcher is)
        return model

    owner = SharedBatcher(make, address=address, name="m")
    client = SharedBatcher(make, address=address, name="m")
    async with owner, client:
        with provider.get_tracer("tests").start_as_current_span("request") as span:
            assert await client.process(1) == 2
        (batch_span,) = [s for s in exporter.get_finished_spans() if s.name.endswith(" batch")]
        context = span.get_span_context()
        assert [(link.context.trace_id, link.context.span_id) for link in batch_span.links] == [
            (context.trace_id, context.span_id)
        ]
    provider.shutdown()


def test_instrumenting_a_shared_function_instruments_its_shared_batcher() -> None:
    from async_batcher.opentelemetry import instrument, is_instrumented, uninstrument

    async def double(xs: list[int]) -> list[int]:
        return xs

    shared = batch(shared=True)(double)
    instrument(shared)  # in every process: its callers' events, and its batches where it is owned
    assert is_instrumented(shared) and is_instrumented(shared.batcher)
    uninstrument(shared)
    assert not is_instrumented(shared)
