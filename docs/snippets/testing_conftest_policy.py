"""conftest.py, for pytest-asyncio 0.23 to 1.3 (no loop factories hook): every
async test of this folder runs on a virtual clock.
"""

import pytest

from async_batcher.testing import VirtualClockPolicy


@pytest.fixture(scope="session")
def event_loop_policy() -> VirtualClockPolicy:
    return VirtualClockPolicy()
