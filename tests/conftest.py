"""Runs ``async def`` tests without a plugin: each on the default asyncio loop and on uvloop.

- ``@pytest.mark.virtual_time``: the test runs on :class:`VirtualClockLoop`, whose clock jumps straight to the next
  timer whenever nothing else can run, so time-dependent behaviour is tested exactly and instantly, with no wall
  time involved.
- ``@pytest.mark.single_loop``: the default asyncio loop only (slow integration tests).

Anything the loop's exception handler receives (a task exception never retrieved, an error reported through
``call_exception_handler``) fails the test, unless the test takes the ``loop_errors`` fixture and checks it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import selectors
from collections.abc import Callable
from typing import Any

import pytest

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test extra
    uvloop = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "single_loop: run on the default asyncio event loop only")


class _JumpSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls for real; when nothing is ready and a timer is pending, advances the virtual clock to it."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None or self._loop.busy_threads:
            # Nothing scheduled, or an executor thread is working: wait for real (the thread wakes the loop).
            return super().select(timeout if timeout is None else None)
        self._loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``time()`` only moves when the loop would otherwise sleep."""

    def __init__(self) -> None:
        self._now = 0.0
        self.jumps = 0  # how many times the clock jumped to a timer: each is a wake-up of an idle loop
        self.busy_threads = 0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self.jumps += 1

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        # While a thread works, time must not jump ahead of it.
        self.busy_threads += 1
        fut = super().run_in_executor(executor, func, *args)

        def done(_: asyncio.Future[Any]) -> None:
            self.busy_threads -= 1

        fut.add_done_callback(done)
        return fut


LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.SelectorEventLoop,
    "virtual": VirtualClockLoop,
}
if uvloop is not None:
    LOOP_FACTORIES["uvloop"] = uvloop.new_event_loop


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not inspect.iscoroutinefunction(metafunc.function):
        return
    if metafunc.definition.get_closest_marker("virtual_time"):
        kinds = ["virtual"]
    elif metafunc.definition.get_closest_marker("single_loop"):
        kinds = ["asyncio"]
    else:
        kinds = [k for k in ("asyncio", "uvloop") if k in LOOP_FACTORIES]
    if "loop_kind" not in metafunc.fixturenames:
        metafunc.fixturenames.append("loop_kind")
    metafunc.parametrize("loop_kind", kinds)


@pytest.fixture
def loop_errors() -> list[dict[str, Any]]:
    """The contexts the event loop's exception handler received; taking this fixture means checking them."""
    return []


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    funcargs = pyfuncitem.funcargs
    kind = pyfuncitem.callspec.params["loop_kind"]
    checked = "loop_errors" in pyfuncitem.fixturenames
    errors: list[dict[str, Any]] = funcargs["loop_errors"] if checked else []
    kwargs = {
        name: funcargs[name] if name in funcargs else pyfuncitem.callspec.params[name]
        for name in pyfuncitem._fixtureinfo.argnames
    }
    with asyncio.Runner(loop_factory=LOOP_FACTORIES[kind]) as runner:
        runner.get_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        runner.run(pyfuncitem.obj(**kwargs))
    if errors and not checked:
        pytest.fail(f"the event loop reported errors: {errors!r}")
    return True


@pytest.fixture
def thread_pool() -> Any:
    with concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-batch") as pool:
        yield pool
