"""async_batcher.ml.numpy: stacking, padding, bucket sizes, dict features and splitting, with their traps."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from async_batcher.ml.numpy import collate, split_outputs


def test_stack_same_shape_keeps_dtype_and_order() -> None:
    items = [np.full(3, i, dtype=np.float32) for i in range(4)]
    batch = collate(items)
    assert batch.inputs.dtype == np.float32
    assert batch.inputs.shape == (4, 3)
    assert batch.size == batch.padded_size == 4
    assert batch.mask is None and batch.lengths is None
    np.testing.assert_array_equal(batch.inputs[:, 0], [0, 1, 2, 3])


def test_stack_python_lists_and_explicit_dtype() -> None:
    batch = collate([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    assert batch.inputs.dtype == np.float32
    np.testing.assert_array_equal(batch.inputs, [[1, 2], [3, 4]])


def test_stack_different_shapes_names_both_shapes() -> None:
    with pytest.raises(
        ValueError, match=r"item 2 has shape \(2,\) of numbers, where the batch's items have shape \(3,\)"
    ):
        collate([np.zeros(3), np.zeros(3), np.zeros(2)])


def test_ragged_list_item_is_refused_not_made_an_object_array() -> None:
    with pytest.raises((TypeError, ValueError)):
        collate([[1.0, [2.0, 3.0]]])


def test_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        collate([])


def test_mixed_dtypes_promote_for_large_batches() -> None:
    # np.result_type(*arrays) fails past a fixed number of arguments; batches are larger than that.
    items = [np.zeros(2, dtype=np.int32) for _ in range(200)] + [np.zeros(2, dtype=np.float32)]
    assert collate(items).inputs.dtype == np.float64


def test_pad_float_sequences_keeps_float_dtype_and_pad_value() -> None:
    # batched 0.1.5 casts padded float sequences to int64; the values must survive padding unchanged.
    items = [np.array([0.25, 0.5], dtype=np.float32), np.array([1.5], dtype=np.float32)]
    batch = collate(items, pad_sequences=True, pad_value=-0.75)
    assert batch.inputs.dtype == np.float32
    np.testing.assert_array_equal(batch.inputs, [[0.25, 0.5], [1.5, -0.75]])
    np.testing.assert_array_equal(batch.mask, [[True, True], [True, False]])
    np.testing.assert_array_equal(batch.lengths, [2, 1])


def test_pad_sequences_with_feature_axes_and_int_mask() -> None:
    items = [np.ones((1, 3), dtype=np.int32), np.ones((3, 3), dtype=np.int32)]
    batch = collate(items, pad_sequences=True, mask_dtype=np.int64)
    assert batch.inputs.shape == (2, 3, 3)
    assert batch.inputs.dtype == np.int32
    assert batch.mask is not None and batch.mask.dtype == np.int64
    np.testing.assert_array_equal(batch.mask, [[1, 0, 0], [1, 1, 1]])
    assert batch.inputs[0, 1:].sum() == 0


def test_pad_sequences_other_axes_must_match() -> None:
    with pytest.raises(ValueError, match=r"item 1 has shape \(2, 4\).*\(\*, 3\).*only the first axis"):
        collate([np.zeros((1, 3)), np.zeros((2, 4))], pad_sequences=True)


@pytest.mark.parametrize(
    ("pad_value", "dtype"),
    [(0.5, np.int64), (-1, np.uint8), (300, np.int8), (1e40, np.float32), (2, np.bool_)],
)
def test_pad_value_the_dtype_cannot_hold_is_refused(pad_value: float, dtype: type) -> None:
    items = [np.array([1, 1], dtype=dtype), np.array([1], dtype=dtype)]
    with pytest.raises(ValueError, match=re.escape(f"pad value {pad_value!r} cannot be represented")):
        collate(items, pad_sequences=True, pad_value=pad_value)


def test_pad_value_rounded_by_float32_is_accepted() -> None:
    batch = collate([np.zeros(2, dtype=np.float32), np.zeros(1, dtype=np.float32)], pad_sequences=True, pad_value=0.1)
    assert batch.inputs[1, 1] == np.float32(0.1)


def test_dict_items_batch_length_is_the_number_of_items_not_of_keys() -> None:
    # Three features, two items: a batch whose size came from len(dict) would be 3.
    items = [{"a": [1.0], "b": [2.0], "c": [3.0]}, {"a": [4.0], "b": [5.0], "c": [6.0]}]
    batch = collate(items)
    assert batch.size == 2
    assert isinstance(batch.inputs, dict)
    assert {k: v.shape for k, v in batch.inputs.items()} == {"a": (2, 1), "b": (2, 1), "c": (2, 1)}
    results = batch.split({"y": np.array([[10.0], [20.0]]), "z": np.array([1, 2])})
    assert len(results) == 2
    assert results[1]["y"][0] == 20.0 and results[1]["z"] == 2


def test_dict_items_with_different_keys_name_them() -> None:
    with pytest.raises(ValueError, match=r"item 1 .*missing \['b'\], unexpected \['x'\]"):
        collate([{"a": 1, "b": 2}, {"a": 1, "x": 2}])
    with pytest.raises(TypeError, match="item 1 is a list"):
        collate([{"a": 1}, [1]])


def test_dict_items_pad_value_per_feature_and_masks_per_feature() -> None:
    items = [
        {"ids": np.array([5, 6, 7]), "scores": np.array([0.5], dtype=np.float32)},
        {"ids": np.array([8]), "scores": np.array([0.25, 0.75], dtype=np.float32)},
    ]
    batch = collate(items, pad_sequences=True, pad_value={"ids": -1, "scores": np.nan})
    assert isinstance(batch.inputs, dict) and isinstance(batch.mask, dict)
    np.testing.assert_array_equal(batch.inputs["ids"], [[5, 6, 7], [8, -1, -1]])
    assert batch.inputs["scores"].dtype == np.float32
    np.testing.assert_array_equal(batch.inputs["scores"], [[0.5, np.nan], [0.25, 0.75]])
    np.testing.assert_array_equal(batch.mask["ids"], [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(batch.mask["scores"], [[1, 0], [1, 1]])


def test_pad_value_mapping_with_array_items_is_refused() -> None:
    with pytest.raises(TypeError, match="pad_value mapping"):
        collate([[1], [2]], pad_sequences=True, pad_value={"a": 0})


def test_buckets_pad_the_batch_with_copies_of_the_last_item_and_split_drops_them() -> None:
    items = [np.array([float(i)]) for i in range(3)]
    batch = collate(items, buckets=(1, 4, 8))
    assert (batch.size, batch.padded_size) == (3, 4)
    np.testing.assert_array_equal(batch.inputs[:, 0], [0, 1, 2, 2])
    assert [r.tolist() for r in batch.split(batch.inputs * 10)] == [[0.0], [10.0], [20.0]]


def test_buckets_pad_masks_and_lengths_too() -> None:
    batch = collate([[1, 2], [3]], pad_sequences=True, buckets=[4])
    assert batch.inputs.shape == (4, 2)
    np.testing.assert_array_equal(batch.lengths, [2, 1, 1, 1])
    np.testing.assert_array_equal(batch.mask, [[1, 1], [1, 0], [1, 0], [1, 0]])


def test_exact_bucket_adds_nothing() -> None:
    batch = collate([[1], [2]], buckets=(2, 4))
    assert batch.padded_size == 2


@pytest.mark.parametrize("buckets", [(), (0, 4), (2.5,), (True,)])
def test_bad_buckets_are_refused(buckets: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="buckets must be positive ints"):
        collate([[1]], buckets=buckets)  # type: ignore[arg-type]


def test_batch_larger_than_largest_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match="3 items is larger than the largest bucket size 2"):
        collate([[1], [2], [3]], buckets=(1, 2))


def test_split_multi_output_list_and_tuple() -> None:
    outputs = [np.array([[1], [2]]), np.array([3, 4])]
    assert [[a.tolist(), b.tolist()] for a, b in split_outputs(outputs, 2, lists="outputs")] == [[[1], 3], [[2], 4]]
    pairs = split_outputs((np.array([1, 2]), np.array([3, 4])), 2)
    assert all(isinstance(p, tuple) for p in pairs) and [tuple(map(int, p)) for p in pairs] == [
        (1, 3),
        (2, 4),
    ]


def test_split_refuses_misaligned_outputs() -> None:
    with pytest.raises(ValueError, match="the output has 1 row for 2 items"):
        split_outputs(np.zeros((1, 1)), 2)
    with pytest.raises(ValueError, match=r"output\[1\] has 3 rows for a batch of 4 rows"):
        split_outputs([np.zeros(4), np.zeros(3)], 2, padded_size=4)
    with pytest.raises(ValueError, match="scalar"):
        split_outputs(np.float32(1.0), 1)
    with pytest.raises(ValueError, match=r"y has 1 row for 2 items \(shape \(1,\)\)"):
        split_outputs({"y": np.zeros(1)}, 2)


def test_split_takes_anything_numpy_converts() -> None:
    class Tensor:  # what a framework tensor offers: the array protocol
        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
            return np.array([[1.0], [2.0], [3.0]])

    assert [r.tolist() for r in split_outputs(Tensor(), 2)] == [[1.0], [2.0]]


def test_pad_value_naming_a_feature_the_items_lack_is_refused() -> None:
    # A misspelt name would leave the real feature padded with 0, which can be a real token id.
    with pytest.raises(ValueError, match=r"pad_value names features the items do not have: \['input_id'\]"):
        collate([{"input_ids": [1, 2]}, {"input_ids": [3]}], pad_sequences=True, pad_value={"input_id": 0})


def test_split_namedtuple_outputs_keep_their_type() -> None:
    point = collections.namedtuple("point", ["x", "y"])
    rows = split_outputs(point(np.array([1, 2]), np.array([3, 4])), 2)
    assert all(isinstance(row, point) for row in rows)
    assert [(int(row.x), int(row.y)) for row in rows] == [(1, 3), (2, 4)]


def test_the_batch_is_what_most_items_are_and_odd_items_are_left_out_on_request() -> None:
    items = [np.zeros(2), np.zeros(3), np.zeros(3), "abc", np.array([1, "a"], dtype=object), [2**70, 1], np.ones(3)]
    with pytest.raises(
        ValueError, match=r"item 0 has shape \(2,\) of numbers, where the batch's items have shape \(3,"
    ):
        collate(items)
    batch = collate(items, odd_items="exclude", buckets=(4,))
    assert (batch.size, batch.padded_size) == (3, 4) and sorted(batch.left_out) == [0, 3, 4, 5]
    assert "item 3 has shape () of strings, where the batch's items have shape (3,) of numbers" in str(
        batch.left_out[3]
    )
    assert "item 4 is not a rectangular array of numbers" in str(batch.left_out[4])
    results = batch.split(batch.inputs.sum(axis=1))
    assert [float(results[n]) for n in (1, 2, 6)] == [0.0, 0.0, 3.0]
    assert results[5] is batch.left_out[5]
    with pytest.raises(ValueError, match="odd_items must be 'raise' or 'exclude'"):
        collate(items, odd_items="drop")  # type: ignore[arg-type]


def test_what_numpy_promotes_stacks_together() -> None:
    # Found: datetimes of two units were taken for two dtypes, though numpy promotes them.
    dates = collate([np.datetime64("2020-01-01"), np.datetime64("2020-01-02T03:04", "m")])
    assert dates.inputs.dtype == np.dtype("datetime64[m]") and dates.size == 2
    assert collate([[True, False], [0.5, 1.0]]).inputs.dtype == np.float64
    assert collate(["ab", "cde"]).inputs.tolist() == ["ab", "cde"]
    mixed = collate([np.datetime64("2020-01-01"), 1.5, np.datetime64("2020-01-03")], odd_items="exclude")
    assert list(mixed.left_out) == [1] and "of numbers, where the batch's items have shape () of datetimes" in str(
        mixed.left_out[1]
    )


def test_dict_items_with_an_odd_feature_or_a_nested_dict_are_left_out() -> None:
    items = [{"a": [1.0, 2.0]}, {"a": {"b": 1}}, {"a": [3.0, 4.0]}, {"a": [5.0]}, {"b": [1.0, 2.0]}, [1.0, 2.0]]
    batch = collate(items, odd_items="exclude")
    assert isinstance(batch.inputs, dict) and batch.inputs["a"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert sorted(batch.left_out) == [1, 3, 4, 5]
    assert "feature 'a': item 1 is not a rectangular array of numbers" in str(batch.left_out[1])
    assert "feature 'a' of different shapes: item 3 has shape (1,)" in str(batch.left_out[3])
    assert "missing ['a'], unexpected ['b']" in str(batch.left_out[4])
    assert "item 5 is a list, where the batch's items are mappings of features ['a']" in str(batch.left_out[5])


def test_nothing_left_gives_an_empty_batch_whose_split_reads_no_output() -> None:
    batch = collate([None, "x"], odd_items="exclude", pad_sequences=True)
    assert (batch.size, batch.padded_size, batch.inputs.size) == (0, 0, 0)
    assert [type(r) for r in batch.split(object())] == [TypeError, ValueError]
