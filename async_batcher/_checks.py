"""Checks of the values a user passes: settings and call arguments (private).

Each check returns the value it accepts, converted (numpy's integers and floats are numbers too), or raises
``ValueError`` (a value out of range) or ``TypeError`` (a value of the wrong kind) naming the value.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import difflib
import math
import numbers
import operator
import os
import sys
import warnings
from collections.abc import Collection, Iterable
from typing import TypeGuard

__all__: list[str] = []


def is_real(value: object) -> TypeGuard[float]:
    """A real number (numpy's too), not a bool: True is an int, but never a meaningful count or time."""
    if value.__class__ is int or value.__class__ is float:
        return True  # the common case, without the ABC's isinstance (half a microsecond a check, on every call)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite(value: float) -> bool:
    """``math.isfinite``, False for an int too large for a float (which it refuses with ``OverflowError``)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def seconds(name: str, value: object, *, positive: bool = False) -> float:
    """A finite number of seconds, >= 0 (> 0 when ``positive``)."""
    if not is_real(value) or not is_finite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def count(name: str, value: object, *, zero_means_unlimited: bool = False, unlimited: bool = True) -> int:
    """An integer (numpy's too) >= 1, or -1 (an old spelling of no limit; or 0 too, where ``zero_means_unlimited``:
    callers take ``None`` for it before calling this); with
    ``unlimited=False``, >= 1 only (a size, a bound), and the message offers nothing else."""
    number = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    if not unlimited:
        if number is None or number < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")
        return number
    if number is None or not (number >= 1 or number == -1 or (zero_means_unlimited and number == 0)):
        raise ValueError(f"{name} must be an int >= 1, or None for no limit; got {value!r}")
    return number


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def deprecated(message: str) -> None:
    """A ``DeprecationWarning`` attributed to the user's line: the first frame outside this package (and the
    dataclasses' code that builds a settings value)."""
    level = 2  # (1: this function; 2: its caller)
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith((_PACKAGE, "<")) or frame.f_code.co_filename == dataclasses.__file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def timeout(value: object) -> float | None:
    """A ``timeout=``: ``None``, or a finite number of seconds >= 0."""
    return None if value is None else seconds("timeout", value)


def priority(value: object) -> float:
    """A ``priority=``: any real number but NaN (lower goes first)."""
    if not is_real(value) or value != value:  # (NaN; not math.isnan, which refuses an int too large for a float)
        raise ValueError(f"priority must be a real number (lower goes first), got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    """True or False, nothing else: a string such as "no" is not a flag."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def executor(value: object) -> concurrent.futures.Executor | None:
    """Where a plain ``def process_batch`` runs: a :class:`concurrent.futures.Executor`, or ``None``."""
    if value is not None and not isinstance(value, concurrent.futures.Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor or None, got {value!r}")
    return value


def name(value: object, default: str) -> str:
    """A batcher's name: a str, or ``None`` for ``default``."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise TypeError(f"name must be a str or None, got {value!r}")
    return value


def unexpected_keywords(given: Iterable[str], valid: Collection[str], where: str) -> TypeError:
    """The error for the keyword arguments of ``given`` that are not in ``valid``, as Python words it, naming
    ``where`` they were given (``"@batch()"``) and, for each, the closest valid one; with none close, the valid ones.

    Raises:
        ValueError: ``given`` holds no unexpected keyword (a bug of the caller).
    """
    given = list(given)
    unexpected = [keyword for keyword in given if keyword not in valid]
    if not unexpected:
        raise ValueError(f"no unexpected keyword in {given!r}")
    meant = {keyword: difflib.get_close_matches(keyword, valid, n=1) for keyword in unexpected}
    listed = ", ".join(sorted(valid))
    if len(unexpected) == 1:
        (keyword,) = unexpected
        hint = f"did you mean {meant[keyword][0]!r}?" if meant[keyword] else f"valid: {listed}"
        return TypeError(f"{where} got an unexpected keyword argument {keyword!r}; {hint}")
    keywords = ", ".join(f"{k!r} (did you mean {meant[k][0]!r}?)" if meant[k] else repr(k) for k in unexpected)
    if not all(meant.values()):
        keywords += f"; valid: {listed}"
    return TypeError(f"{where} got unexpected keyword arguments {keywords}")


def plural(n: float, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``plural(1, "item")`` is ``"1 item"``, ``plural(3,
    "batch", "batches")`` ``"3 batches"`` (``nouns``: the plural, when it is not ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
