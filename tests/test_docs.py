"""The README and the documentation site: every python block runs, the site builds strictly, links hold on PyPI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import blocks

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
# Fragments marked <!-- not-run: ... --> in all the pages together: a few at most, each for a reason.
MOST_NOT_RUN = 3


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_python_block_of_the_page_runs(page: Path) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.docs_blocks", str(page)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    expected = sum(1 for block in blocks(page) if block.not_run is None)
    assert done.stdout.strip().endswith(f"{expected} blocks ran"), done.stdout


def test_fragments_are_rare_and_say_why() -> None:
    not_run = [(page, block) for page in PAGES for block in blocks(page) if block.not_run is not None]
    assert len(not_run) <= MOST_NOT_RUN, not_run
    assert all(block.not_run for _, block in not_run)


def test_every_snippet_file_is_shown_and_tested() -> None:
    snippets = sorted(p for p in (ROOT / "docs" / "snippets").glob("*.py") if p.name != "__init__.py")
    shown = {block.snippet for page in PAGES for block in blocks(page)}
    tests = "".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py") if path.name != "test_docs.py")
    for snippet in snippets:
        name = str(snippet.relative_to(ROOT))
        assert name in shown, f"{name} is in no page"
        module = name.removesuffix(".py").replace("/", ".")
        assert name in tests or module in tests, f"no test runs {name} with what it needs"


def test_the_readme_quick_start_runs_and_is_short() -> None:
    first = blocks(README)[0]
    assert first.not_run is None and len(first.code.strip().splitlines()) <= 16
    done = subprocess.run([sys.executable, "-c", first.code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_readme_links_are_absolute_so_they_work_on_pypi() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    assert targets
    relative = [t for t in targets if not t.startswith(("https://", "#"))]
    assert not relative, relative


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reference = (tmp_path / "site" / "reference" / "core" / "index.html").read_text()
    assert "process_batch" in reference and "max_queue_time" in reference  # generated from the docstrings
