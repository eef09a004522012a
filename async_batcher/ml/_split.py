"""The walk over a model's outputs that splits them into per-item results of the same structure: the rule numpy's
and torch's ``split_outputs`` share (what is several outputs, what is one batched value, how a list reads)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from async_batcher._checks import plural
from async_batcher.ml._naming import a_type

__all__ = ["Lists", "check_lists", "check_rows", "split_structure"]

#: How ``split`` reads a ``list`` in a model's outputs: as several outputs or as one element per item, whichever
#: fits and refused when both do (``"auto"``); always as several outputs (``"outputs"``, what a Keras model with
#: a list of outputs returns); always as one element per item (``"items"``).
Lists: TypeAlias = Literal["auto", "outputs", "items"]


def check_lists(lists: object) -> Lists:
    """``lists`` if it is ``"auto"``, ``"outputs"`` or ``"items"``; a ValueError naming it otherwise."""
    if lists == "auto" or lists == "outputs" or lists == "items":
        return lists
    raise ValueError(f"lists must be 'auto', 'outputs' or 'items', got {lists!r}")


def check_rows(shape: tuple[int, ...], size: int, padded_size: int | None, name: str) -> None:
    """Refuse an output of ``shape`` that does not hold one row per item (and per padding row)."""
    if not shape:
        raise ValueError(
            f"{name} is a scalar, not a batch of {plural(size, 'row')} (a value for the whole batch cannot be split"
            " per item)"
        )
    if padded_size is not None and shape[0] != padded_size:
        raise ValueError(
            f"{name} has {plural(shape[0], 'row')} for a batch of {plural(padded_size, 'row')} (shape {shape})"
        )
    if shape[0] < size:
        raise ValueError(f"{name} has {plural(shape[0], 'row')} for {plural(size, 'item')} (shape {shape})")


#: Python values that are never a batch of rows: a model output made of them is refused, not guessed at.
_SCALARS = (bool, int, float, complex, str, bytes)


def split_structure(
    outputs: Any,
    size: int,
    rows: Callable[[Any, str], Sequence[Any]],
    *,
    padded_size: int | None = None,
    lists: Lists = "auto",
) -> list[Any]:
    """Split ``outputs`` into ``size`` per-item results that keep its structure.

    The rule (the same for numpy and torch), from the outside in:

    * ``None``: ``None`` for every item (an optional output the model did not compute);
    * a dataclass instance (a transformers ``ModelOutput``), a ``Mapping``, a ``tuple`` or a namedtuple:
      several outputs, by name or position, each split in turn; item ``i`` gets the same structure (a dataclass
      rebuilt with ``dataclasses.replace``, a mapping as a plain ``dict``, a tuple or namedtuple of its type);
    * a ``list``: see ``lists`` (:data:`Lists`);
    * a bool, number, string or bytes: refused, a value for the whole batch cannot be split per item;
    * anything else is one batched value: ``rows(value, path)`` checks it and gives its first ``size`` rows.

    Errors name the value by its path in ``outputs``: ``past_key_values[0][1]``.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    lists = check_lists(lists)
    return _Splitter(size, rows, padded_size, lists).split(outputs, "the output")


def _child(path: str, key: Any, *, attribute: bool = False) -> str:
    if path == "the output":
        if isinstance(key, str):
            return key
        return f"output[{key!r}]"
    if attribute:
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


class _CyclicOutputError(ValueError):
    """An output that holds itself (raised as it is, without a hint about lists)."""


@dataclasses.dataclass
class _Splitter:
    """One walk over a model's outputs (see :func:`split_structure`)."""

    size: int
    rows: Callable[[Any, str], Sequence[Any]]
    padded_size: int | None
    lists: Lists
    #: The ids of the containers being walked: one met again inside itself is a cycle, refused (it would recurse
    #: until Python's recursion limit).
    active: set[int] = dataclasses.field(default_factory=set)

    def split(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return [None] * self.size
        if isinstance(value, _SCALARS):
            raise TypeError(
                f"{path} is {a_type(value)} ({_short(value)}), not a batch of {plural(self.size, 'row')}: a value for"
                " the whole batch cannot be split per item"
            )
        container = isinstance(value, Mapping | list | tuple) or (
            dataclasses.is_dataclass(value) and not isinstance(value, type)
        )
        if not container:
            return list(self.rows(value, path))
        if id(value) in self.active:
            raise _CyclicOutputError(f"{path} holds itself: a cyclic output cannot be split")
        self.active.add(id(value))
        try:
            return self._split_container(value, path)
        finally:
            self.active.discard(id(value))

    def _split_container(self, value: Any, path: str) -> list[Any]:
        size = self.size
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            names = [f.name for f in dataclasses.fields(value) if f.init]
            fields = {name: self.split(getattr(value, name), _child(path, name, attribute=True)) for name in names}
            try:
                return [dataclasses.replace(value, **{n: f[i] for n, f in fields.items()}) for i in range(size)]
            except (TypeError, ValueError) as error:
                raise TypeError(f"{path}: cannot rebuild {a_type(value)} per item: {error}") from None
        if isinstance(value, Mapping):
            columns = {key: self.split(part, _child(path, key)) for key, part in value.items()}
            return [{key: column[i] for key, column in columns.items()} for i in range(size)]
        if isinstance(value, tuple):
            if hasattr(value, "_fields"):  # a namedtuple: its fields by name, and it takes them as arguments
                pairs = zip(value._fields, value, strict=True)
                named = [self.split(part, _child(path, name, attribute=True)) for name, part in pairs]
                return [type(value)(*(part[i] for part in named)) for i in range(size)]
            parts = [self.split(part, _child(path, n)) for n, part in enumerate(value)]
            return [type(value)(part[i] for part in parts) for i in range(size)]
        return self._split_list(value, path)

    def _split_list(self, value: list[Any], path: str) -> list[Any]:
        """A list as several outputs, or as one element per item (see :data:`Lists`); refused when ambiguous."""
        size, lists = self.size, self.lists
        per_item: ValueError | None = None
        try:
            check_rows((len(value),), size, self.padded_size, f"{path} (a list read as one element per item)")
        except ValueError as error:
            per_item = error
        if lists == "items" or (lists == "auto" and _plain(value, set())):
            if per_item is not None:
                raise per_item
            return value[:size]
        try:
            several = [self.split(part, _child(path, n)) for n, part in enumerate(value)]
        except (TypeError, ValueError) as error:
            if lists == "outputs" or per_item is not None or isinstance(error, _CyclicOutputError):
                raise
            raise type(error)(
                f"{error} ({path}, a list that holds arrays, was read as several outputs: pass lists='items' if"
                " it holds one result per item)"
            ) from None
        if lists == "auto" and per_item is None:
            raise ValueError(
                f"{path} is ambiguous: a list of {plural(len(value), 'element')} that hold arrays"
                f" ({_shapes(value)}), as many as the batch has rows, and each splits into {plural(size, 'row')}: it"
                f" reads as {plural(len(value), 'output')}"
                " and as one result per item. Return a tuple or a dict for several outputs or one stacked array"
                " for one row per item, or say which with lists='outputs' or lists='items'"
            )
        return [[part[i] for part in several] for i in range(size)]


def _plain(value: Any, active: set[int]) -> bool:
    """Whether ``value`` holds no array that could be split: only ``None``, Python and numpy scalars, 0-d
    arrays, and lists, tuples, mappings and dataclasses of them. (A cycle is not plain: the walk refuses it.)"""
    if value is None or isinstance(value, _SCALARS) or getattr(value, "ndim", None) == 0:
        return True
    if isinstance(value, list | tuple):
        parts: Any = value
    elif isinstance(value, Mapping):
        parts = value.values()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = [getattr(value, f.name) for f in dataclasses.fields(value)]
    else:
        return False
    if id(value) in active:
        return False
    active.add(id(value))
    try:
        return all(_plain(part, active) for part in parts)
    finally:
        active.discard(id(value))


def _shapes(values: list[Any]) -> str:
    """The shapes of a list's elements, for an error message: ``shapes (2, 2), (2, 2)``."""
    shown = [
        f"shape {tuple(shape)}" if (shape := getattr(v, "shape", None)) is not None else type(v).__name__
        for v in values[:4]
    ]
    return ", ".join(shown) + (", ..." if len(values) > 4 else "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
