"""The pages a test module of tests/docs runs (its ``RUN``), run once for the module, in one interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import run_in_one_interpreter


@pytest.fixture(scope="module")
def ran(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[Path, dict[str, object]]:
    """What :func:`~tests.docs.blocks.run_in_one_interpreter` says of each page of the module's ``RUN``."""
    pages: list[Path] = request.module.RUN
    return run_in_one_interpreter(pages, tmp_path_factory.mktemp("docs") / "ran.jsonl")
