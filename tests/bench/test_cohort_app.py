"""The head-to-head's ``cohort`` variant (``benchmarks/peers/apps/app_cohort.py``), the ceiling of dispatch, on its
own: a batch is the whole population, a short one goes at the fallback, and every request is answered once, with
the model's result or its error, a stop included. A small numpy model stands in for Keras (the smoke test in
``test_peers_smoke.py`` runs the real one behind uvicorn)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "apps"))
from app_cohort import make_predictor  # type: ignore[import-not-found]

pytestmark = pytest.mark.virtual_time


class SumModel:
    """Each row's sum; counts its calls' sizes. ``fail`` makes the next call raise."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.fail: Exception | None = None

    def predict_rows(self, rows: Any) -> Any:
        if self.fail is not None:
            raise self.fail
        self.calls.append(len(rows))
        return rows.sum(axis=1, keepdims=True)


def features(i: int) -> list[float]:
    return [float(i)] * 10


async def test_a_batch_leaves_the_moment_the_whole_population_is_in() -> None:
    model = SumModel()
    p = make_predictor(model, {"size": 4})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with asyncio.timeout(5):
        out = await asyncio.gather(*(p.predict(features(i)) for i in range(4)))
    assert out == [10.0 * i for i in range(4)] and model.calls == [4]
    assert loop.time() - t0 < 0.05  # not the fallback
    await p.stop()


async def test_a_population_short_of_the_size_goes_at_the_fallback() -> None:
    model = SumModel()
    p = make_predictor(model, {"size": 8, "fallback": 0.2})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with asyncio.timeout(5):
        out = await asyncio.gather(*(p.predict(features(i)) for i in range(3)))
    assert out == [0.0, 10.0, 20.0] and model.calls == [3]
    assert loop.time() - t0 >= 0.2
    await p.stop()


async def test_every_caller_of_a_batch_gets_the_models_error() -> None:
    model = SumModel()
    model.fail = RuntimeError("the model broke")
    p = make_predictor(model, {"size": 2})
    async with asyncio.timeout(5):
        got = await asyncio.gather(p.predict(features(1)), p.predict(features(2)), return_exceptions=True)
    assert [str(e) for e in got] == ["the model broke"] * 2
    await p.stop()


async def test_a_stop_answers_the_callers_still_waiting_for_their_cohort() -> None:
    model = SumModel()
    p = make_predictor(model, {"size": 8, "fallback": 60})
    waiting = [asyncio.ensure_future(p.predict(features(i))) for i in range(2)]
    await asyncio.sleep(0)  # (both are in)
    await p.stop()
    async with asyncio.timeout(5):
        assert await asyncio.gather(*waiting) == [0.0, 10.0]
    assert model.calls == [2] and p.timer is None


BAD = [{}, {"size": 0}, {"size": 4, "fallback": 0}, {"size": 4, "fallback": float("nan")}, {"size": 4, "x": 1}]


@pytest.mark.parametrize("settings", BAD)
def test_bad_settings_are_refused_naming_them(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="the cohort variant"):
        make_predictor(SumModel(), settings)
