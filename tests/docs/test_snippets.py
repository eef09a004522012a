"""The snippets of the dispatch policies guide and of the testing guide, run as their readers run them: the policy
of one's own on the virtual clock, the replay that tells why batches are small, and the pytest tests with the
conftest.py that puts them on the virtual clock (a pytest of their own, in a folder of their own)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from async_batcher.testing import VirtualClockLoop, record_batches
from docs.snippets.policy_interactive import Interactive, Model
from tests.snippets import ROOT, run_snippet


def test_the_policy_guides_own_policy_sends_as_its_page_says(tmp_path: Path) -> None:
    # On the virtual clock the waits are exact: the web batch at its 2 ms, ahead of the backfill's 100 ms; then 8 web
    # items at once, when the model's 5 ms batch has ended.
    assert run_snippet("docs/snippets/policy_interactive.py", tmp_path).splitlines() == [
        "web 3 deadline at 2 ms",
        "backfill 10 deadline at 100 ms",
        "web 8 size at 105 ms",
    ]


async def arrivals(model: Model, key: str, n: int, every: float) -> list[float]:
    calls = []
    for i in range(n):
        calls.append(asyncio.ensure_future(model.process((key, i))))
        await asyncio.sleep(every)
    return await asyncio.gather(*calls)


@pytest.mark.virtual_time
async def test_the_guides_policy_sends_at_8_web_items_or_64_backfill_items_before_their_waits() -> None:
    # One item every 0.1 ms (web) and every 1 ms (backfill), two slots: the 8th web item and the 64th backfill
    # item make their batches go at once, long before 2 ms and 100 ms; the rest go at their waits.
    async with Model(policy=Interactive({"web"}), concurrency=2) as model:
        with record_batches(model) as batches:
            await asyncio.gather(arrivals(model, "web", 10, 0.0001), arrivals(model, "backfill", 70, 0.001))
    assert isinstance(asyncio.get_running_loop(), VirtualClockLoop)
    assert [(b.key, b.size, b.reason, round(b.started, 6)) for b in batches] == [
        ("web", 8, "size", 0.0007),
        ("web", 2, "deadline", 0.0028),
        ("backfill", 64, "size", 0.063),
        ("backfill", 6, "deadline", 0.164),
    ]


def test_the_testing_guides_replay_tells_why_batches_are_small(tmp_path: Path) -> None:
    # A request every millisecond: a 2 ms wait sends batches of 2, each at its deadline; a 20 ms wait fills them to
    # max_batch_size (the last one goes at its deadline with what is left).
    assert run_snippet("docs/snippets/testing_small_batches.py", tmp_path).splitlines() == [
        "max_queue_time=0.002: {'deadline': 500} sizes {2: 500}",
        "max_queue_time=0.02: {'full': 62, 'deadline': 1} sizes {16: 62, 8: 1}",
    ]


# Beside the guide's tests, the loops each test gets: the marked ones the virtual clock, the others a real one.
LOOPS = """
import asyncio

import pytest

from async_batcher.testing import VirtualClockLoop


@pytest.mark.asyncio
@pytest.mark.virtual_time
async def test_marked() -> None:
    assert isinstance(asyncio.get_running_loop(), VirtualClockLoop)


@pytest.mark.asyncio
async def test_not_marked() -> None:
    assert not isinstance(asyncio.get_running_loop(), VirtualClockLoop)
"""

# Under the event_loop_policy fixture, every async test of the folder.
EVERY_LOOP = """
import asyncio

import pytest

from async_batcher.testing import VirtualClockLoop


@pytest.mark.asyncio
async def test_on_the_virtual_clock() -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualClockLoop)
    await asyncio.sleep(3600)
    assert loop.time() == 3600
"""


def pytest_in(folder: Path, *options: str) -> str:
    """Run pytest in ``folder`` as a project of its own (pytest-asyncio's strict mode, the default), with this
    repository's package; return its output, fail unless every test passed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    ini = "asyncio_default_fixture_loop_scope=function"  # (unset, pytest-asyncio warns)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", ini, "-W", "error", *options, str(folder)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_testing_guides_tests_run_on_the_virtual_clock_with_its_conftest(tmp_path: Path) -> None:
    shutil.copy(ROOT / "docs/snippets/testing_conftest.py", tmp_path / "conftest.py")
    shutil.copy(ROOT / "docs/snippets/testing_tests.py", tmp_path / "test_batches.py")
    (tmp_path / "test_loops.py").write_text(LOOPS)
    assert "5 passed" in pytest_in(tmp_path)


def test_the_testing_guides_event_loop_policy_fixture_puts_every_test_on_the_virtual_clock(tmp_path: Path) -> None:
    shutil.copy(ROOT / "docs/snippets/testing_conftest_policy.py", tmp_path / "conftest.py")
    (tmp_path / "test_clock.py").write_text(EVERY_LOOP)
    # (pytest-asyncio 1.4 and later warn that overriding the fixture is deprecated: the guide says to use the hook.)
    assert "1 passed" in pytest_in(tmp_path, "-W", "ignore::pytest.PytestDeprecationWarning")


def test_the_fastapi_guides_tests_run_as_shown_in_pytest_asyncios_default_mode(tmp_path: Path) -> None:
    # Its async test needed asyncio_mode = "auto", which only the file's docstring said: in the strict mode, the
    # default, pytest-asyncio left it unrun (a warning, an error here).
    shutil.copy(ROOT / "docs/snippets/fastapi_testing.py", tmp_path / "test_app.py")
    # (Starlette's TestClient warns that it prefers httpx2 to httpx, a deprecation that is not the guide's.)
    assert "2 passed" in pytest_in(tmp_path, "-W", "ignore:Using `httpx` with `starlette.testclient`")
