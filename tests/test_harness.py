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
    result = harness.runpytest_subprocess("-p", "no:cacheprovider", "--every-loop")
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
    result = harness.runpytest_subprocess("-p", "no:cacheprovider", "--every-loop")
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
    harness.runpytest_subprocess("-p", "no:cacheprovider", "--every-loop").assert_outcomes(passed=4)


def test_uvloop_runs_the_cores_tests_and_every_test_with_every_loop(harness: pytest.Pytester) -> None:
    loops = """
        import asyncio
        import pytest

        seen = []

        async def test_loop() -> None:
            seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

        @pytest.mark.virtual_time
        @pytest.mark.real_loop
        async def test_real_loop_wins() -> None:
            seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

        def test_seen() -> None:
            assert sorted(seen) == sorted(EXPECTED)
        """
    harness.mkpydir("tests/core")
    harness.mkpydir("tests/aws")
    harness.makepyfile(
        **{
            "tests/core/test_core.py": loops.replace("EXPECTED", '["asyncio", "uvloop"] * 2'),
            "tests/aws/test_other.py": loops.replace("EXPECTED", '["asyncio"] * 2'),
        }
    )
    harness.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=8)
    (harness.path / "tests/aws/test_other.py").write_text(
        (harness.path / "tests/core/test_core.py").read_text().replace("test_core", "test_other")
    )
    harness.runpytest_subprocess("-p", "no:cacheprovider", "--every-loop").assert_outcomes(passed=10)


def test_the_fast_tier_leaves_out_the_integration_folders_and_the_servers(harness: pytest.Pytester) -> None:
    # tests/keras is the full tier's: not even imported without it (TensorFlow need not be installed); a test that
    # takes a server beyond Python (postgres), or its parameter, is the full tier's wherever it is.
    for folder in ("tests/keras", "tests/sqlalchemy"):
        harness.mkpydir(folder)
    harness.makepyfile(
        **{
            "tests/keras/test_model.py": "import no_such_framework\n\ndef test_model() -> None:\n    pass\n",
            "tests/sqlalchemy/test_write.py": """
            import pytest

            @pytest.fixture
            def postgres() -> str:
                return "a server"

            def test_on_sqlite() -> None:
                pass

            def test_on_postgres(postgres: str) -> None:
                pass

            @pytest.mark.parametrize("url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
            def test_on_either(url: str) -> None:
                pass
            """,
        }
    )
    fast = harness.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not integration", "-v")
    fast.assert_outcomes(passed=2, deselected=2)
    fast.stdout.fnmatch_lines(["*test_on_sqlite PASSED*", "*test_on_either?sqlite? PASSED*"])
    full = harness.runpytest_subprocess(
        "-p", "no:cacheprovider", "-m", "integration", "--continue-on-collection-errors"
    )
    full.assert_outcomes(passed=2, deselected=2, errors=1)  # and tests/keras fails to import, naming the module
    full.stdout.fnmatch_lines(["*No module named 'no_such_framework'*"])
