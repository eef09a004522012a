"""Which items of a batch go into it: each converted and checked against the batch (its shape, dtype and device,
those most of its items have); an odd item refused, or left out with an error that names it and what differs, and
its error put back in its place among the results."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeAlias

from async_batcher.ml._naming import a_type, describe

__all__ = [
    "Convert",
    "OddItems",
    "Selection",
    "Signature",
    "check_items",
    "check_odd_items",
    "merge_left_out",
    "select",
    "uniform",
]

#: What ``collate`` does with an item that does not stack with the rest of its batch: refuse the batch
#: (``"raise"``), or leave the item out and give its caller the error (``"exclude"``).
OddItems: TypeAlias = Literal["raise", "exclude"]


def check_odd_items(odd_items: object) -> OddItems:
    """``odd_items`` if it is ``"raise"`` or ``"exclude"``; a ValueError naming it otherwise."""
    if odd_items == "raise" or odd_items == "exclude":
        return odd_items
    raise ValueError(f"odd_items must be 'raise' or 'exclude', got {odd_items!r}")


def check_items(items: Sequence[Any]) -> list[Any]:
    """``items`` as a list, refusing an empty batch."""
    items = list(items)
    if not items:
        raise ValueError("cannot collate an empty batch")
    return items


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


def merge_left_out(rows: Sequence[Any], left_out: Mapping[int, Exception]) -> list[Any]:
    """The results of every item: ``rows`` for the kept ones, in order, and its error for each left-out one."""
    if not left_out:
        return list(rows)
    kept = iter(rows)
    return [left_out[index] if index in left_out else next(kept) for index in range(len(rows) + len(left_out))]
