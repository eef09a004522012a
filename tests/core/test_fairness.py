"""Keys take turns: with random keys, arrivals, slots and waits, no key that is due waits while another key goes
more than twice (the due key served longest ago goes first; a key never served counts from when it came)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_batcher.testing import run
from tests.batchers import Recording


class Keyed(Recording):
    def batch_key(self, item: Any) -> Hashable:
        return item[0]


arrivals = st.lists(
    st.tuples(st.integers(0, 29), st.floats(0, 0.3, allow_nan=False)),  # (key, arrival time)
    min_size=1,
    max_size=60,
)


# A stream of new keys (one a user): n of them, one every `gap` seconds from `start`.
streams = st.tuples(st.integers(0, 25), st.sampled_from([0.003, 0.01, 0.03]), st.floats(0, 0.05)).map(
    lambda s: [(100 + i, s[2] + i * s[1]) for i in range(s[0])]
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=st.tuples(arrivals, streams).map(lambda a: a[0] + a[1]),
    slots=st.integers(1, 3),
    wait=st.sampled_from([0.0, 0.005, 0.02]),
    size=st.integers(1, 4),
    delay=st.sampled_from([0.003, 0.01, 0.03]),
)
def test_no_due_key_waits_while_another_goes_more_than_twice(
    arrivals: list[tuple[int, float]], slots: int, wait: float, size: int, delay: float
) -> None:
    async def main() -> list[tuple[Any, float, list[Any]]]:
        b = Keyed(max_queue_time=wait, concurrency=slots, max_batch_size=size, delay=delay)
        loop = asyncio.get_running_loop()

        async def call(key: int, at: float, n: int) -> Any:
            await asyncio.sleep(at)
            return await b.process((key, n, loop.time()))

        results = await asyncio.gather(*(call(k, at, n) for n, (k, at) in enumerate(arrivals)))
        await b.stop()
        assert len(results) == len(arrivals)
        return [(batch[0][0], at, batch) for batch, at in zip(b.batches, b.started_at, strict=True)]

    log = run(main())
    # For each batch: since when its lane was due (its oldest item's deadline, max_queue_time after it arrived, or
    # the lane's previous batch, if later: items of one key go first come, first served), and the batches of other
    # keys that went meanwhile. Each other key goes at most twice; and a key that goes first had an item waiting by
    # the first dispatch after that moment (a key that only came later waits its turn), but for as many batches as
    # there are slots (passes in progress).
    for i, (key, started, items) in enumerate(log):
        since = max([min(item[2] for item in items) + wait] + [at for k, at, _ in log[:i] if k == key])
        window = [(other, at, batch) for other, at, batch in log[:i] if other != key and since < at < started]
        if not window:
            continue
        horizon = window[0][1]
        others: dict[Hashable, int] = {}
        for other, _, _ in window:
            others[other] = others.get(other, 0) + 1
        late = [other for other, _, batch in window if min(item[2] for item in batch) > horizon]
        assert max(others.values()) <= 2, (key, since, started, others)
        assert len(late) <= slots, (key, since, started, late)
