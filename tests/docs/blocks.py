"""Run the ```python blocks of a markdown page where the page says to run them.

``python -m tests.docs.blocks RESULTS PAGE.md...`` runs the pages one after another in one interpreter, and writes
one line of JSON per page to the file RESULTS: how many blocks ran, or the error. tests/docs/test_pages.py runs the
pages that need nothing beyond the fast tier so, and tests/docs/frameworks/ those that import TensorFlow, PyTorch or
scikit-learn (:func:`frameworks`). A page is one of two kinds, and says which to its reader:

- **A session page** says, before its first block, that its blocks run "in one `python -m asyncio` session" (the
  sentence of :data:`SESSION`). Its blocks are lines typed (or pasted) one after another into ``python -m asyncio``:
  ``await`` works at the top level, a block may use what an earlier block of the page defined, ``asyncio`` is
  already imported, and code runs while the REPL's event loop runs (``asyncio.run()`` fails there). They are fed
  line by line to :class:`Session`, the line handling of the REPL that ``python -m asyncio`` runs on Python 3.11
  and 3.12 (``code.InteractiveConsole``, with ``await`` allowed), followed by an empty line as a user would type:
  a blank line inside a class or function ends it there, as it does at that prompt, and a compound statement
  needs an empty line before the next top-level statement.
- **Any other page** holds scripts: each block runs alone, as ``python block.py`` runs it in an empty folder, with
  nothing from the page's other blocks (a missing import fails it; top-level ``await`` is a ``SyntaxError``).

In both, a block that is only ``--8<-- "docs/snippets/<name>.py"`` (pymdownx.snippets) is a script whose
``if __name__ == "__main__":`` part needs a server or data: here its definitions run (it is imported, under another
name), and the snippet's own test runs it whole with what it needs. A block right after a line
``<!-- not-run: <reason> -->`` is a fragment and is not run (keep these rare: tests/docs/test_pages.py counts them).
"""

from __future__ import annotations

import ast
import asyncio
import code
import inspect
import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The pages whose blocks the tests run: the README (PyPI's page too) and the documentation site's.
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
# Where .github/workflows/docs.yml publishes the site (GitHub Pages).
SITE = "https://hussein-awala.github.io/async-batcher/"
SESSION = "in one `python -m asyncio` session"
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$')
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->\s*$")
# The frameworks of the full tier (make test-all) that a page's blocks may import: such a page runs there.
FRAMEWORKS = frozenset({"keras", "sklearn", "tensorflow", "torch"})


@dataclass(frozen=True)
class Block:
    """One ```python block: where it starts, its code (a snippet resolved), and why it is not run (if it is not)."""

    line: int
    code: str
    not_run: str | None = None
    snippet: str | None = None


def blocks(page: Path) -> list[Block]:
    """The ```python blocks of ``page``, in order."""
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = m.group(1) if (m := _NOT_RUN.search(before)) else None
        code = match.group(1)
        snippet = m.group(1) if (m := _SNIPPET.match(code.strip())) else None
        if snippet is not None:
            code = (ROOT / snippet).read_text()
        found.append(Block(line=line, code=code, not_run=reason, snippet=snippet))
    return found


def frameworks(page: Path) -> frozenset[str]:
    """The :data:`FRAMEWORKS` the page's blocks import (each block that is run, snippets resolved)."""
    found = set()
    for block in blocks(page):
        if block.not_run is not None:
            continue
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return frozenset(found & FRAMEWORKS)


def is_session_page(page: Path) -> bool:
    """Whether the page says its blocks run in one ``python -m asyncio`` session (see the module's docstring)."""
    return SESSION in " ".join(page.read_text().split())


def session_sentence_before_first_block(page: Path) -> bool:
    """Whether a session page says so before its first block, where a reader sees it in time."""
    text = page.read_text()
    first = _FENCE.search(text)
    return first is not None and SESSION in " ".join(text[: first.start()].split())


class Session(code.InteractiveConsole):
    """The prompt of ``python -m asyncio`` (Python 3.11, 3.12: ``asyncio.__main__.AsyncIOInteractiveConsole`` is
    this class with ``await`` allowed, running each statement on the REPL's loop), which raises what the prompt
    would print."""

    def __init__(self, loop: asyncio.AbstractEventLoop, filename: str) -> None:
        # What python -m asyncio puts in its namespace: asyncio, and __name__ == "__main__".
        super().__init__({"__name__": "__main__", "__builtins__": __builtins__, "asyncio": asyncio}, filename)
        self.compile.compiler.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        self.loop = loop

    def runcode(self, code: types.CodeType) -> None:
        function = types.FunctionType(code, self.locals)

        async def statement() -> None:  # run while the loop runs, as the REPL runs it
            result = function()
            if inspect.iscoroutine(result):
                await result

        self.loop.run_until_complete(statement())

    def showsyntaxerror(self, filename: str | None = None, **kwargs: object) -> None:
        # Called inside the REPL's `except SyntaxError:`: the page's error, raised rather than printed.
        raise

    def showtraceback(self) -> None:
        raise


def run_session(page: Path) -> int:
    """Type the page's blocks into one :class:`Session`; return how many ran."""
    loop = asyncio.new_event_loop()
    console = Session(loop, str(page))
    ran = 0
    try:
        for block in blocks(page):
            if block.not_run is not None:
                continue
            console.filename = f"{page}:{block.line}"
            if block.snippet is not None:
                run_snippet_definitions(block.snippet)
            else:
                for line in [*block.code.rstrip("\n").split("\n"), ""]:
                    console.push(line)
                if console.buffer:
                    raise SyntaxError(f"{page}:{block.line}: the block ends inside a statement")
            ran += 1
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return ran


def run_snippet_definitions(snippet: str) -> None:
    """Run a snippet's definitions (all but its ``__main__`` part, which its own test runs)."""
    runpy.run_path(str(ROOT / snippet), run_name="__docs__")


def run_scripts(page: Path) -> int:
    """Run each block of the page alone, as ``python block.py`` runs it; return how many ran.

    Each block is its own ``__main__`` module, compiled as a file is (top-level ``await`` is a ``SyntaxError``), with
    nothing of the page's other blocks, in an empty folder of its own. The page's blocks share this process: what
    an import loads once (torch, TensorFlow) is not loaded again, which a block cannot tell from a new process.
    """
    ran = 0
    for block in blocks(page):
        if block.not_run is not None:
            continue
        if block.snippet is not None:
            run_snippet_definitions(block.snippet)
        else:
            run_script(block.code, f"{page}:{block.line}")
        ran += 1
    return ran


def run_script(source: str, where: str) -> None:
    """Run ``source`` as the script ``block.py`` of an empty folder; its errors propagate, naming ``where``."""
    code = compile(source, where, "exec")
    main, cwd = sys.modules["__main__"], os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        module = types.ModuleType("__main__")
        module.__file__ = str(Path(folder) / "block.py")
        sys.modules["__main__"] = module
        os.chdir(folder)
        try:
            exec(code, module.__dict__)
        finally:
            sys.modules["__main__"] = main
            os.chdir(cwd)


def run(page: Path) -> int:
    """Run the page's blocks where it says to; return how many ran. An error names the page and line."""
    return run_session(page) if is_session_page(page) else run_scripts(page)


def run_in_one_interpreter(pages: list[Path], results: Path) -> dict[Path, dict[str, object]]:
    """Run the pages in one new interpreter (``python -m tests.docs.blocks``); each page's outcome, as
    :func:`run_pages` writes it, or, for a page the interpreter never reached, what it printed."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "tests.docs.blocks", str(results), *map(str, pages)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    outcomes = {
        Path(o["page"]): o for o in map(json.loads, results.read_text().splitlines() if results.exists() else [])
    }
    missing = {"error": f"not run (exit status {done.returncode}):\n{done.stdout}{done.stderr}"}
    return {page: outcomes.get(page, missing) for page in pages}


def check_ran(page: Path, outcome: dict[str, object]) -> None:
    """Fail unless ``outcome`` (of :func:`run_in_one_interpreter`) says that every block of ``page`` to run ran."""
    assert "error" not in outcome, outcome["error"]
    assert outcome["ran"] == sum(1 for block in blocks(page) if block.not_run is None), outcome


def run_pages(results: Path, pages: list[Path]) -> None:
    """Run each page, one after another in this interpreter; write a line of JSON per page to ``results``:
    ``{"page", "ran"}``, or ``{"page", "error"}`` with the traceback (the next page runs all the same)."""
    with results.open("w") as out:
        for page in pages:
            try:
                outcome: dict[str, object] = {"ran": run(page)}
            except (Exception, SystemExit):
                outcome = {"error": traceback.format_exc()}
            out.write(json.dumps({"page": str(page), **outcome}) + "\n")
            out.flush()


if __name__ == "__main__":
    run_pages(Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:]])
