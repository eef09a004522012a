"""MkDocs hooks (mkdocs.yml ``hooks:``): the docstrings' reStructuredText roles read as plain code on the site.

The docstrings are written for ``help()`` and editors, with roles such as ``:class:`~async_batcher.AsyncBatcher```
and ``:meth:`process```: mkdocstrings renders the backquoted part as code and leaves the role's name before it.
This drops the role, and a ``~`` prefix's module path as Sphinx would (``~a.b.C`` shows ``C``); and the markers
of literal blocks (``::`` alone, a paragraph's closing ``::``, ``.. code-block:: python``), whose indented code
Markdown already shows as code.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:\w+\.)*")
_LITERAL_MARKER = re.compile(r"<p>(?:::|\.\. code-block::[ \w]*)</p>\s*")
_CLOSING_MARKER = re.compile(r"::</p>")


def on_page_content(html: str, **kwargs: Any) -> str:
    html = _TILDE.sub("<code>", _ROLE.sub("", html))
    return _CLOSING_MARKER.sub(":</p>", _LITERAL_MARKER.sub("", html))
