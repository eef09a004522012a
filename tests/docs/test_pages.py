"""The README and the documentation site's pages: every python block runs, links hold on PyPI.

The blocks of the pages that import no framework of the full tier run here, all in one interpreter; those of the
pages that do, in tests/docs/frameworks/; the site's strict build, in tests/docs/site/.
"""

from __future__ import annotations

import inspect
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from async_batcher import AsyncBatcher
from async_batcher._core.options import OPTIONS
from tests.docs.blocks import (
    PAGES,
    README,
    ROOT,
    SESSION,
    SITE,
    blocks,
    check_ran,
    frameworks,
    is_session_page,
    run,
    session_sentence_before_first_block,
)

# Fragments marked <!-- not-run: ... --> in all the pages together: a few at most, each for a reason.
MOST_NOT_RUN = 3


# The pages whose blocks import nothing of the full tier's frameworks: run here, all in one interpreter.
RUN = [page for page in PAGES if not frameworks(page)]


@pytest.mark.parametrize("page", RUN, ids=[str(p.relative_to(ROOT)) for p in RUN])
def test_every_python_block_of_the_page_runs(page: Path, ran: dict[Path, dict[str, object]]) -> None:
    check_ran(page, ran[page])


def test_the_pages_that_need_a_framework_are_few_and_run_in_the_full_tier() -> None:
    # What tests/docs/frameworks/ runs (make test-all): the pages that show Keras, PyTorch or scikit-learn models.
    needing = sorted(str(page.relative_to(ROOT)) for page in PAGES if frameworks(page))
    assert needing == [
        "README.md",
        "docs/guides/fastapi.md",
        "docs/guides/numpy-keras.md",
        "docs/guides/sklearn.md",
        "docs/guides/torch.md",
    ]


@pytest.mark.parametrize("page", [p for p in PAGES if is_session_page(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_session_page_says_so_before_its_first_block(page: Path) -> None:
    assert session_sentence_before_first_block(page), f"{page}: say '{SESSION}' before the first block"


def test_the_runner_runs_each_block_where_the_page_says(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # A script page: each block alone, so a block that leans on an earlier one's import fails, and so does a
    # top-level await; the same blocks on a session page run.
    script = "```python\nimport asyncio\n```\n\n```python\nprint(asyncio.sleep)\n```\n"
    awaiting = "```python\nimport asyncio\nawait asyncio.sleep(0)\n```\n"
    for text, error in ((script, NameError), (awaiting, SyntaxError)):
        (page := tmp_path / "scripts.md").write_text(text)
        with pytest.raises(error):
            run(page)
        (page := tmp_path / "session.md").write_text(f"Blocks run {SESSION}.\n\n{text}")
        assert run(page) == len(blocks(page))
    # A session page runs as the prompt reads lines: a blank line inside a class ends the class there, and the
    # next indented line is an error, as it is at the prompt of python -m asyncio.
    pasted = "```python\nclass A:\n    x = 1\n\n    y = 2\n```\n"
    (page := tmp_path / "session.md").write_text(f"Blocks run {SESSION}.\n\n{pasted}")
    with pytest.raises(IndentationError):
        run(page)
    # ...and so is a statement right after a compound one, without the empty line the prompt needs between them.
    unseparated = "```python\nif True:\n    x = 1\nprint(x)\n```\n"
    (page := tmp_path / "session.md").write_text(f"Blocks run {SESSION}.\n\n{unseparated}")
    with pytest.raises(SyntaxError):
        run(page)
    # asyncio.run() fails there too: the prompt's own loop is running.
    closing = "```python\ncoro = asyncio.sleep(0)\ntry:\n    asyncio.run(coro)\nfinally:\n    coro.close()\n```\n"
    (page := tmp_path / "session.md").write_text(f"Blocks run {SESSION}.\n\n{closing}")
    with pytest.raises(RuntimeError, match="running event loop"):
        run(page)
    capfd.readouterr()


def test_fragments_are_rare_and_say_why() -> None:
    not_run = [(page, block) for page in PAGES for block in blocks(page) if block.not_run is not None]
    assert len(not_run) <= MOST_NOT_RUN, not_run
    assert all(block.not_run for _, block in not_run)


def test_every_snippet_file_is_shown_and_tested() -> None:
    snippets = sorted(p for p in (ROOT / "docs" / "snippets").glob("*.py") if p.name != "__init__.py")
    shown = {block.snippet for page in PAGES for block in blocks(page)}
    here = Path(__file__)
    tests = "".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py") if path != here)
    for snippet in snippets:
        name = str(snippet.relative_to(ROOT))
        assert name in shown, f"{name} is in no page"
        module = name.removesuffix(".py").replace("/", ".")
        assert name in tests or module in tests, f"no test runs {name} with what it needs"


def contract_points(docstring: str) -> list[tuple[str, str, str]]:
    """(number, title, text) of each numbered point of AsyncBatcher's docstring: ``N. **Title.** text``."""
    contract = docstring.split("Args:")[0]
    found = re.findall(r"^(\d+)\. \*\*(.+?)\.\*\*(.*?)(?=^\d+\. \*\*|\Z)", contract, re.MULTILINE | re.DOTALL)
    return [(number, title, " ".join(text.split())) for number, title, text in found]


def test_the_guarantees_page_states_the_docstrings_contract() -> None:
    # docs/guarantees.md has a section "## N. Title" per point of the docstring, in its order, and each section
    # names, before its example, every setting, method and exception its point names: a point changed in one
    # place fails here.
    points = contract_points(inspect.getdoc(AsyncBatcher) or "")
    assert points, "no numbered points found in the docstring"
    page = (ROOT / "docs" / "guarantees.md").read_text()
    sections = re.findall(r"^## (\d+)\. (.+?)\n(.*?)(?=^## |\Z)", page, re.MULTILINE | re.DOTALL)
    assert [(number, title.replace("`", "")) for number, title, _ in sections] == [(n, t) for n, t, _ in points]
    for (number, _, text), (_, _, section) in zip(points, sections, strict=True):
        statement = section.split("```")[0]  # the point's own words, not its example
        names = {
            literal or role.rsplit(".", 1)[-1] for literal, role in re.findall(r"``([^`]+)``|:\w+:`~?([^`]+)`", text)
        }
        missing = sorted(name for name in names if name not in statement)
        assert not missing, f"point {number} of the docstring names {missing}, docs/guarantees.md does not"


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


def test_the_site_is_where_the_readme_and_the_package_say() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(rf"^site_url: {re.escape(SITE)}$", config, re.MULTILINE)
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"] == SITE
    # No README link to a page's markdown source: on GitHub it shows snippets and the reference unrendered.
    assert "/blob/main/docs/" not in README.read_text()


# What a user is told to install: pip install commands in the pages, the examples' requirements files.
INSTALL_SOURCES = [
    README,
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file() and p.suffix in {".md", ".py", ".txt", ""}),
]
REPOSITORY = "git+https://github.com/hussein-awala/async-batcher"


def install_requirements(path: Path) -> list[str]:
    """The async-batcher requirements ``path`` tells its reader to install: each ``pip install`` argument naming the
    package (up to the end of the line or of its inline code), and, in a requirements file, each line naming it."""
    text = path.read_text()
    found = []
    for command in re.findall(r"pip install ([^`\n]+)", text):
        try:
            arguments = shlex.split(command, comments=True)
        except ValueError:  # (an unbalanced quote: prose after the command) the words up to it
            arguments = command.split()
        found += [a for a in arguments if re.match(r"async-batcher(\[|$|[ <>=!~@])", a)]
    if path.name.startswith("requirements") and path.suffix == ".txt":
        found += [line.strip() for line in text.splitlines() if re.match(r"async-batcher(\[|$|[ <>=!~@])", line)]
    return found


def test_the_install_lines_are_found() -> None:
    # (the finder, on the forms the pages use)
    page = "`pip install 'async-batcher[aws]>=1.0'` (aioboto3), or `pip install async-batcher`.\npip install .\n"
    assert re.findall(r"pip install ([^`\n]+)", page) == ["'async-batcher[aws]>=1.0'", "async-batcher", "."]
    assert install_requirements(README), "the README's install lines were not found"


@pytest.mark.parametrize("path", INSTALL_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_install_line_installs_this_version(path: Path) -> None:
    # In a fresh environment an unbounded requirement installs 0.2.2 from PyPI, which has another API (and lacks
    # the extras the guides name): every line carries the floor, or installs from the repository.
    for line in install_requirements(path):
        requirement = Requirement(line)
        if requirement.url is not None:
            assert requirement.url.startswith(REPOSITORY), f"{path}: {line!r} installs from elsewhere"
            continue
        specifier = requirement.specifier
        assert not specifier.contains("0.2.2", prereleases=True) and specifier.contains("1.0.0"), (
            f"{path}: {line!r} may install async-batcher 0.2.2: write 'async-batcher[...]>=1.0'"
        )


def test_the_readme_stays_true_once_published() -> None:
    # The README is the package's page on PyPI: nothing in it may say that the package is not there.
    text = " ".join(README.read_text().split())
    assert not re.search(r"not (yet )?on PyPI|not on PyPI yet|until (1\.0|it) is (published|on PyPI)", text), text


def settings_table(page: Path) -> list[str]:
    """The keywords of the page's table of settings (its rows whose first cell is a keyword), in order."""
    return re.findall(r"^\| `(\w+)` \|", page.read_text(), re.MULTILINE)


def test_the_subclassing_guides_table_has_every_keyword_once() -> None:
    # It lacked retry, on_batch_error and split_on, and listed max_queue_weight twice.
    deprecated = {"batch_size", "sleep_time", "buffering_time"}
    rows = settings_table(ROOT / "docs" / "guides" / "subclassing.md")
    assert sorted(rows) == sorted(OPTIONS - deprecated), set(rows) ^ (OPTIONS - deprecated)


# The packages Keras 3 runs on: one of them is installed beside it, or `import keras` fails.
KERAS_BACKENDS = {"tensorflow", "tensorflow-cpu", "jax", "torch"}


@pytest.mark.parametrize("page", [p for p in PAGES if "keras" in frameworks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_with_a_keras_block_says_how_to_install_keras_and_a_backend(page: Path) -> None:
    # The README's model-server block and the FastAPI guide's Keras block gave no install line, and the [keras]
    # extra installs numpy only: their reader had no Keras, then a Keras without a backend.
    commands = [command.split() for command in re.findall(r"pip install ([^`\n]+)", page.read_text())]
    assert any("keras" in words and KERAS_BACKENDS & set(words) for words in commands), commands


@pytest.mark.parametrize("page", [p for p in PAGES if is_session_page(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_session_pages_file_blocks_say_they_are_files_and_how_to_run_them(page: Path) -> None:
    # The reader pastes each block into the prompt; a snippet is a file (its own event loop, an app to serve, blank
    # lines in its classes): the prose before it names the file and the command that runs it.
    text = page.read_text()
    previous = 0
    for match in re.finditer(r"^```python[^\n]*\n(.*?)^```[ \t]*$", text, re.DOTALL | re.MULTILINE):
        snippet = re.match(r'--8<-- "([^"]+)"\s*$', match.group(1).strip())
        if snippet is not None:
            name = Path(snippet.group(1)).name
            prose = " ".join(text[previous : match.start()].split())
            assert f"`{name}`" in prose and re.search(rf"`(python {name}|uvicorn {name[:-3]}:\w+)`", prose), (
                f"{page.relative_to(ROOT)}: say before the block that {name} is a file, and how to run it"
            )
        previous = match.end()


HOOKS = ("batch_key", "item_weight", "dedup_key", "copy_result")


def test_a_hook_is_never_listed_among_keywords_as_if_it_were_one() -> None:
    # The README listed `dedup_key` with `max_queue_weight` and `refuse_late=True`, as a setting to pass: it is a hook
    # to override (or @batch's dedup=). Where a sentence names settings and a hook, it says the hook is one.
    for page in PAGES:
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for sentence in re.split(r"(?<=[.!?;:])\s+|\n\s*[-|]", prose):
            sentence = " ".join(sentence.split())
            keywords = [name for name in OPTIONS if re.search(rf"`{name}(=[^`]*)?`", sentence)]
            hooks = [hook for hook in HOOKS if f"`{hook}`" in sentence]
            if len(keywords) >= 2 and hooks:
                assert re.search(r"overrid|hook|@batch", sentence), f"{page.relative_to(ROOT)}: {sentence}"


def test_the_policies_guide_names_the_lane_type_the_package_exports() -> None:
    # It said "The package exports no type for the lane: annotate it Any", while async_batcher.policies exports
    # LaneView.
    import async_batcher.policies

    assert "LaneView" in async_batcher.policies.__all__
    text = " ".join((ROOT / "docs" / "guides" / "policies.md").read_text().split())
    assert "exports no type" not in text and "from async_batcher.policies import LaneView" in text
