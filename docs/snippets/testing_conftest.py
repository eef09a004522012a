"""conftest.py: the tests marked virtual_time run on a virtual clock.

pytest-asyncio 1.4 or later: its pytest_asyncio_loop_factories hook gives each
async test the event loops it runs on.
"""

import asyncio
from collections.abc import Callable

import pytest

from async_batcher.testing import VirtualClockLoop


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "virtual_time: run on a virtual clock")


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.get_closest_marker("virtual_time"):
        return {"virtual": VirtualClockLoop}
    return {"asyncio": asyncio.new_event_loop}  # the others: a real clock
