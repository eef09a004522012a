"""TorchAsyncBatcher and ml.torch.split_outputs on nested outputs (issue 26, item 11).

What a transformers causal language model returns by default, ``{"logits": ..., "past_key_values": ((k, v), ...)}``
or a ``ModelOutput`` dataclass that is also a mapping, is split per item keeping its structure; a tensor whose first
axis is not the batch is an error naming its path and shape; ``None`` is ``None`` for every caller; a value for the
whole batch (a float, a 0-d tensor) is refused, naming its path.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import re
from typing import Any

import pytest

from tests.requires import require

torch = require("torch", "make test-all installs its CPU build (mk/torch.mk)")

from async_batcher.ml.torch import Batch, TorchAsyncBatcher, split_outputs  # noqa: E402

WAIT = 60
RTOL, ATOL = 1e-5, 1e-6
VOCAB, DIM, HEADS, LAYERS = 40, 8, 2, 2


class TinyCausalLM(torch.nn.Module):
    """Two causal self-attention layers that return their key/value cache, as a transformers causal LM does: a
    dict of ``logits (batch, length, vocab)`` and ``past_key_values``, one ``(key, value)`` pair per layer, each
    ``(batch, heads, length, head_dim)``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(DIM, 3 * DIM) for _ in range(LAYERS))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> dict[str, Any]:
        x = self.embed(input_ids)
        batch, length, _ = x.shape
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        cache = []
        for layer in self.layers:
            q, k, v = (t.view(batch, length, HEADS, DIM // HEADS).transpose(1, 2) for t in layer(x).chunk(3, dim=-1))
            scores = (q @ k.transpose(-1, -2) / math.sqrt(DIM // HEADS)).masked_fill(~causal, -math.inf)
            x = x + (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, DIM)
            cache.append((k, v))
        return {"logits": self.head(x), "past_key_values": tuple(cache)}


@pytest.fixture(scope="module")
def lm() -> TinyCausalLM:
    return TinyCausalLM().eval()


def _prompts(n: int, length: int = 5) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(0, VOCAB, (length,), generator=generator) for _ in range(n)]


def _alone(lm: TinyCausalLM, ids: torch.Tensor) -> dict[str, Any]:
    with torch.inference_mode():
        out = lm(ids[None])
    return {
        "logits": out["logits"][0],
        "past_key_values": tuple((k[0], v[0]) for k, v in out["past_key_values"]),
    }


async def _gather(batcher: Any, items: list[Any]) -> list[Any]:
    calls = (batcher.process(item) for item in items)
    return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)


async def test_a_causal_lm_dict_with_its_kv_cache_is_split_per_caller(lm: TinyCausalLM) -> None:
    # Today every caller fails: "'past_key_values' is a tuple, not a tensor of one row per item".
    prompts = _prompts(5)
    async with TorchAsyncBatcher(model=lm, max_batch_size=5, max_queue_time=0.05) as batcher:
        results = await _gather(batcher, prompts)
    assert batcher.stats.batches == 1
    for ids, result in zip(prompts, results, strict=True):
        assert isinstance(result, dict) and set(result) == {"logits", "past_key_values"}
        expected = _alone(lm, ids)
        torch.testing.assert_close(result["logits"], expected["logits"], rtol=RTOL, atol=ATOL)
        cache = result["past_key_values"]
        assert isinstance(cache, tuple) and len(cache) == LAYERS
        for (k, v), (k_alone, v_alone) in zip(cache, expected["past_key_values"], strict=True):
            assert k.shape == (HEADS, 5, DIM // HEADS)
            torch.testing.assert_close(k, k_alone, rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(v, v_alone, rtol=RTOL, atol=ATOL)
    # The rows differ well beyond the tolerance: a row sent to the wrong caller would have failed above.
    last = torch.stack([r["logits"][-1] for r in results])
    assert torch.cdist(last, last).fill_diagonal_(math.inf).min() > 1e-3


class ModelOutputLike(collections.OrderedDict[str, Any]):
    """What transformers' ``ModelOutput`` is: an ``OrderedDict`` whose subclasses are dataclasses, holding as keys
    the fields that are not None, indexable by name or position."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if value is not None:
                self[field.name] = value

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return dict(self.items())[key]
        return self.to_tuple()[key]

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class CausalLMOutputWithPast(ModelOutputLike):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    past_key_values: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


async def test_a_model_output_dataclass_keeps_its_class_per_caller(lm: TinyCausalLM) -> None:
    def forward(batch: Batch) -> CausalLMOutputWithPast:
        out = lm(batch.inputs)
        return CausalLMOutputWithPast(logits=out["logits"], past_key_values=out["past_key_values"])

    prompts = _prompts(3)
    async with TorchAsyncBatcher(model=lm, predict_fn=forward, max_batch_size=3, max_queue_time=0.05) as batcher:
        results = await _gather(batcher, prompts)
    for ids, result in zip(prompts, results, strict=True):
        assert type(result) is CausalLMOutputWithPast
        assert list(result.keys()) == ["logits", "past_key_values"]  # None fields stay out of the mapping
        assert result.loss is None and result.hidden_states is None
        expected = _alone(lm, ids)
        torch.testing.assert_close(result.logits, expected["logits"], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(result[0], expected["logits"], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(result["past_key_values"][1][0], expected["past_key_values"][1][0])


async def test_a_nested_tensor_of_another_batch_size_fails_the_batch_naming_its_path_and_shape(
    lm: TinyCausalLM,
) -> None:
    def forward(batch: Batch) -> dict[str, Any]:
        out = lm(batch.inputs)
        (k0, v0), (k1, v1) = out["past_key_values"]
        return {"logits": out["logits"], "past_key_values": ((k0, v0), (k1, v1[:1]))}

    async with TorchAsyncBatcher(model=lm, predict_fn=forward, max_batch_size=3, max_queue_time=0.05) as batcher:
        results = await _gather(batcher, _prompts(3))
        assert all(isinstance(r, ValueError) for r in results)
        assert "past_key_values[1][1] has 1 row for a batch of 3 rows (shape (1, 2, 5, 4))" in str(results[0])
        # The batcher serves on.
        ok = await asyncio.wait_for(batcher.process(_prompts(1)[0]), WAIT)
        assert ok["logits"].shape == (5, VOCAB)


def test_non_tensor_leaves_none_is_none_for_every_item_values_for_the_whole_batch_are_refused() -> None:
    logits = torch.arange(6.0).reshape(3, 2)
    rows = split_outputs({"logits": logits, "hidden_states": None, "extra": (None, logits)}, 3)
    assert [r["hidden_states"] for r in rows] == [None] * 3
    assert [r["extra"][0] for r in rows] == [None] * 3 and rows[2]["extra"][1].tolist() == [4.0, 5.0]
    with pytest.raises(TypeError, match=r"temperature is a float \(0\.7\), not a batch of 3 rows"):
        split_outputs({"logits": logits, "temperature": 0.7}, 3)
    with pytest.raises(ValueError, match=r"loss is a scalar, not a batch of 3 rows"):
        split_outputs(CausalLMOutputWithPast(loss=torch.tensor(0.5), logits=logits), 3)
    with pytest.raises(TypeError, match=r"output\[1\]\['name'\] is a str \('x'\)"):
        split_outputs((logits, {"name": "x"}), 3)
    with pytest.raises(TypeError, match=r"past_key_values is an object, not a tensor with one row per item"):
        split_outputs({"logits": logits, "past_key_values": object()}, 3)


def test_namedtuples_and_plain_dataclasses_are_rebuilt_per_item_with_paths_by_field_name() -> None:
    pair = collections.namedtuple("pair", ["values", "indices"])

    @dataclasses.dataclass(frozen=True)
    class Heads:
        scores: torch.Tensor
        top: Any

    out = Heads(torch.arange(4.0).reshape(2, 2), pair(torch.tensor([5, 6]), torch.tensor([7, 8])))
    rows = split_outputs(out, 2)
    assert all(type(r) is Heads and type(r.top) is pair for r in rows)
    assert rows[1].scores.tolist() == [2.0, 3.0] and (rows[1].top.values.item(), rows[1].top.indices.item()) == (6, 8)
    broken = Heads(torch.zeros(2, 2), pair(torch.zeros(2), torch.zeros(3)))
    with pytest.raises(ValueError, match=r"top\.indices has 3 rows for a batch of 2 rows"):
        split_outputs(broken, 2, padded_size=2)


def test_a_dataclass_that_refuses_its_rows_is_named() -> None:
    @dataclasses.dataclass
    class Checked:
        batch: torch.Tensor

        def __post_init__(self) -> None:
            if self.batch.dim() != 2:
                raise ValueError("batch must be 2-D")

    with pytest.raises(TypeError, match="the output: cannot rebuild a Checked per item: batch must be 2-D"):
        split_outputs(Checked(torch.zeros(2, 2)), 2)


def test_a_sparse_output_is_refused_and_a_nested_tensor_gives_each_item_its_tensor() -> None:
    with pytest.raises(TypeError, match=r"the output is a sparse tensor \(torch.sparse_coo\)"):
        split_outputs(torch.eye(3).to_sparse(), 3)
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(5), torch.ones(1)], layout=torch.jagged)
    rows = split_outputs({"boxes": nested}, 2, padded_size=3)
    assert [tuple(r["boxes"].shape) for r in rows] == [(2,), (5,)]


# ---------------------------------------------------------------------- outputs that cannot be split


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda x: x[:-1], ValueError, r"the output has 2 rows for a batch of 3 rows \(shape \(2, 2\)\)"),
        (lambda x: torch.cat([x, x]), ValueError, r"the output has 6 rows for a batch of 3 rows"),
        (lambda x: (row for row in x), TypeError, r"the output is a generator, not a tensor with one row per item"),
        (lambda x: {"logits": x, "loss": x.sum()}, ValueError, r"loss is a scalar, not a batch of 3 rows"),
        (lambda x: x.sum().item(), TypeError, r"the output is a float \(.*\), not a batch of 3 rows"),
        (lambda x: torch.eye(3).to_sparse(), TypeError, r"the output is a sparse tensor \(torch\.sparse_coo\)"),
    ],
    ids=["too few rows", "too many rows", "a generator", "a 0-d loss", "a float", "a sparse tensor"],
)
async def test_outputs_the_batch_cannot_be_split_by_fail_the_batch_and_the_batcher_serves_on(
    make: Any, error: type[Exception], message: str
) -> None:
    answers = iter([make, lambda x: x])

    def model(x: torch.Tensor) -> Any:
        return next(answers)(x)

    async with TorchAsyncBatcher(model=model, max_batch_size=3, max_queue_time=0.05) as batcher:
        outcomes = await _gather(batcher, [torch.zeros(2), torch.ones(2), torch.full((2,), 2.0)])
        assert all(isinstance(o, error) for o in outcomes), outcomes
        assert re.search(message, str(outcomes[0])), str(outcomes[0])
        assert (await asyncio.wait_for(batcher.process(torch.ones(2)), WAIT)).tolist() == [1.0, 1.0]


async def test_a_cyclic_output_is_refused_naming_where_not_recursed_into() -> None:
    def model(x: torch.Tensor) -> Any:
        out: dict[str, Any] = {"logits": x}
        out["cache"] = [x, out]
        return out

    async with TorchAsyncBatcher(model=model, max_batch_size=2, max_queue_time=0.05) as batcher:
        outcomes = await _gather(batcher, [torch.zeros(2), torch.ones(2)])
    assert all(isinstance(o, ValueError) for o in outcomes)
    assert "cache[1] holds itself: a cyclic output cannot be split" in str(outcomes[0])
