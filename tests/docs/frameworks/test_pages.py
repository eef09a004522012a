"""The blocks of the pages that import TensorFlow (Keras), PyTorch or scikit-learn (the full tier's), all in one
interpreter: as tests/docs/test_pages.py runs the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import PAGES, ROOT, check_ran, frameworks

RUN = [page for page in PAGES if frameworks(page)]


@pytest.mark.parametrize("page", RUN, ids=[str(p.relative_to(ROOT)) for p in RUN])
def test_every_python_block_of_the_page_runs(page: Path, ran: dict[Path, dict[str, object]]) -> None:
    check_ran(page, ran[page])
