"""How the collate helpers' errors name a value: its type with its article (``an int``), and which values of the
items it is (``items``, ``feature 'ids'``), so that numpy's and torch's helpers word them alike."""

from __future__ import annotations

from typing import Any

__all__ = ["a_type", "describe"]


def a_type(value: Any) -> str:
    """``a float``, ``an int``: the type of ``value`` with its article, for error messages."""
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def describe(key: Any) -> str:
    """How error messages name the values of one feature: ``items``, or ``feature 'ids'``."""
    return "items" if key is None else f"feature {key!r}"
