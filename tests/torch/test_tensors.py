"""async_batcher.ml.torch: stacking, padding on either side, masks, dict features, buckets, devices and splitting."""

from __future__ import annotations

import collections
import re
import subprocess
import sys

import pytest

from tests.requires import require

torch = require("torch", "make test-all installs its CPU build (mk/torch.mk)")

from async_batcher.ml.torch import Batch, collate, split_outputs  # noqa: E402


def _t(*values: float, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _equal(actual: object, expected: object) -> None:
    assert isinstance(actual, torch.Tensor)
    expected_tensor = torch.as_tensor(expected, dtype=actual.dtype)
    assert torch.equal(actual, expected_tensor), f"{actual} != {expected_tensor}"


def test_stack_same_shape_keeps_dtype_and_order() -> None:
    items = [torch.full((3,), i, dtype=torch.float16) for i in range(4)]
    batch = collate(items)
    assert isinstance(batch.inputs, torch.Tensor)
    assert batch.inputs.dtype == torch.float16
    assert batch.inputs.shape == (4, 3)
    assert batch.size == batch.padded_size == 4
    assert batch.mask is None and batch.lengths is None
    _equal(batch.inputs[:, 0], [0, 1, 2, 3])


def test_lists_are_converted_by_torch_and_dtype_casts() -> None:
    batch = collate([[1.0, 2.0], [3.0, 4.0]])
    assert batch.inputs.dtype == torch.float32  # torch's default for Python floats
    batch = collate([[1, 2], [3, 4]], dtype=torch.float64)
    assert batch.inputs.dtype == torch.float64
    _equal(batch.inputs, [[1, 2], [3, 4]])
    mixed = collate([_t(1, 2), _t(0.5, 1.5, dtype=torch.float32)], dtype=torch.float32)
    _equal(mixed.inputs, [[1, 2], [0.5, 1.5]])


def test_mixed_dtypes_are_refused_naming_both() -> None:
    items = [_t(1, 2), _t(1, 2), _t(1, 2, dtype=torch.float32)]
    with pytest.raises(
        TypeError,
        match=r"item 2 has shape \(2,\) of torch\.float32, where the batch's items have shape \(2,\) of torch\.int64"
        r" \(pass dtype=",
    ):
        collate(items)
    with pytest.raises(TypeError, match=r"feature 'ids' of different dtypes"):
        collate([{"ids": _t(1)}, {"ids": _t(1, dtype=torch.int32)}], pad_sequences=True)


def test_different_shapes_name_both_shapes() -> None:
    with pytest.raises(ValueError, match=r"item 2 has shape \(2,\) of .*, where the batch's items have shape \(3,\)"):
        collate([torch.zeros(3), torch.zeros(3), torch.zeros(2)])
    with pytest.raises(ValueError, match=r"feature 'x'.*item 1 has shape \(2, 4\).*\(\*, 3\).*only the first axis"):
        collate([{"x": torch.zeros(1, 3)}, {"x": torch.zeros(2, 4)}], pad_sequences=True)
    with pytest.raises(ValueError, match="item 1 is a scalar; pad_sequences needs a sequence axis"):
        collate([torch.zeros(2), torch.tensor(1.0)], pad_sequences=True)


def test_ragged_list_item_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match="item 1 is not a rectangular array of numbers"):
        collate([[1.0, 2.0], [1.0, [2.0, 3.0]]], dtype=torch.float32)


def test_empty_batch_and_unknown_padding_side_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        collate([])
    with pytest.raises(ValueError, match="padding_side must be 'right' or 'left', got 'center'"):
        collate([[1]], pad_sequences=True, padding_side="center")  # type: ignore[arg-type]


def test_pad_right_with_pad_value_mask_and_lengths() -> None:
    items = [_t(0.25, 0.5, dtype=torch.float32), _t(1.5, dtype=torch.float32), _t(2.5, 3.5, 4.5, dtype=torch.float32)]
    batch = collate(items, pad_sequences=True, pad_value=-0.75)
    assert batch.inputs.dtype == torch.float32
    _equal(batch.inputs, [[0.25, 0.5, -0.75], [1.5, -0.75, -0.75], [2.5, 3.5, 4.5]])
    _equal(batch.mask, [[True, True, False], [True, False, False], [True, True, True]])
    _equal(batch.lengths, [2, 1, 3])
    assert batch.padding_side == "right"


def test_pad_left_puts_every_last_token_in_the_last_column() -> None:
    batch = collate([_t(5, 6, 7), _t(8), _t(9, 10)], pad_sequences=True, pad_value=0, padding_side="left")
    _equal(batch.inputs, [[5, 6, 7], [0, 0, 8], [0, 9, 10]])
    _equal(batch.mask, [[1, 1, 1], [0, 0, 1], [0, 1, 1]])
    _equal(batch.lengths, [3, 1, 2])
    _equal(batch.inputs[:, -1], [7, 8, 10])


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_keeps_feature_axes_and_int_mask(side: str) -> None:
    items = [torch.arange(3, dtype=torch.int32).reshape(1, 3), torch.ones((3, 3), dtype=torch.int32)]
    batch = collate(items, pad_sequences=True, pad_value=-1, padding_side=side, mask_dtype=torch.int64)  # type: ignore[arg-type]
    assert batch.inputs.shape == (2, 3, 3) and batch.inputs.dtype == torch.int32
    assert isinstance(batch.mask, torch.Tensor) and batch.mask.dtype == torch.int64
    first = batch.inputs[0] if side == "right" else batch.inputs[0].flip(0)
    _equal(first, [[0, 1, 2], [-1, -1, -1], [-1, -1, -1]])
    _equal(batch.mask[0], [1, 0, 0] if side == "right" else [0, 0, 1])
    _equal(batch.inputs[1], torch.ones((3, 3)))


def test_zero_length_items_are_all_padding() -> None:
    batch = collate([_t(), _t(4, 5)], pad_sequences=True, pad_value=9, padding_side="left")
    _equal(batch.inputs, [[9, 9], [4, 5]])
    _equal(batch.mask, [[False, False], [True, True]])


@pytest.mark.parametrize(
    ("pad_value", "dtype"),
    [
        (0.5, torch.int64),
        (-1, torch.uint8),
        (300, torch.int8),
        (1e40, torch.float32),
        (2, torch.bool),
        (2**70, torch.int64),
    ],
)
def test_pad_value_the_dtype_cannot_hold_is_refused(pad_value: float, dtype: torch.dtype) -> None:
    items = [torch.ones(2, dtype=dtype), torch.ones(1, dtype=dtype)]
    with pytest.raises(ValueError, match=re.escape(f"pad value {pad_value!r} cannot be represented in dtype {dtype}")):
        collate(items, pad_sequences=True, pad_value=pad_value)


def test_pad_values_that_fit_are_taken() -> None:
    rounded = collate([torch.zeros(2), torch.zeros(1)], pad_sequences=True, pad_value=0.1)
    assert rounded.inputs[1, 1] == torch.tensor(0.1, dtype=torch.float32)
    wide = collate(
        [torch.zeros(2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)], pad_sequences=True, pad_value=1e40
    )
    assert wide.inputs[1, 1].item() == 1e40
    nan = collate([torch.zeros(2), torch.zeros(1)], pad_sequences=True, pad_value=float("nan"))
    assert torch.isnan(nan.inputs[1, 1])


def test_dict_items_batch_length_is_the_number_of_items_not_of_keys() -> None:
    items = [{"a": [1.0], "b": [2.0], "c": [3.0]}, {"a": [4.0], "b": [5.0], "c": [6.0]}]
    batch = collate(items)
    assert batch.size == 2
    assert isinstance(batch.inputs, dict)
    assert {k: tuple(v.shape) for k, v in batch.inputs.items()} == {"a": (2, 1), "b": (2, 1), "c": (2, 1)}
    results = batch.split({"y": torch.tensor([[10.0], [20.0]]), "z": torch.tensor([1, 2])})
    assert len(results) == 2
    assert results[1]["y"][0] == 20.0 and results[1]["z"] == 2


def test_dict_items_pad_value_and_mask_per_feature() -> None:
    # What a tokenizer gives per text: ids padded with the pad token, the attention mask padded with 0.
    items = [
        {"input_ids": _t(5, 6, 7), "attention_mask": _t(1, 1, 1), "scores": _t(0.5, dtype=torch.float32)},
        {"input_ids": _t(8), "attention_mask": _t(1), "scores": _t(0.25, 0.75, dtype=torch.float32)},
    ]
    batch = collate(items, pad_sequences=True, pad_value={"input_ids": 2, "scores": float("nan")}, padding_side="left")
    assert isinstance(batch.inputs, dict) and isinstance(batch.mask, dict) and isinstance(batch.lengths, dict)
    _equal(batch.inputs["input_ids"], [[5, 6, 7], [2, 2, 8]])
    _equal(batch.inputs["attention_mask"], [[1, 1, 1], [0, 0, 1]])
    assert batch.inputs["scores"].dtype == torch.float32
    assert torch.equal(batch.inputs["scores"].isnan(), torch.tensor([[True, False], [False, False]]))
    _equal(batch.mask["input_ids"], [[1, 1, 1], [0, 0, 1]])
    _equal(batch.mask["scores"], [[0, 1], [1, 1]])
    _equal(batch.lengths["scores"], [1, 2])


def test_dict_items_with_other_keys_or_a_misspelt_pad_value_are_refused() -> None:
    with pytest.raises(ValueError, match=r"item 1 .*missing \['b'\], unexpected \['x'\]"):
        collate([{"a": [1], "b": [2]}, {"a": [1], "x": [2]}])
    with pytest.raises(TypeError, match="item 1 is a list"):
        collate([{"a": [1]}, [1]])
    with pytest.raises(ValueError, match=r"pad_value names features the items do not have: \['input_id'\]"):
        collate([{"input_ids": [1]}], pad_sequences=True, pad_value={"input_id": 0})
    with pytest.raises(TypeError, match="pad_value mapping"):
        collate([[1], [2]], pad_sequences=True, pad_value={"a": 0})
    with pytest.raises(TypeError, match="pad_value mapping"):
        collate([[1], [2]], dtype=torch.float32, pad_value={"a": 0})


def test_buckets_repeat_the_last_item_and_split_drops_them() -> None:
    items = [torch.tensor([float(i)]) for i in range(3)]
    batch = collate(items, buckets=(1, 4, 8))
    assert (batch.size, batch.padded_size) == (3, 4)
    _equal(batch.inputs[:, 0], [0, 1, 2, 2])
    assert [r.tolist() for r in batch.split(batch.inputs * 10)] == [[0.0], [10.0], [20.0]]


def test_buckets_pad_masks_and_lengths_too() -> None:
    batch = collate([[1, 2], [3]], pad_sequences=True, padding_side="left", buckets=[4])
    assert tuple(batch.inputs.shape) == (4, 2)
    _equal(batch.lengths, [2, 1, 1, 1])
    _equal(batch.mask, [[1, 1], [0, 1], [0, 1], [0, 1]])
    assert collate([[1], [2]], buckets=(2, 4)).padded_size == 2


@pytest.mark.parametrize("buckets", [(), (0, 4), (2.5,), (True,)])
def test_bad_buckets_are_refused(buckets: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="buckets must be positive ints"):
        collate([[1]], buckets=buckets)  # type: ignore[arg-type]


def test_batch_larger_than_largest_bucket_is_refused() -> None:
    with pytest.raises(ValueError, match="3 items is larger than the largest bucket size 2"):
        collate([[1], [2], [3]], buckets=(1, 2))


@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_device_moves_inputs_masks_and_lengths(device: object) -> None:
    # The meta device stands in for an accelerator on a CPU-only machine: tensors really move there.
    batch = collate([{"ids": _t(1, 2)}, {"ids": _t(3)}], pad_sequences=True, device=device, pin_memory=True)  # type: ignore[arg-type]
    assert isinstance(batch.inputs, dict) and isinstance(batch.mask, dict) and isinstance(batch.lengths, dict)
    assert {t.device.type for t in (*batch.inputs.values(), *batch.mask.values(), *batch.lengths.values())} == {"meta"}
    cpu = collate([_t(1), _t(2)], device="cpu", non_blocking=True, pin_memory=True)
    assert cpu.inputs.device == torch.device("cpu")


def test_items_stay_where_they_are_and_must_share_a_device() -> None:
    assert collate([torch.zeros(2, device="meta")] * 2).inputs.device.type == "meta"
    with pytest.raises(ValueError, match=r"item 1 has shape .* on meta, where the batch's items have .* on cpu"):
        collate([torch.zeros(2), torch.zeros(2, device="meta")])
    with pytest.raises(ValueError, match="device 'gpu' is not a torch device"):
        collate([[1]], device="gpu")


@pytest.mark.parametrize("side", ["right", "left"])
def test_split_trims_sequence_outputs_to_each_items_length(side: str) -> None:
    items = [torch.arange(n, dtype=torch.float32) for n in (3, 1, 2)]
    batch = collate(items, pad_sequences=True, padding_side=side, buckets=(4,))  # type: ignore[arg-type]
    per_token = batch.inputs[..., None] * torch.tensor([1.0, -1.0])  # (4, 3, 2): two outputs per position
    pooled = batch.inputs.sum(1)
    results = batch.split((per_token, pooled), trim=False)
    assert [tuple(r[0].shape) for r in results] == [(3, 2)] * 3
    with pytest.raises(ValueError, match=r"cannot trim output\[1\] of shape \(4,\)"):
        batch.split((per_token, pooled), trim=True)
    trimmed = batch.split({"logits": per_token}, trim=True)
    assert len(trimmed) == 3
    for item, result in zip(items, trimmed, strict=True):
        assert torch.equal(result["logits"][:, 0], item) and torch.equal(result["logits"][:, 1], -item)


def test_split_trim_of_dict_items_names_the_feature() -> None:
    items = [{"ids": _t(1, 2, 3), "extra": _t(1)}, {"ids": _t(4), "extra": _t(2, 3)}]
    batch = collate(items, pad_sequences=True)
    assert isinstance(batch.inputs, dict)
    with pytest.raises(ValueError, match=r"the features \['extra', 'ids'\] have different lengths"):
        batch.split(batch.inputs["ids"], trim=True)
    with pytest.raises(ValueError, match="trim='id' is not a feature of the items"):
        batch.split(batch.inputs["ids"], trim="id")
    assert [r.tolist() for r in batch.split(batch.inputs["ids"], trim="ids")] == [[1, 2, 3], [4]]
    same = collate([{"ids": _t(1, 2), "mask": _t(1, 1)}, {"ids": _t(3), "mask": _t(1)}], pad_sequences=True)
    assert [r.tolist() for r in same.split(same.inputs["ids"], trim=True)] == [[1, 2], [3]]
    with pytest.raises(ValueError, match="trim needs the lengths of padded sequences"):
        collate([_t(1)]).split(torch.zeros(1, 1), trim=True)
    with pytest.raises(ValueError, match="trim='ids' names a feature, but the items are not dicts"):
        collate([_t(1)], pad_sequences=True).split(torch.zeros(1, 1), trim="ids")


def test_split_results_are_views_of_the_outputs_on_their_device() -> None:
    outputs = torch.arange(6.0).reshape(3, 2)
    rows = split_outputs(outputs, 2, padded_size=3)
    assert [r.tolist() for r in rows] == [[0.0, 1.0], [2.0, 3.0]]
    assert all(r.data_ptr() == outputs[i].data_ptr() for i, r in enumerate(rows))  # no copy, no numpy
    on_meta = split_outputs(torch.zeros(2, 2, device="meta"), 2)
    assert {r.device.type for r in on_meta} == {"meta"}
    moved = Batch(inputs=outputs, size=2, padded_size=3).split(outputs, device="meta")
    assert [(r.device.type, tuple(r.shape)) for r in moved] == [("meta", (2,))] * 2


def test_split_keeps_the_output_structure() -> None:
    point = collections.namedtuple("point", ["x", "y"])
    rows = split_outputs(point(torch.tensor([1, 2]), torch.tensor([3, 4])), 2)
    assert rows[1] == point(torch.tensor(2), torch.tensor(4))
    pairs = split_outputs([torch.tensor([[1], [2]]), torch.tensor([3, 4])], 2, lists="outputs")
    assert isinstance(pairs[0], list) and pairs[1][0].tolist() == [2] and pairs[1][1].item() == 4
    values, indices = split_outputs(torch.tensor([[1, 5], [7, 2]]).max(dim=1), 2)[1]
    assert (values.item(), indices.item()) == (7, 0)


def test_split_refuses_misaligned_outputs() -> None:
    with pytest.raises(ValueError, match="the output has 1 row for 2 items"):
        split_outputs(torch.zeros((1, 1)), 2)
    with pytest.raises(ValueError, match=r"output\[1\] has 3 rows for a batch of 4 rows \(shape \(3,\)\)"):
        split_outputs([torch.zeros(4), torch.zeros(3)], 2, padded_size=4)
    with pytest.raises(ValueError, match="scalar"):
        split_outputs(torch.tensor(1.0), 1)
    with pytest.raises(ValueError, match=r"y has 1 row for 2 items \(shape \(1,\)\)"):
        split_outputs({"y": torch.zeros(1)}, 2)
    with pytest.raises(TypeError, match=r"output\[1\] is an object, not a tensor"):
        split_outputs((torch.zeros(2), object()), 2)
    with pytest.raises(ValueError, match="size must be >= 0, got -1"):
        split_outputs(torch.zeros(1), -1)


def test_import_without_torch_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import async_batcher.ml.torch\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "pip install 'async-batcher[torch]'" in out.stdout


# ---------------------------------------------------------------------- empty batches and negative sizes


def test_empty_batches_and_negative_sizes() -> None:
    with pytest.raises(ValueError, match="cannot collate an empty batch"):
        collate([])
    assert split_outputs(torch.zeros(3, 2), 0) == []
    with pytest.raises(ValueError, match="size must be >= 0, got -1"):
        split_outputs(torch.zeros(2), -1)
    assert Batch(torch.empty(0), 0, 0).split(object()) == []
