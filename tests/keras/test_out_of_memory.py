"""TensorFlow's out-of-memory error is recognised by :func:`async_batcher.failures.out_of_memory` (issue 45)."""

from __future__ import annotations

from async_batcher.failures import out_of_memory
from tests.requires import require


def test_out_of_memory_recognises_tensorflows() -> None:
    tf = require("tensorflow", "make test-all installs it (the test-all group: Keras on TensorFlow)")
    assert out_of_memory(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"))
    assert not out_of_memory(tf.errors.InvalidArgumentError(None, None, "shapes differ"))
