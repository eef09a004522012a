"""chunk / split_rounds / group_by / json_size, with example cases and properties (hypothesis)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_batcher.aws._chunking import chunk, group_by, json_size, split_rounds


def test_chunk_by_count() -> None:
    assert chunk(list(range(7)), max_count=3, max_bytes=100, size_of=lambda _: 1) == [[0, 1, 2], [3, 4, 5], [6]]


def test_chunk_by_size() -> None:
    sizes = [4, 4, 3, 9, 1]
    assert chunk(sizes, max_count=10, max_bytes=10, size_of=lambda s: s) == [[4, 4], [3], [9, 1]]


def test_oversized_item_goes_alone() -> None:
    assert chunk([1, 50, 1], max_count=10, max_bytes=10, size_of=lambda s: s) == [[1], [50], [1]]


def test_chunk_rejects_nonsense_limits() -> None:
    with pytest.raises(ValueError, match="max_count must be >= 1, got 0"):
        chunk([1], max_count=0, max_bytes=1, size_of=lambda s: s)
    with pytest.raises(ValueError, match="max_bytes must be >= 1, got 0"):
        chunk([1], max_count=1, max_bytes=0, size_of=lambda s: s)


@given(
    st.lists(st.integers(min_value=1, max_value=50)),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=120),
)
def test_chunk_properties(sizes: list[int], max_count: int, max_bytes: int) -> None:
    runs = chunk(sizes, max_count=max_count, max_bytes=max_bytes, size_of=lambda s: s)
    assert [s for run in runs for s in run] == sizes  # nothing lost, order kept
    for run in runs:
        assert 1 <= len(run) <= max_count
        assert sum(run) <= max_bytes or len(run) == 1
    # Greedy: a run could not have taken the next run's first item.
    for run, following in itertools.pairwise(runs):
        assert len(run) == max_count or sum(run) + following[0] > max_bytes


def test_rounds_put_each_key_once_per_round_in_order() -> None:
    items = [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("c", 1), ("b", 2)]
    assert split_rounds(items, key_of=lambda i: i[0]) == [
        [("a", 1), ("b", 1), ("c", 1)],
        [("a", 2), ("b", 2)],
        [("a", 3)],
    ]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers())))
def test_round_properties(items: list[tuple[int, int]]) -> None:
    rounds = split_rounds(items, key_of=lambda i: i[0])
    assert sorted(i for r in rounds for i in r) == sorted(items)
    for r in rounds:
        keys = [k for k, _ in r]
        assert len(keys) == len(set(keys))
    # Per key, the rounds replay the submission order.
    for key in {k for k, _ in items}:
        assert [i for r in rounds for i in r if i[0] == key] == [i for i in items if i[0] == key]


def test_group_by_keeps_first_appearance_order() -> None:
    groups = group_by(["q2:a", "q1:b", "q2:c"], key_of=lambda s: s.split(":")[0])
    assert list(groups) == ["q2", "q1"]
    assert groups["q2"] == ["q2:a", "q2:c"]


def test_json_size_matches_the_encoded_length_and_base64s_blobs() -> None:
    value = {"pk": {"S": "é"}, "b": {"B": b"\x00\x01\x02\x03"}}
    assert json_size(value) == len(json.dumps({"pk": {"S": "é"}, "b": {"B": "AAECAw=="}}).encode())
    with pytest.raises(TypeError, match="cannot size a value of type object"):
        json_size({"x": object()})
