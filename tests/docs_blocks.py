"""Run the ```python blocks of a markdown page, in order, as one session of ``python -m asyncio``.

``python -m tests.docs_blocks PAGE.md`` (what tests/test_docs.py runs, one process per page). The conventions,
which the guides state for readers too:

- the blocks of a page share one namespace, in page order, as lines typed into one ``python -m asyncio`` session:
  ``await`` works at the top level, and a block may use what an earlier block of the page defined;
- a block that is only ``--8<-- "docs/snippets/<name>.py"`` (pymdownx.snippets) runs that file's code: the
  snippet's own test runs it again with the server or data it needs;
- a block right after a line ``<!-- not-run: <reason> -->`` is a fragment and is not run (keep these rare:
  tests/test_docs.py counts them).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$')
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->\s*$")


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


def run(page: Path) -> int:
    """Run the page's blocks; return how many ran. An exception propagates, naming the page and line."""
    # A module of its own (not __main__: a snippet's `if __name__ == "__main__":` part is for its own test), in
    # sys.modules so that what needs its module, a dataclass say, finds it.
    module = types.ModuleType("__docs__")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    loop = asyncio.new_event_loop()
    ran = 0
    try:
        for block in blocks(page):
            if block.not_run is not None:
                continue
            code = compile(block.code, f"{page}:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            if code.co_flags & inspect.CO_COROUTINE:
                loop.run_until_complete(eval(code, namespace))
            else:
                exec(code, namespace)
            ran += 1
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return ran


if __name__ == "__main__":
    print(f"{run(Path(sys.argv[1]))} blocks ran")
