"""examples/streaming/model.py: a sequence gets the same tokens alone or in a batch, whatever the batch holds."""

from __future__ import annotations

import numpy as np
import pytest

from examples.streaming.model import VOCAB, CharModel


@pytest.fixture(scope="module")
def model() -> CharModel:
    return CharModel(layers=3, width=32)


PROMPTS = [b"hello", b"a much longer prompt than the others", b"x", b"\x00\xff\x80 bytes"]


def test_prompts_prefilled_together_get_the_state_and_token_of_each_alone(model: CharModel) -> None:
    states, tokens = model.prefill(PROMPTS)
    assert states.shape == (3, len(PROMPTS), 32) and tokens.shape == (len(PROMPTS),)
    for i, prompt in enumerate(PROMPTS):
        alone_states, alone_token = model.prefill([prompt])
        np.testing.assert_allclose(states[:, i], alone_states[:, 0], rtol=1e-12)
        assert tokens[i] == alone_token[0]


def test_batched_steps_generate_what_each_sequence_generates_alone(model: CharModel) -> None:
    states, token = model.prefill(PROMPTS)
    generated = [[int(t)] for t in token]
    for _ in range(29):
        states, token = model.step(states, token)
        for row, t in zip(generated, token, strict=True):
            row.append(int(t))
    assert generated == [model.generate(prompt, 30) for prompt in PROMPTS]
    assert all(0 <= t < VOCAB for row in generated for t in row)
    assert len({tuple(row) for row in generated}) == len(PROMPTS)  # different prompts, different streams


def test_the_weights_come_from_the_seed(model: CharModel) -> None:
    assert CharModel(layers=3, width=32).generate(b"seed", 10) == model.generate(b"seed", 10)
    assert CharModel(layers=3, width=32, seed=1).generate(b"seed", 10) != model.generate(b"seed", 10)


def test_bad_arguments_are_refused(model: CharModel) -> None:
    with pytest.raises(ValueError, match="at least one byte"):
        model.prefill([b"ok", b""])
    with pytest.raises(ValueError, match="at least one byte"):
        model.prefill([])
    with pytest.raises(ValueError, match="layers and width"):
        CharModel(layers=0)
