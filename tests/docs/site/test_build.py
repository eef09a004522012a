"""The documentation site builds strictly (mkdocs, the docs group: the full tier's), as .github/workflows/docs.yml
publishes it: its reference is complete, it publishes no source file, and the README's links into it hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import griffe
import pytest

from async_batcher import BatcherOptions
from tests.docs.blocks import README, ROOT, SITE


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built strictly (once for the tests of this module that read it)."""
    folder = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def test_the_site_builds_strictly(site: Path) -> None:
    reference = (site / "reference" / "core" / "index.html").read_text()
    assert "process_batch" in reference and "max_queue_time" in reference  # generated from the docstrings
    # The reference as tools/griffe_reference.py and the options of mkdocs.yml make it: signatures formatted one
    # parameter a line (ruff), no private base class, the contract a link, docstrings' examples highlighted.
    limits = '<span class="nf">Limits</span><span class="p">(</span>\n    <span class="n">max_batch_size</span>'
    assert limits in reference
    assert "SettingsView" not in reference  # (AsyncBatcher's private base: its settings as attributes)
    # AsyncBatcher(**options: Unpack[BatcherOptions]): the signature links to BatcherOptions, whose every key (each a
    # keyword of AsyncBatcher and of @batch) has an entry of its own, with its words.
    signature = reference.split('<span class="nf">AsyncBatcher</span>', 1)[1].split("</code>", 1)[0]
    assert '<span class="o">**</span><span class="n">options</span>' in signature
    assert 'href="#async_batcher.BatcherOptions">BatcherOptions</a>' in signature
    for option in BatcherOptions.__annotations__:
        entry = reference.partition(f'<h4 id="async_batcher.BatcherOptions.{option}"')[2].split("<h4 ", 1)[0]
        assert re.search(r'<div class="doc doc-contents ">\s*<p>\S', entry), f"{option}=: no entry in the reference"
    assert 'href="../../guarantees/#guarantees">the guarantees page</a>' in reference
    assert "1. <strong>Dispatch.</strong>" not in reference and "<strong>Dispatch.</strong>" not in reference
    integrations = (site / "reference" / "integrations" / "index.html").read_text()
    assert '<span class="n">predictor</span> <span class="o">=</span>' in integrations
    assert "::</p>" not in integrations and "code-block" not in integrations
    # The README (PyPI's page too) links into the published site: each link is a page of this build, and each
    # #anchor one of its headings' ids.
    links = re.findall(r"\]\((" + re.escape(SITE) + r"[^)\s]*)\)", README.read_text())
    assert len(links) >= 10, links
    for link in links:
        path, _, anchor = link.removeprefix(SITE).partition("#")
        page = site / path / "index.html"
        assert page.is_file(), f"README links to {link}: no such page in the site"
        assert not anchor or f'id="{anchor}"' in page.read_text(), f"README links to {link}: no such anchor"


def test_the_site_publishes_no_source_file(site: Path) -> None:
    # What docs/ holds besides pages is copied into the site as is: only its stylesheets are meant to be (the
    # snippets' sources and their ruff.toml are included into pages, or configure the linter).
    docs = ROOT / "docs"
    copied = sorted(
        str(path.relative_to(docs))
        for path in docs.rglob("*")
        if path.is_file() and path.suffix != ".md" and (site / path.relative_to(docs)).exists()
    )
    assert copied == ["stylesheets/extra.css"]


def public_modules(module: griffe.Module) -> list[griffe.Module]:
    """``module`` and its submodules, but the private ones (a part of whose path starts with ``_``)."""
    if any(part.startswith("_") for part in module.path.split(".")):
        return []
    return [module, *(m for sub in module.modules.values() for m in public_modules(sub))]


def test_the_reference_documents_every_public_name(site: Path) -> None:
    # Every name in a public module's __all__ has its entry in the API reference (docs/reference/*.md through
    # mkdocstrings): an object of the built pages whose heading id is a path to it (a re-export counts).
    package = griffe.load("async_batcher", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)
    ids = {
        i for page in (site / "reference").glob("*/index.html") for i in re.findall(r'id="([\w.]+)"', page.read_text())
    }
    documented = set()
    for path in ids:
        try:
            documented.add(package[path.removeprefix("async_batcher.")].canonical_path)
        except (KeyError, ValueError, griffe.AliasResolutionError):
            pass  # (a heading's own id, not an object's)
    missing = []
    for module in public_modules(package):
        for name in module.exports or ():
            target = module[str(name)]
            if target.canonical_path not in documented:
                missing.append(f"{module.path}.{name}")
    assert len(documented) > 50
    # A constant documented by the #: comments above it has them on its page (tools/griffe_reference.py).
    assert "stream is complete" in (site / "reference" / "core" / "index.html").read_text()
    assert not missing, f"not in the API reference (docs/reference/*.md): {missing}"
