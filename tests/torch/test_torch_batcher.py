"""TorchAsyncBatcher with a real (small, random-weight) torch model: concurrent callers of different lengths."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest

from tests.requires import require

torch = require("torch", "make test-all installs its CPU build (mk/torch.mk)")

from async_batcher.ml.torch import Batch, TorchAsyncBatcher  # noqa: E402

# Float32 sums run in an order that depends on the batch's shape, so an item's row may differ from the same item
# run alone in the last bits; 1e-5 allows for that and nothing more (the rows differ by far more than that).
RTOL, ATOL = 1e-5, 1e-6
VOCAB, PAD_ID = 50, 0


class TinyDecoder(torch.nn.Module):
    """One causal self-attention layer with learned positions, taking an attention mask: the shape of a
    decoder-only language model, small and with random weights. Positions count real tokens only, so the
    logits of a token do not depend on how much padding is before or after it."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, dim)
        self.positions = torch.nn.Embedding(64, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        real = attention_mask.bool()
        positions = (real.long().cumsum(1) - 1).clamp(min=0)
        x = self.tokens(input_ids) + self.positions(positions)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        length = input_ids.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        # A position sees the real tokens up to itself, and always itself (a padding row must not be all -inf).
        allowed = (causal & real[:, None, :]) | torch.eye(length, dtype=torch.bool)
        scores = (q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
        out: torch.Tensor = self.head(x + scores.softmax(-1) @ v)
        return out  # (batch, length, VOCAB)


@pytest.fixture(scope="module")
def decoder() -> TinyDecoder:
    torch.manual_seed(7)
    return TinyDecoder().eval()


def _prompts(n: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(1, VOCAB, ((i * 7) % 13 + 1,), generator=generator) for i in range(n)]


def _alone(model: TinyDecoder, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids[None], torch.ones(1, len(ids), dtype=torch.bool))[0]


@pytest.mark.parametrize("side", ["right", "left"])
async def test_callers_of_different_lengths_get_their_unbatched_outputs(decoder: TinyDecoder, side: str) -> None:
    shapes: list[tuple[int, ...]] = []

    def forward(batch: Batch) -> Any:
        assert isinstance(batch.inputs, torch.Tensor)
        shapes.append(tuple(batch.inputs.shape))
        return decoder(batch.inputs, batch.mask)

    prompts = _prompts(20)
    batcher = TorchAsyncBatcher(
        model=decoder,
        predict_fn=forward,
        pad_sequences=True,
        pad_value=PAD_ID,
        padding_side=side,  # type: ignore[arg-type]
        trim=True,
        buckets=(4, 8),
        max_batch_size=8,
        max_queue_time=0.05,
    )
    async with batcher:
        results = await asyncio.gather(*(batcher.process(ids) for ids in prompts))
    assert len(results) == 20
    for ids, result in zip(prompts, results, strict=True):
        assert isinstance(result, torch.Tensor) and result.shape == (len(ids), VOCAB)
        torch.testing.assert_close(result, _alone(decoder, ids), rtol=RTOL, atol=ATOL)
    # Batched, padded to a bucket: 8 + 8 + 4 rows, never one call per caller.
    assert batcher.stats.batches == 3
    assert sorted(shape[0] for shape in shapes) == [4, 8, 8]
    # The rows differ well beyond the tolerance, so a row sent to the wrong caller would fail above.
    last = torch.stack([r[-1] for r in results])
    assert torch.cdist(last, last).fill_diagonal_(math.inf).min() > 1e-3


async def test_dict_items_as_a_tokenizer_gives_them_call_the_model_by_name(decoder: TinyDecoder) -> None:
    # Left padding, ids padded with the pad token and the attention mask with 0: what a decoder-only model is fed
    # for generation. The last position of every row is then its next-token logits.
    prompts = _prompts(6)
    items = [{"input_ids": ids, "attention_mask": torch.ones(len(ids), dtype=torch.int64)} for ids in prompts]
    batcher = TorchAsyncBatcher(
        model=decoder,
        pad_sequences=True,
        pad_value={"input_ids": PAD_ID, "attention_mask": 0},
        padding_side="left",
        max_batch_size=8,
        max_queue_time=0.05,
    )
    async with batcher:
        results = await asyncio.gather(*(batcher.process(item) for item in items))
    assert batcher.stats.batches == 1
    for ids, result in zip(prompts, results, strict=True):
        torch.testing.assert_close(result[-1], _alone(decoder, ids)[-1], rtol=RTOL, atol=ATOL)


async def test_model_runs_in_the_executor_under_inference_mode(decoder: TinyDecoder) -> None:
    seen: list[tuple[threading.Thread, bool, bool]] = []
    linear = torch.nn.Linear(4, 2).eval()

    def forward(batch: Batch) -> Any:
        seen.append((threading.current_thread(), torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return linear(batch.inputs)

    rows = torch.randn(5, 4)
    async with TorchAsyncBatcher(model=linear, predict_fn=forward, max_queue_time=0.05) as batcher:
        results = await asyncio.gather(*(batcher.process(row) for row in rows))
    assert len(seen) == 1
    thread, inference, grad = seen[0]
    assert thread is not threading.main_thread() and inference and not grad
    with torch.inference_mode():
        expected = linear(rows)
    torch.testing.assert_close(torch.stack(results), expected, rtol=RTOL, atol=ATOL)
    assert all(r.is_inference() and r.device == expected.device for r in results)


async def test_outputs_keep_their_structure_and_can_move_to_another_device() -> None:
    def two_heads(x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"double": x * 2, "total": x.sum(1)}

    batcher = TorchAsyncBatcher(model=two_heads, output_device="meta", max_queue_time=0.05)
    async with batcher:
        results = await asyncio.gather(*(batcher.process([float(i), 1.0]) for i in range(3)))
    assert [set(r) for r in results] == [{"double", "total"}] * 3
    assert {r["double"].device.type for r in results} == {"meta"}
    assert [tuple(r["double"].shape) for r in results] == [(2,)] * 3


async def test_an_odd_item_fails_alone_a_model_error_fails_its_batch_and_the_batcher_serves_on() -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        if (x < 0).any():
            raise ValueError("negative inputs")
        return x + 1

    batcher = TorchAsyncBatcher(model=model, max_batch_size=3, max_queue_time=0.05)
    async with batcher:
        calls = (batcher.process(torch.zeros(2)), batcher.process(torch.zeros(3)), batcher.process(torch.ones(2)))
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
        assert [o.tolist() for o in (outcomes[0], outcomes[2])] == [[1.0, 1.0], [2.0, 2.0]]
        assert isinstance(outcomes[1], ValueError)
        assert "item 1 has shape (3,) of torch.float32, where the batch's items have shape (2,)" in str(outcomes[1])
        calls = (batcher.process(torch.zeros(2)), batcher.process(-torch.ones(2)))
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
        assert [str(o) for o in outcomes] == ["negative inputs"] * 2
        assert (await asyncio.wait_for(batcher.process(torch.zeros(2)), 60)).tolist() == [1.0, 1.0]


def test_device_defaults_to_the_models() -> None:
    model = torch.nn.Linear(2, 2).eval()
    assert TorchAsyncBatcher(model=model).device == torch.device("cpu")
    assert TorchAsyncBatcher(model=model.to("meta")).device == torch.device("meta")
    assert TorchAsyncBatcher(model=model, device="meta").device == torch.device("meta")
    assert TorchAsyncBatcher(model=lambda x: x).device is None


def test_bad_arguments_are_refused() -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"model Linear is in training mode: call model\.eval\(\) first"):
        TorchAsyncBatcher(model=model)
    model.eval()
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module or a callable, got int"):
        TorchAsyncBatcher(model=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_batch_size must be set and fit in the largest bucket, got None"):
        TorchAsyncBatcher(model=model, buckets=(4, 8))
    with pytest.raises(ValueError, match="padding_side must be 'right' or 'left', got 'top'"):
        TorchAsyncBatcher(model=model, padding_side="top")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="trim=True cuts padded sequences: it needs pad_sequences=True"):
        TorchAsyncBatcher(model=model, trim=True)
    with pytest.raises(ValueError, match="device 'tpu0' is not a torch device"):
        TorchAsyncBatcher(model=model, device="tpu0")
    with pytest.raises(TypeError, match="bogus"):
        TorchAsyncBatcher(model=model, bogus=1)
