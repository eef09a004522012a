"""The framework-free part of the collate helpers (``ml.numpy``, ``ml.torch``): argument checks, bucket sizes,
the choice of the items that go into a batch, shape checks, and the walk over a model's outputs that splits them
per item.

Each helper raises the error a user sees, naming the bad value, so both frameworks word them alike.
"""

from __future__ import annotations

import cmath
import dataclasses
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias

#: A pad value for every feature, or one per feature name (dict inputs); features not named get 0.
PadValue: TypeAlias = "int | float | bool | Mapping[str, int | float | bool]"
#: Where padding goes: after each sequence (``"right"``, for encoders) or before it (``"left"``, for
#: decoder-only models, which read their next token off the last position).
PaddingSide: TypeAlias = Literal["right", "left"]
#: What ``collate`` does with an item that does not stack with the rest of its batch: refuse the batch
#: (``"raise"``), or leave the item out and give its caller the error (``"exclude"``).
OddItems: TypeAlias = Literal["raise", "exclude"]
#: How ``split`` reads a ``list`` in a model's outputs: as several outputs or as one element per item, whichever
#: fits and refused when both do (``"auto"``); always as several outputs (``"outputs"``, what a Keras model with
#: a list of outputs returns); always as one element per item (``"items"``).
Lists: TypeAlias = Literal["auto", "outputs", "items"]


def check_buckets(buckets: Collection[int]) -> tuple[int, ...]:
    """``buckets`` sorted, after checking that they are a non-empty collection of positive ints."""
    if not buckets or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in buckets):
        raise ValueError(f"buckets must be positive ints, got {buckets!r}")
    return tuple(sorted(buckets))


def bucket_size(size: int, buckets: Collection[int] | None) -> int:
    """The rows of a batch of ``size`` items: ``size``, or the smallest bucket that holds it (0 for no item)."""
    if buckets is None or size == 0:
        return size
    fitting = [b for b in check_buckets(buckets) if b >= size]
    if not fitting:
        raise ValueError(f"a batch of {size} items is larger than the largest bucket size {max(buckets)}")
    return min(fitting)


def check_bucketed_batch_size(buckets: Collection[int] | None, max_batch_size: int) -> tuple[int, ...] | None:
    """A batcher's ``buckets`` sorted, after checking that its ``max_batch_size`` is set and fits the largest."""
    if buckets is None:
        return None
    checked = check_buckets(buckets)
    if max_batch_size < 1 or max_batch_size > checked[-1]:
        raise ValueError(
            f"with buckets {checked} max_batch_size must be set and fit in the largest bucket, got {max_batch_size}"
        )
    return checked


def check_padding_side(padding_side: object) -> PaddingSide:
    """``padding_side`` if it is ``"right"`` or ``"left"``; a ValueError naming it otherwise."""
    if padding_side == "right" or padding_side == "left":
        return padding_side
    raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")


def check_odd_items(odd_items: object) -> OddItems:
    """``odd_items`` if it is ``"raise"`` or ``"exclude"``; a ValueError naming it otherwise."""
    if odd_items == "raise" or odd_items == "exclude":
        return odd_items
    raise ValueError(f"odd_items must be 'raise' or 'exclude', got {odd_items!r}")


def check_lists(lists: object) -> Lists:
    """``lists`` if it is ``"auto"``, ``"outputs"`` or ``"items"``; a ValueError naming it otherwise."""
    if lists == "auto" or lists == "outputs" or lists == "items":
        return lists
    raise ValueError(f"lists must be 'auto', 'outputs' or 'items', got {lists!r}")


def check_items(items: Sequence[Any]) -> list[Any]:
    """``items`` as a list, refusing an empty batch."""
    items = list(items)
    if not items:
        raise ValueError("cannot collate an empty batch")
    return items


def check_array_pad_value(pad_value: PadValue) -> int | float | bool:
    """The pad value of items that are not dicts: a mapping of feature names makes no sense for them."""
    if isinstance(pad_value, Mapping):
        raise TypeError("a pad_value mapping names features of dict items; these items are not dicts")
    return pad_value


def check_pad_value_names(pad_value: PadValue, names: Collection[Any]) -> None:
    """Refuse a ``pad_value`` mapping that names a feature the items do not have (a misspelt name would pad
    with 0 silently)."""
    if isinstance(pad_value, Mapping) and (unknown := set(pad_value) - set(names)):
        raise ValueError(f"pad_value names features the items do not have: {sorted(map(str, unknown))}")


def pad_value_for(pad_value: PadValue, key: str) -> int | float | bool:
    """The pad value of feature ``key``."""
    if isinstance(pad_value, Mapping):
        return pad_value.get(key, 0)
    return pad_value


def a_type(value: Any) -> str:
    """``a float``, ``an int``: the type of ``value`` with its article, for error messages."""
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def describe(key: Any) -> str:
    """How error messages name the values of one feature: ``items``, or ``feature 'ids'``."""
    return "items" if key is None else f"feature {key!r}"


class Signature(NamedTuple):
    """What one value of an item shares with the rest of its batch to be stacked with it.

    ``shape``: its shape, the first axis ``None`` with ``pad_sequences`` (where only that axis may differ).
    ``dtype`` and ``device``: compared when not ``None``; ``dtype`` is whatever the framework compares (torch
    compares dtypes, numpy only whether the values are numbers or strings, as it promotes the rest).
    """

    shape: tuple[int | None, ...]
    dtype: Hashable = None
    device: Hashable = None


#: Turn one value of an item into the framework's array: ``(array, its signature, its shape)``; raise a
#: TypeError or ValueError (naming the item: ``convert(value, key, index)``) when it cannot be one.
Convert: TypeAlias = Callable[[Any, Any, int], "tuple[Any, Signature, tuple[int, ...]]"]


@dataclasses.dataclass(frozen=True)
class Selection:
    """The items of a batch that stack together, and the errors of those that do not.

    ``kept``: the indices, in ``items``, of the items that go into the batch, in order. ``values``: the kept
    items converted (array items); ``columns``: per feature name, in the first kept item's order, the kept
    items' values converted (dict items; empty for array items). ``left_out``: index -> error, for the others.
    """

    kept: list[int]
    values: list[Any]
    columns: dict[Any, list[Any]]
    left_out: dict[int, Exception]

    @property
    def dicts(self) -> bool:
        """Whether the batch is of dict items."""
        return bool(self.columns)


def uniform(items: list[Any], column: Callable[[list[Any]], list[Any] | None]) -> Selection | None:
    """The common case, checked without :func:`select`'s bookkeeping (which costs as much as the stack): every
    item an array, or every item a mapping with the same features, each of whose columns ``column`` takes
    (converted, all of one signature) or refuses with None. None when an item is odd, for ``select`` to find it
    and name it."""
    everything = list(range(len(items)))
    if not isinstance(items[0], Mapping):
        values = column(items)
        return None if values is None else Selection(everything, values, {}, {})
    names = items[0].keys()
    if not all(isinstance(item, Mapping) and item.keys() == names for item in items):
        return None
    columns = {}
    for name in names:
        values = column([item[name] for item in items])
        if values is None:
            return None
        columns[name] = values
    return Selection(everything, [], columns, {})


# An item's signature: an array item's, or ("dict", the features' names and signatures) for a dict item.
_ItemSignature: TypeAlias = "Signature | tuple[str, frozenset[tuple[Any, Signature]]]"


def select(items: list[Any], convert: Convert, *, odd_items: OddItems) -> Selection:
    """Convert each item and keep those that stack with the batch; refuse or leave out the others.

    The batch's signature is the one most of its items have (on a tie, the first item's of those tied): a
    malformed item fails alone, wherever it is in the batch, and a well-formed one is never failed for being
    batched with it. An item that cannot be converted at all (ragged, not numbers, a scalar where sequences are
    padded) is odd whatever the others are. With ``odd_items="raise"`` the first odd item's error is raised.
    """
    signatures: dict[int, _ItemSignature] = {}
    converted: dict[int, Any] = {}
    shapes: dict[int, Any] = {}
    left_out: dict[int, Exception] = {}
    for index, item in enumerate(items):
        try:
            if isinstance(item, Mapping):
                parts = {name: convert(value, name, index) for name, value in item.items()}
                converted[index] = {name: part[0] for name, part in parts.items()}
                shapes[index] = {name: part[2] for name, part in parts.items()}
                signatures[index] = ("dict", frozenset((name, part[1]) for name, part in parts.items()))
            else:
                converted[index], signatures[index], shapes[index] = convert(item, None, index)
        except (TypeError, ValueError) as error:
            left_out[index] = error
    if signatures:
        counts = Counter(signatures.values())
        reference = max(counts, key=counts.__getitem__)  # max keeps the first of those tied: the earliest
        if len(counts) > 1:
            for index, signature in signatures.items():
                if signature != reference:
                    left_out[index] = _mismatch(index, items[index], signature, shapes[index], reference)
    if left_out and odd_items == "raise":
        raise left_out[min(left_out)]
    kept = [index for index in range(len(items)) if index not in left_out]
    if kept and isinstance(items[kept[0]], Mapping):
        names = list(converted[kept[0]])
        columns = {name: [converted[index][name] for index in kept] for name in names}
        return Selection(kept, [], columns, left_out)
    return Selection(kept, [converted[index] for index in kept], {}, left_out)


def _mismatch(index: int, item: Any, signature: _ItemSignature, shape: Any, reference: _ItemSignature) -> Exception:
    """The error of item ``index``, whose ``signature`` is not the batch's ``reference``."""
    if isinstance(reference, Signature) and isinstance(signature, Signature):
        return _value_mismatch(None, index, signature, shape, reference)
    if isinstance(reference, Signature):
        return TypeError(
            f"item {index} is {a_type(item)} of features, where the batch's items are arrays ({_text(reference)})"
        )
    features = dict(reference[1])
    if isinstance(signature, Signature):
        return TypeError(
            f"item {index} is {a_type(item)}, where the batch's items are mappings of features"
            f" {sorted(map(str, features))}"
        )
    own = dict(signature[1])
    if set(own) != set(features):
        missing = sorted(map(str, set(features) - set(own)))
        extra = sorted(map(str, set(own) - set(features)))
        return ValueError(
            f"item {index} has other features than the batch's items: missing {missing}, unexpected {extra}"
        )
    name = next(name for name in features if own[name] != features[name])
    return _value_mismatch(name, index, own[name], shape[name], features[name])


def _value_mismatch(
    key: Any, index: int, signature: Signature, shape: tuple[int, ...], reference: Signature
) -> Exception:
    what = describe(key)
    # The device is named only where it is what differs: "on cpu" on every message would be noise.
    devices = signature.device != reference.device
    own = _text(Signature(shape, signature.dtype, signature.device if devices else None))
    expected = _text(reference if devices else reference._replace(device=None))
    if signature.shape != reference.shape:
        padded = reference.shape[:1] == (None,)
        verb = "pad" if padded else "stack"
        hint = " (only the first axis may differ)" if padded else ""
        return ValueError(
            f"cannot {verb} {what} of different shapes: item {index} has {own}, where the batch's items have"
            f" {expected}{hint}"
        )
    if signature.dtype != reference.dtype:
        # numpy compares kinds ("numbers", "strings"), which a cast does not reconcile; torch compares dtypes.
        hint = "" if isinstance(reference.dtype, str) else " (pass dtype= to cast them to one)"
        return TypeError(
            f"cannot collate {what} of different dtypes: item {index} has {own}, where the batch's items have"
            f" {expected}{hint}"
        )
    return ValueError(
        f"cannot collate {what} on different devices: item {index} has {own}, where the batch's items have"
        f" {expected} (pass device= to move them to one)"
    )


def _text(signature: Signature) -> str:
    """``shape (*, 3) of torch.int64 on cpu``: a signature as error messages show it (``*``: any length)."""
    dims = ["*" if dim is None else str(dim) for dim in signature.shape]
    shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
    dtype = "" if signature.dtype is None else f" of {signature.dtype}"
    device = "" if signature.device is None else f" on {signature.device}"
    return f"shape {shape}{dtype}{device}"


def pad_signature(shape: tuple[int, ...], key: Any, index: int) -> tuple[int | None, ...]:
    """The shape an item's value shares with the batch when sequences are padded: any first axis."""
    if not shape:
        raise ValueError(f"{describe(key)}: item {index} is a scalar; pad_sequences needs a sequence axis")
    return (None, *shape[1:])


def check_fill(pad_value: int | float | bool, fill: Any, *, floating: bool, dtype: object, key: str | None) -> None:
    """Refuse a pad value that its dtype changed into ``fill``: a float in an int tensor, -1 in uint8, 300 in
    int8, 2 in bool, 1e40 in float32. A float dtype may round the value (0.1 in float32) but not overflow it."""
    try:
        exact = (cmath.isfinite(fill) or not cmath.isfinite(pad_value)) if floating else bool(fill == pad_value)
    except (TypeError, ValueError):
        exact = False
    if not exact:
        what = "" if key is None else f" of feature {key!r}"
        raise ValueError(f"pad value {pad_value!r}{what} cannot be represented in dtype {dtype}")


def merge_left_out(rows: Sequence[Any], left_out: Mapping[int, Exception]) -> list[Any]:
    """The results of every item: ``rows`` for the kept ones, in order, and its error for each left-out one."""
    if not left_out:
        return list(rows)
    kept = iter(rows)
    return [left_out[index] if index in left_out else next(kept) for index in range(len(rows) + len(left_out))]


def check_rows(shape: tuple[int, ...], size: int, padded_size: int | None, name: str) -> None:
    """Refuse an output of ``shape`` that does not hold one row per item (and per padding row)."""
    if not shape:
        raise ValueError(
            f"{name} is a scalar, not a batch of {size} rows (a value for the whole batch cannot be split per item)"
        )
    if padded_size is not None and shape[0] != padded_size:
        raise ValueError(f"{name} has {shape[0]} rows for a batch of {padded_size} rows (shape {shape})")
    if shape[0] < size:
        raise ValueError(f"{name} has {shape[0]} rows for {size} items (shape {shape})")


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
                f"{path} is {a_type(value)} ({_short(value)}), not a batch of {self.size} rows: a value for the"
                " whole batch cannot be split per item"
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
                f"{path} is ambiguous: a list of {len(value)} elements that hold arrays ({_shapes(value)}), as"
                f" many as the batch has rows, and each splits into {size} rows: it reads as {len(value)} outputs"
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
