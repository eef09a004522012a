"""async_batcher.fastapi on tiny apps served by a real uvicorn: lifespan state, the dependency, 503, draining."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI

from async_batcher import AsyncBatcher, OutcomeUnknownError
from async_batcher.fastapi import add_batcher_exception_handlers, batcher_dependency, batcher_lifespan, run_batchers
from async_batcher.testing import record_batches
from tests.servers import ThreadServer


class HeldDoubler(AsyncBatcher[int, int]):
    """Doubles its items in a thread; each batch waits for ``release`` and says when it has begun."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entered = threading.Event()
        self.release = threading.Event()

    def process_batch(self, batch: list[int]) -> list[int]:
        self.entered.set()
        if not self.release.wait(30):
            raise TimeoutError("the test never released the batch")
        return [2 * x for x in batch]


def _app(batcher: AsyncBatcher[int, int], **lifespan: Any) -> FastAPI:
    app = FastAPI(lifespan=batcher_lifespan(batcher, **lifespan))
    add_batcher_exception_handlers(app, retry_after=2)

    @app.post("/double")
    async def double(x: int) -> int:
        return await batcher.process(x)

    return app


async def _wait_thread_event(event: threading.Event) -> None:
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, 30)


@pytest.mark.single_loop
async def test_full_queue_answers_503_and_shutdown_answers_the_requests_in_flight() -> None:
    # One batch of one item in flight, one item queued: the queue (max_queue_size=1) is then full.
    batcher = HeldDoubler(max_batch_size=1, max_queue_size=1, max_queue_time=0)
    server = ThreadServer(_app(batcher))
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/double", params={"x": 1}))
            await _wait_thread_event(batcher.entered)
            others = [asyncio.ensure_future(client.post("/double", params={"x": x})) for x in (2, 3)]
            # While the first batch is held, nothing can answer 2 or 3 but the admission: one of them is queued,
            # the other refused.
            done, pending = await asyncio.wait(others, return_when=asyncio.FIRST_COMPLETED)
            refused = done.pop().result()
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "2"
            assert "queue full" in refused.json()["detail"]
            assert not first.done() and len(pending) == 1

            server.begin_shutdown()  # with a request in process_batch and one in the queue
            batcher.release.set()
            answers = [(await first).json(), (await pending.pop()).json()]
        server.join()
    finally:
        batcher.release.set()
        server.begin_shutdown()
    assert answers[0] == 2 and answers[1] in (4, 6)
    assert not await batcher.is_running()  # the lifespan stopped it
    assert (batcher.stats.processed, batcher.stats.rejected) == (2, 1)


@pytest.mark.single_loop
async def test_stopped_batcher_answers_503() -> None:
    batcher = HeldDoubler()
    batcher.release.set()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with run_batchers(batcher):
            pass  # started and stopped before the first request: as if the server were shutting down
        yield

    app = FastAPI(lifespan=lifespan)
    add_batcher_exception_handlers(app)

    @app.post("/double")
    async def double(x: int) -> int:
        return await batcher.process(x)

    server = ThreadServer(app)
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            response = await client.post("/double", params={"x": 1})
    finally:
        server.begin_shutdown()
        server.join()
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert "shutting down" in response.json()["detail"]


class Doubler(AsyncBatcher[int, int]):
    def __init__(self, fail_on_stop: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_on_stop = fail_on_stop

    async def process_batch(self, batch: list[int]) -> list[int]:
        return [2 * x for x in batch]

    async def on_stop(self) -> None:
        if self.fail_on_stop:
            raise OSError("could not close")


async def test_run_batchers_drains_what_is_queued_on_exit() -> None:
    batcher = Doubler(max_queue_time=60)  # nothing would go out for a minute but for the stop
    async with run_batchers(batcher):
        assert await batcher.is_running()
        tasks = [asyncio.ensure_future(batcher.process(x)) for x in range(3)]
        await asyncio.sleep(0)  # one loop iteration: each task enqueues its item synchronously when it runs
        assert batcher.stats.queued == 3
    assert not await batcher.is_running()
    assert [t.result() for t in tasks] == [0, 2, 4]


async def test_run_batchers_stops_every_batcher_even_if_one_fails() -> None:
    failing, other = Doubler(fail_on_stop=True, name="failing"), Doubler(name="other")
    with pytest.raises(OSError, match="could not close"):
        async with run_batchers(other, failing):
            assert await failing.is_running() and await other.is_running()
    assert not await failing.is_running()
    assert not await other.is_running()


@pytest.mark.parametrize("retry_after", [-1, 1.5, True, "1"])
def test_retry_after_must_be_whole_seconds(retry_after: Any) -> None:
    with pytest.raises(ValueError, match="retry_after must be a non-negative int"):
        add_batcher_exception_handlers(FastAPI(), retry_after=retry_after)


class Square(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [x * x for x in batch]


def _serve(app: FastAPI) -> ThreadServer:
    server = ThreadServer(app)
    server.start()
    return server


def _stop(server: ThreadServer) -> None:
    server.begin_shutdown()
    server.join()


async def test_the_lifespan_state_holds_the_batchers_and_the_dependency_gives_them_by_name() -> None:
    doubler, square = Doubler(name="double"), Square(name="square")
    app = FastAPI(lifespan=batcher_lifespan(doubler, square))

    @app.post("/double")
    async def double(x: int, batcher: Annotated[Doubler, Depends(batcher_dependency("double"))]) -> int:
        return await batcher.process(x)

    @app.post("/square")
    async def squared(x: int, batcher: Annotated[Square, Depends(batcher_dependency("square"))]) -> int:
        return await batcher.process(x)

    @app.post("/any")
    async def any_batcher(x: int, batcher: Annotated[Square, Depends(batcher_dependency())]) -> int:
        return await batcher.process(x)  # two batchers in the state: which one is ambiguous

    server = _serve(app)
    try:
        assert server.state == {"double": doubler, "square": square}
        assert await doubler.is_running() and await square.is_running()
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            doubled = await asyncio.gather(*(client.post("/double", params={"x": x}) for x in range(5)))
            squared_ = await asyncio.gather(*(client.post("/square", params={"x": x}) for x in range(5)))
            ambiguous = await client.post("/any", params={"x": 3})
    finally:
        _stop(server)
    assert [r.json() for r in doubled] == [0, 2, 4, 6, 8]
    assert [r.json() for r in squared_] == [0, 1, 4, 9, 16]
    assert ambiguous.status_code == 500  # a set-up bug, told by a LookupError in the server's log
    assert not await doubler.is_running() and not await square.is_running()


async def test_without_a_name_the_dependency_gives_the_only_batcher_among_other_state() -> None:
    square = Square()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with run_batchers(square) as batchers:
            yield {**batchers, "settings": {"answer": 42}}  # other state is ignored

    app = FastAPI(lifespan=lifespan)

    @app.post("/square")
    async def squared(x: int, batcher: Annotated[Square, Depends(batcher_dependency())]) -> int:
        return await batcher.process(x)

    @app.post("/missing")
    async def missing(x: int, batcher: Annotated[Square, Depends(batcher_dependency("nope"))]) -> int:
        return await batcher.process(x)

    server = _serve(app)
    try:
        assert server.state == {"Square": square, "settings": {"answer": 42}}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answer = await client.post("/square", params={"x": 7})
            absent = await client.post("/missing", params={"x": 7})
    finally:
        _stop(server)
    assert (answer.status_code, answer.json()) == (200, 49)
    assert absent.status_code == 500


async def test_the_dependency_names_what_it_misses() -> None:
    from starlette.requests import Request

    get = batcher_dependency("predictor")
    request = Request({"type": "http", "state": {"square": Square(name="square"), "other": 1}})
    with pytest.raises(LookupError, match=r"batcher 'predictor' is not in the app's lifespan state.*\['square'\]"):
        await get(request)
    with pytest.raises(LookupError, match=r"a batcher is not in the app's lifespan state, which is empty: the app's"):
        await batcher_dependency()(Request({"type": "http"}))
    with pytest.raises(LookupError, match=r"which holds no batcher \(only \['other'\]\): yield it from the lifespan"):
        await get(Request({"type": "http", "state": {"other": 1}}))
    with pytest.raises(TypeError, match="name must be a batcher's name"):
        batcher_dependency(3)  # type: ignore[arg-type]


async def test_a_client_that_does_not_run_the_lifespan_is_told_how_to_run_it_in_a_test() -> None:
    # httpx's ASGITransport calls the app without its lifespan: the state is empty, the batcher never started.
    model = Doubler(name="model")
    app = FastAPI(lifespan=batcher_lifespan(model))

    @app.post("/double")
    async def double(x: int, batcher: Annotated[Doubler, Depends(batcher_dependency("model"))]) -> int:
        return await batcher.process(x)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        with pytest.raises(LookupError) as raised:
            await client.post("/double", params={"x": 1})
    message = str(raised.value)
    assert "the app's lifespan did not run" in message
    assert "with TestClient(app) as client" in message and "LifespanManager(app)" in message
    assert "yield it from the lifespan" not in message  # (the app does)
    assert not await model.is_running()


@pytest.mark.virtual_time
async def test_concurrent_requests_on_the_virtual_clock_make_the_same_batches_every_run() -> None:
    # The dependency is an async def: FastAPI runs it on the loop, not in a worker thread the virtual clock cannot
    # see (the clock jumped past max_queue_time while the threads ran: [3], [2, 1], [1, 2] or [1, 1, 1] by run).
    from asgi_lifespan import LifespanManager

    seen: list[list[int]] = []
    for _ in range(20):
        model = Doubler(name="model", max_queue_time=0.01)
        app = FastAPI(lifespan=batcher_lifespan(model))

        @app.post("/double")
        async def double(x: int, batcher: Annotated[Doubler, Depends(batcher_dependency("model"))]) -> int:
            return await batcher.process(x)

        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                with record_batches(model) as log:
                    responses = await asyncio.gather(*(client.post("/double", params={"x": x}) for x in range(3)))
        assert [r.json() for r in responses] == [0, 2, 4]
        seen.append([r.size for r in log])
    assert seen == [[3]] * 20


def test_batchers_need_distinct_names_and_must_be_batchers() -> None:
    with pytest.raises(ValueError, match="two batchers are named 'Square': give each batcher its own name="):
        batcher_lifespan(Square(), Square())
    with pytest.raises(TypeError, match="expected AsyncBatcher instances"):
        batcher_lifespan(lambda x: x)  # type: ignore[arg-type]


async def test_run_batchers_gives_the_batchers_by_name() -> None:
    square, doubler = Square(), Doubler(name="d")
    async with run_batchers(square, doubler) as batchers:
        assert batchers == {"Square": square, "d": doubler}
        assert await square.process(3) == 9


def test_the_earlier_path_is_the_same_api() -> None:
    import async_batcher.fastapi as new
    import async_batcher.ml.fastapi as old

    assert old.__all__ == new.__all__
    assert all(getattr(old, name) is getattr(new, name) for name in new.__all__)


class UnknownOnStop(HeldDoubler):
    """A batcher whose process_batch has effects: a batch cut off by a stop leaves its callers' outcome unknown."""

    def abandoned_error(self, batch: list[int], error: BaseException) -> BaseException:
        return OutcomeUnknownError(f"{len(batch)} items may have been written")


@pytest.mark.single_loop
async def test_an_unknown_outcome_answers_500_without_retry_after() -> None:
    # A request whose write a forced stop cut off may have been done: not a 503 that invites a retry.
    batcher = UnknownOnStop(max_queue_time=0)
    server = ThreadServer(_app(batcher))
    server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            call = asyncio.ensure_future(client.post("/double", params={"x": 1}))
            await _wait_thread_event(batcher.entered)
            await asyncio.to_thread(batcher.stop_sync, True)  # on the server's loop, from a thread
            response = await call
    finally:
        batcher.release.set()
        server.begin_shutdown()
        server.join()
    assert response.status_code == 500
    assert "Retry-After" not in response.headers
    assert "outcome is unknown" in response.json()["detail"]
