"""docs/guides/torch.md: every python block runs as written, and prints what its comments say it prints."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.requires import require

require("torch", "make test-all installs its CPU build (mk/torch.mk)")

GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "torch.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), flags=re.DOTALL | re.MULTILINE)


def test_the_guide_has_its_examples() -> None:
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("source", BLOCKS, ids=[f"block{n}" for n in range(len(BLOCKS))])
def test_block_runs_and_prints_what_it_says(source: str) -> None:
    # The comment after a print(...) is what it prints, whitespace aside (tensors print over several lines).
    expected = [m.group(1) for m in re.finditer(r"^\s*print\(.*?\)(?:\s+#\s*(.*))?$", source, flags=re.MULTILINE)]
    printed: list[str] = []

    def record(*args: Any) -> None:
        printed.append(" ".join(map(str, args)))

    exec(compile(source, str(GUIDE), "exec"), {"__name__": "__guide__", "print": record})
    assert len(printed) == len(expected)
    for said, got in zip(expected, printed, strict=True):
        if said is not None:
            assert re.sub(r"\s+", "", got) == re.sub(r"\s+", "", said)
