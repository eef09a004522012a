"""Async tests run on pytest-asyncio (auto mode), each on the asyncio loop and on uvloop.

- ``@pytest.mark.virtual_time``: the test runs on :class:`~tests.loops.VirtualClockLoop` only, whose clock jumps
  straight to the next timer whenever nothing else can run.
- ``@pytest.mark.single_loop``: the default asyncio loop only (slow integration tests).

What pytest-asyncio leaves silent fails the test here (the smallest hand-written piece that does it):

- anything the loop's exception handler receives (a task exception never retrieved, an error reported through
  ``call_exception_handler``), unless the test takes the ``loop_errors`` fixture and checks it;
- a task the test started that is still pending when the test returns: a caller left waiting. (pytest-asyncio
  would cancel it without a word at teardown.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.loops import LOOP_FACTORIES

# The loops made for the current test, and what their exception handlers received.
_loops: list[asyncio.AbstractEventLoop] = []
_errors: list[dict[str, Any]] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "single_loop: run on the default asyncio event loop only")


def _watched(factory: Callable[[], asyncio.AbstractEventLoop]) -> Callable[[], asyncio.AbstractEventLoop]:
    def make() -> asyncio.AbstractEventLoop:
        loop = factory()
        loop.set_exception_handler(lambda _loop, context: _errors.append(context))
        _loops.append(loop)
        return loop

    return make


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    if item.get_closest_marker("virtual_time"):
        kinds = ["virtual"]
    elif item.get_closest_marker("single_loop"):
        kinds = ["asyncio"]
    else:
        kinds = ["asyncio", "uvloop"]
    return {kind: _watched(LOOP_FACTORIES[kind]) for kind in kinds}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _loops.clear()
    _errors.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    before = {task for loop in _loops for task in asyncio.all_tasks(loop)}
    outcome = yield
    if outcome.excinfo is not None or not _loops:
        return
    pending = [task for loop in _loops for task in asyncio.all_tasks(loop) if task not in before]
    if pending:
        pytest.fail(f"the test left {len(pending)} task(s) pending, a caller left waiting: {pending!r}")
    if _errors and "loop_errors" not in item.fixturenames:  # type: ignore[attr-defined]
        pytest.fail(f"the event loop reported errors: {_errors!r}")


@pytest.fixture
def loop_errors() -> list[dict[str, Any]]:
    """The contexts the event loop's exception handler received; taking this fixture means checking them."""
    return _errors


@pytest.fixture
def thread_pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-batch") as pool:
        yield pool
