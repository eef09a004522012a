"""A Griffe extension (mkdocs.yml, mkdocstrings' ``extensions:``): the API reference as a user reads it.

The docstrings are written for ``help()`` and editors; on the site:

- a reStructuredText literal block (a paragraph ending in ``::``, or ``.. code-block:: python``, then indented
  code) becomes a fenced Python block, so that it is highlighted like the guides' code;
- a class's bases leave out the package's private classes (``async_batcher._settings.Settings``): a user can
  neither import nor subclass them; but the methods of those in ``SHOWN_AS_OWN`` are shown as the class's own, after
  its own (``AsyncBatcher``'s calls for sync code, written in ``async_batcher._sync``);
- ``AsyncBatcher``'s numbered contract, the rules before its parameters in ``help()``, is one line linking to
  the guarantees page, which states each rule with an example (tests/docs/test_pages.py checks that the two agree);
- an attribute documented by ``#:`` comments right above it (Sphinx's convention, which the package's modules
  use for their constants: ``END``, ``PadValue``) gets them as its docstring.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

__all__ = ["ReferencePages"]

_LITERAL = re.compile(
    r"(?P<lead>^[^\n]*?)(?P<marker>::|\.\. code-block::[ \w]*)\n\n(?P<code>(?:(?:[ \t]+[^\n]*)?\n)+?)(?=\S|\Z)",
    re.MULTILINE,
)
_CONTRACT = re.compile(r"The contract:\n\n1\. .*?(?=\n\n[A-Z]\w*:\n|\Z)", re.DOTALL)
CONTRACT_LINK = "Its contract, {n} rules each tested, is on [the guarantees page][guarantees]."
_RULE = re.compile(r"^\d+\. ", re.MULTILINE)
# Private bases whose public methods are the class's own to a user (written apart for the size of the class's
# module): shown after the class's own methods.
SHOWN_AS_OWN = frozenset({"async_batcher._sync.BlockingCalls"})


def fence_literal_blocks(text: str) -> str:
    """reStructuredText literal blocks of ``text`` as fenced Python blocks."""

    def fence(match: re.Match[str]) -> str:
        lead = match.group("lead").rstrip()
        if lead:  # "so that::" reads "so that:"; a marker alone on its line disappears
            lead = lead + ":" if match.group("marker") == "::" else lead
        code = textwrap.dedent(match.group("code")).strip("\n")
        return f"{lead}\n\n```python\n{code}\n```\n\n" if lead else f"```python\n{code}\n```\n\n"

    return _LITERAL.sub(fence, text)


def is_private(path: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in path.split("."))


def comment_docstring(attribute: griffe.Attribute) -> str | None:
    """The ``#:`` comment lines right above ``attribute``'s assignment, as a docstring; ``None`` if there are none."""
    lines = attribute.module.lines  # (the module's file, which lineno counts in)
    if not lines or attribute.lineno is None:
        return None
    found: list[str] = []
    at = attribute.lineno - 2  # (the line above it, counted from 0)
    while at >= 0 and lines[at].lstrip().startswith("#:"):
        found.append(lines[at].lstrip()[2:].strip())
        at -= 1
    return "\n".join(reversed(found)) or None


class ReferencePages(griffe.Extension):
    """See the module's docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None and isinstance(obj, griffe.Attribute) and (text := comment_docstring(obj)):
            parser = obj.module.docstring.parser if obj.module.docstring is not None else None
            obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj, parser=parser)
        if obj.docstring is not None:
            text = fence_literal_blocks(obj.docstring.value)
            if obj.path == "async_batcher.batcher.AsyncBatcher":
                text = _CONTRACT.sub(lambda m: CONTRACT_LINK.format(n=len(_RULE.findall(m.group()))), text)
            obj.docstring.value = text

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        # (Once the whole package is loaded, so that a private base in another module is there to read.)
        for cls in classes(pkg):
            for base in cls.resolved_bases:
                if base.path in SHOWN_AS_OWN:
                    for name, member in base.members.items():
                        if member.kind is griffe.Kind.FUNCTION and not name.startswith("_") and name not in cls.members:
                            cls.set_member(name, griffe.Alias(name, member, parent=cls, inherited=True))
            cls.bases = [base for base in cls.bases if not is_private(str(getattr(base, "canonical_path", base)))]


def classes(obj: griffe.Object) -> list[griffe.Class]:
    """The classes defined in ``obj`` (a module, a class), at any depth."""
    found: list[griffe.Class] = []
    for member in obj.members.values():
        if not member.is_alias and isinstance(member, (griffe.Module, griffe.Class)):
            if isinstance(member, griffe.Class):
                found.append(member)
            found.extend(classes(member))
    return found
