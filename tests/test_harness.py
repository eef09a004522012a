"""The test harness itself (tests/conftest.py): what pytest-asyncio would leave silent fails a test here."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent


@pytest.fixture
def harness(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester directory with this suite's conftest, loops and pytest settings."""
    package = pytester.mkpydir("tests")
    for name in ("conftest.py", "loops.py"):
        (package / name).write_text((HERE / name).read_text())
    pytester.makeini(
        """
        [pytest]
        asyncio_mode = auto
        asyncio_default_fixture_loop_scope = function
        asyncio_default_test_loop_scope = function
        markers =
            virtual_time: virtual clock
        """
    )
    return pytester


def test_a_caller_left_waiting_fails_the_test(harness: pytest.Pytester) -> None:
    harness.makepyfile(
        **{
            "tests/test_left.py": """
            import asyncio

            async def test_leaves_a_caller() -> None:
                asyncio.ensure_future(asyncio.Event().wait())
            """
        }
    )
    result = harness.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)  # on asyncio and on uvloop
    result.stdout.fnmatch_lines(["*left 1 task(s) pending*"])


def test_an_error_the_loop_reports_fails_the_test_unless_it_is_checked(harness: pytest.Pytester) -> None:
    harness.makepyfile(
        **{
            "tests/test_errors.py": """
            import asyncio

            def report() -> None:
                asyncio.get_running_loop().call_exception_handler({"message": "boom"})

            async def test_unchecked() -> None:
                report()

            async def test_checked(loop_errors) -> None:
                report()
                assert [e["message"] for e in loop_errors] == ["boom"]
            """
        }
    )
    result = harness.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2, passed=2)
    result.stdout.fnmatch_lines(["*the event loop reported errors*boom*"])


def test_async_tests_run_on_both_loops_and_virtual_time_on_its_own(harness: pytest.Pytester) -> None:
    harness.makepyfile(
        **{
            "tests/test_loops.py": """
            import asyncio
            import pytest
            from tests.loops import VirtualClockLoop

            seen = []

            async def test_both() -> None:
                seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

            @pytest.mark.virtual_time
            async def test_virtual() -> None:
                assert isinstance(asyncio.get_running_loop(), VirtualClockLoop)
                await asyncio.sleep(3600)
                assert asyncio.get_running_loop().time() == 3600

            def test_seen() -> None:
                assert sorted(seen) == ["asyncio", "uvloop"]
            """
        }
    )
    harness.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=4)
