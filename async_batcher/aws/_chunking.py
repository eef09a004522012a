"""Cut a batch into calls the service accepts: by count, by size, and with each key at most once per call.

Pure functions, shared by the AWS batchers.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def chunk(items: Sequence[T], *, max_count: int, max_bytes: int, size_of: Callable[[T], int]) -> list[list[T]]:
    """Split ``items`` in order into runs of at most ``max_count`` items whose sizes add up to <= ``max_bytes``.

    An item larger than ``max_bytes`` on its own gets a run of its own: the service will refuse it, and only
    it (the batcher isolates refusals per item).
    """
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count!r}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes!r}")
    runs: list[list[T]] = []
    current: list[T] = []
    current_bytes = 0
    for item in items:
        size = size_of(item)
        if current and (len(current) >= max_count or current_bytes + size > max_bytes):
            runs.append(current)
            current, current_bytes = [], 0
        current.append(item)
        current_bytes += size
    if current:
        runs.append(current)
    return runs


def split_rounds(items: Iterable[T], key_of: Callable[[T], Hashable]) -> list[list[T]]:
    """Put the n-th item of each key into round n, keeping the order of ``items`` inside each round.

    Sending the rounds one after another makes every item reach the service, each key at most once per call,
    and the writes to one key in the order they were submitted.
    """
    rounds: list[list[T]] = []
    seen: dict[Hashable, int] = {}
    for item in items:
        key = key_of(item)
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(item)
    return rounds


def group_by(items: Iterable[T], key_of: Callable[[T], K]) -> dict[K, list[T]]:
    """Items grouped by ``key_of``, groups in order of first appearance, items in order inside each group."""
    groups: dict[K, list[T]] = {}
    for item in items:
        groups.setdefault(key_of(item), []).append(item)
    return groups


def chunk_groups(
    items: Sequence[T], *, key_of: Callable[[T], K], max_count: int, max_bytes: int, size_of: Callable[[T], int]
) -> list[list[T]]:
    """:func:`chunk` within each group of :func:`group_by` (one queue, topic or stream per call)."""
    return [
        run
        for group in group_by(items, key_of).values()
        for run in chunk(group, max_count=max_count, max_bytes=max_bytes, size_of=size_of)
    ]


def _encode_bytes(value: object) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "__bytes__"):  # boto3's Binary
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot size a value of type {type(value).__name__}")


def json_size(value: Any) -> int:
    """The size in bytes of ``value`` as botocore's JSON protocol sends it (blobs base64-encoded)."""
    return len(json.dumps(value, default=_encode_bytes))


def utf8_length(value: object) -> int:
    """The length in bytes of a str (UTF-8), bytes-like value, or anything else as its str."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return len(str(value).encode("utf-8"))


def attributes_size(attributes: Mapping[str, Mapping[str, Any]] | None) -> int:
    """The size SQS and SNS count for message attributes: each one's name, type and value."""
    size = 0
    for name, value in (attributes or {}).items():
        size += utf8_length(name) + utf8_length(value.get("DataType", ""))
        for field_name in ("StringValue", "BinaryValue"):
            if field_name in value:
                size += utf8_length(value[field_name])
    return size


def check_attributes(attributes: Mapping[str, Mapping[str, Any]] | None) -> None:
    """Refuse message attributes that are not ``{"name": {"DataType": ..., ...}}``, naming the bad one."""
    for name, value in (attributes or {}).items():
        if not isinstance(value, Mapping) or "DataType" not in value:
            raise ValueError(f"message attribute {name!r} must be a mapping with a 'DataType', got {value!r:.200}")
