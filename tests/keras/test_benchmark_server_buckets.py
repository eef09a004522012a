"""The Keras benchmark server's --buckets and --preferred-batch-sizes (what benchmarks/padding.py compares)."""

from __future__ import annotations

import asyncio
import os

import httpx
import numpy as np
import pytest

from tests.servers import keras_server

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.mark.single_loop
async def test_batches_go_at_preferred_sizes_and_are_padded_up_to_a_bucket() -> None:
    from benchmarks.keras import model as example_model

    rows = example_model.sample_inputs(6, seed=2)
    # A long max_queue_time: six requests sent together wait for one another, unless a preferred size cuts.
    options = ["--max-batch-size", "16", "--max-queue-time", "2", "--buckets", "4,8,16"]
    with keras_server(*options, "--preferred-batch-sizes", "4,8,16") as server:
        before = server.stats()
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            answers = await asyncio.gather(
                *(client.post("/optimized_predict", json=[float(v) for v in row]) for row in rows)
            )
        after = server.stats()
    assert [a.status_code for a in answers] == [200] * 6
    expected = np.asarray(example_model.load_or_train().predict_on_batch(rows))[:, 0]
    np.testing.assert_allclose([a.json() for a in answers], expected, rtol=1e-5)
    # Four went as soon as they were there (a preferred size), the other two at their deadline: 4 + 2 items,
    # computed as 4 + 4 rows (the batch of 2 padded up to the bucket of 4).
    assert after["batches"] - before["batches"] == 2
    assert after["processed"] - before["processed"] == 6
    assert after["batch_rows"] - before["batch_rows"] == 8


def test_bucket_settings_are_parsed_and_bad_ones_refused() -> None:
    from benchmarks.keras.server import ServerSettings

    settings = ServerSettings.from_env({"KERAS_SERVER_BUCKETS": "8,32", "KERAS_SERVER_PREFERRED_BATCH_SIZES": "32"})
    assert (settings.bucket_sizes, settings.preferred_sizes) == ((8, 32), (32,))
    assert (ServerSettings().bucket_sizes, ServerSettings().preferred_sizes) == (None, ())
    for bad in ("8,x", "0,8", "8,,16"):
        with pytest.raises(ValueError, match=f"buckets must be comma-separated batch sizes >= 1, got '{bad}'"):
            ServerSettings(buckets=bad)
