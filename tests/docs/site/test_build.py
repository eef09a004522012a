"""The documentation site builds strictly (mkdocs, the docs group: the full tier's), as .github/workflows/docs.yml
publishes it, and the README's links into it hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs.blocks import README, ROOT, SITE


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
    # The reference as tools/griffe_reference.py and the options of mkdocs.yml make it: signatures formatted one
    # parameter a line (ruff), no private base class, the contract a link, docstrings' examples highlighted.
    assert '<span class="nf">AsyncBatcher</span><span class="p">(</span>\n    <span class="o">*</span>' in reference
    assert "async_batcher._settings" not in reference
    assert 'href="../../guarantees/#guarantees">the guarantees page</a>' in reference
    assert "1. <strong>Dispatch.</strong>" not in reference and "<strong>Dispatch.</strong>" not in reference
    integrations = (tmp_path / "site" / "reference" / "integrations" / "index.html").read_text()
    assert '<span class="n">predictor</span> <span class="o">=</span>' in integrations
    assert "::</p>" not in integrations and "code-block" not in integrations
    # The README (PyPI's page too) links into the published site: each link is a page of this build, and each
    # #anchor one of its headings' ids.
    links = re.findall(r"\]\((" + re.escape(SITE) + r"[^)\s]*)\)", README.read_text())
    assert len(links) >= 10, links
    for link in links:
        path, _, anchor = link.removeprefix(SITE).partition("#")
        page = tmp_path / "site" / path / "index.html"
        assert page.is_file(), f"README links to {link}: no such page in the site"
        assert not anchor or f'id="{anchor}"' in page.read_text(), f"README links to {link}: no such anchor"
