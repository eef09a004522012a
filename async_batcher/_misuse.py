"""What ``@batch`` says when the function it decorates does not work on a batch (private): most often, a function
written for one item (``async def f(x: int) -> int``), which ``@batch`` calls with the list of the items.

The error names the function and says what ``@batch`` calls it with and expects back, instead of the core's
words about a ``process_batch`` the user never wrote.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from async_batcher._checks import plural
from async_batcher._sinks import as_results
from async_batcher.exceptions import BatchSizeMismatchError

__all__: list[str] = []

_EXPECTED = (
    ": a @batch function is called with the list of the items in the batch and must return a list with one result"
    " per item, in order"
)
# Annotations of the batch parameter that say "one item": the batch is always a list.
_SINGLE = frozenset({"int", "float", "str", "bytes", "bool", "dict"})


def checked(func: Callable[..., Any], results: Any, n: int, *, method: bool) -> Any:
    """``results`` of ``func`` for a batch of ``n``, as one result per item; else the core's error (a
    :class:`~async_batcher.BatchSizeMismatchError` or a ``TypeError``), worded about ``func``."""
    try:
        return as_results(results, n)
    except (BatchSizeMismatchError, TypeError) as exc:
        # The core's words: "process_batch returned 2 results for a batch of 1 items", "process_batch returned
        # dict; expected ...".
        what = str(exc).removeprefix("process_batch ").split(";")[0]
        if " for a batch of " not in what:
            what += f" for a batch of {plural(n, 'item')}"
        exc.args = (f"@batch function {_name(func)!r} {what}{_EXPECTED}{_hint(func, method=method)}",)
        raise


def note(func: Callable[..., Any], exc: BaseException, *, method: bool) -> None:
    """``func`` raised ``exc`` on the list it was given: if it looks written for one item, a note says so."""
    hint = _hint(func, method=method)
    if hint and isinstance(exc, TypeError | AttributeError):
        exc.add_note(f"@batch calls {_name(func)!r} with the list of the items in the batch{hint}")


def _hint(func: Callable[..., Any], *, method: bool) -> str:
    """Why ``func`` may have been written for one item: its batch parameter is annotated as a single value."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return ""
    if len(parameters) <= int(method):
        return ""
    batch = parameters[int(method)]
    annotation = batch.annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if name not in _SINGLE:
        return ""
    return f" ({_name(func)!r} takes {batch.name}: {name}, one item: make it take list[{name}])"


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)
