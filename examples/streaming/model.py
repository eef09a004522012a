"""A small autoregressive byte-level model with random weights: numpy only, seeded, nothing downloaded.

Stacked gated recurrent layers (minGRU-style: the gate and the candidate state depend on the input only) over a
256-byte vocabulary, greedy decoding, float64. It computes nothing useful; it costs what a language model's
decoding costs, in the way that matters for batching: a step reads every weight once whatever the number of
rows, so a step of 32 rows costs far less than 32 steps of one row.

- :meth:`CharModel.prefill` runs prompts: the matrix products over all their positions at once, then the
  recurrence (elementwise) position by position. It gives each prompt's state and first generated token.
- :meth:`CharModel.step` advances any number of sequences by one token each, as one batch.
- :meth:`CharModel.generate` is one generation alone: prefill, then steps of one row.

Decoding is greedy (argmax) in float64, so a sequence gets the same tokens alone or in a batch of any size.
"""

from __future__ import annotations

import numpy as np

__all__ = ["VOCAB", "CharModel"]

VOCAB = 256  # the bytes


def _rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 + 0.5 * np.tanh(0.5 * x)  # (np.tanh is several times faster than np.exp on some CPUs)


class CharModel:
    """``layers`` recurrent layers of ``width`` units; weights drawn from ``seed``. A state is ``(layers, width)``."""

    def __init__(self, *, layers: int = 12, width: int = 128, seed: int = 0) -> None:
        if layers < 1 or width < 1:
            raise ValueError(f"layers and width must be >= 1, got {layers}, {width}")
        rng = np.random.default_rng(seed)
        scale = 1.0 / np.sqrt(width)
        self.layers = layers
        self.width = width
        self.embed = rng.standard_normal((VOCAB, width))
        # Per layer: the gate and the candidate state from one product, then the output projection.
        self.w_in = [rng.standard_normal((width, 2 * width)) * scale for _ in range(layers)]
        self.w_out = [rng.standard_normal((width, width)) * scale for _ in range(layers)]
        self.head = rng.standard_normal((width, VOCAB)) * scale

    def _mix(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The layer's gate and candidate state for the inputs ``x`` (rows: positions or sequences)."""
        z = _rms_norm(x) @ self.w_in[layer]
        return _sigmoid(z[..., : self.width]), z[..., self.width :]

    def _next_tokens(self, x: np.ndarray) -> np.ndarray:
        logits: np.ndarray = _rms_norm(x) @ self.head
        return logits.argmax(axis=-1)

    def prefill(self, prompts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Run ``prompts`` (each at least one byte) as one batch.

        Returns their states ``(layers, n, width)`` and the first token each generates ``(n,)``. The prompts are
        padded to the longest; a position sees only the positions before it, so the padding changes nothing.
        """
        if not prompts or not all(prompts):
            raise ValueError("prefill takes one or more prompts of at least one byte each")
        lengths = np.array([len(p) for p in prompts])
        padded = np.zeros((len(prompts), lengths.max()), dtype=np.uint8)
        for row, prompt in enumerate(prompts):
            padded[row, : len(prompt)] = np.frombuffer(prompt, dtype=np.uint8)
        rows = np.arange(len(prompts))
        x = self.embed[padded]  # (n, positions, width)
        states = np.empty((self.layers, len(prompts), self.width))
        for layer in range(self.layers):
            gate, candidate = self._mix(layer, x)
            h = np.zeros((len(prompts), self.width))
            hs = np.empty_like(candidate)
            for t in range(padded.shape[1]):  # the recurrence: elementwise, as step() does it
                h = h + gate[:, t] * (candidate[:, t] - h)
                hs[:, t] = h
            x = x + np.tanh(hs) @ self.w_out[layer]
            states[layer] = hs[rows, lengths - 1]
        return states, self._next_tokens(x[rows, lengths - 1])

    def step(self, states: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Feed one token to each of ``n`` sequences: ``states`` ``(layers, n, width)``, ``tokens`` ``(n,)``.

        Returns the new states and each sequence's next token.
        """
        x = self.embed[tokens]
        new = np.empty_like(states)
        for layer in range(self.layers):
            gate, candidate = self._mix(layer, x)
            h = states[layer]
            h = h + gate * (candidate - h)
            x = x + np.tanh(h) @ self.w_out[layer]
            new[layer] = h
        return new, self._next_tokens(x)

    def generate(self, prompt: bytes, max_tokens: int) -> list[int]:
        """One generation alone: ``max_tokens`` tokens after ``prompt``, each step a batch of one."""
        states, token = self.prefill([prompt])
        tokens = [int(token[0])]
        while len(tokens) < max_tokens:
            states, token = self.step(states, token)
            tokens.append(int(token[0]))
        return tokens
