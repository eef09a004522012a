"""What the simulated clients send: a :class:`Scenario`, and the seeded streams of its arrivals, think times and keys.

Every stream has a random generator of its own, seeded from the scenario's seed and the stream's name (the open
loop's arrivals; each closed-loop client's think times and keys), so that every variant of a scenario meets the same
traffic: the k-th request of client i thinks the same time and carries the same key whatever the batcher did before.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass

__all__ = ["KINDS", "SHAPES", "Keys", "Scenario", "open_arrivals"]

KINDS = ("open", "closed", "mixed")
SHAPES = ("poisson", "onoff")


@dataclass(frozen=True)
class Scenario:
    """One traffic pattern. ``open``: arrivals at ``rate`` a second on average (``shape``: Poisson, or Poisson at
    ``rate * (on + off) / on`` during ``on`` seconds out of every ``on + off``); ``closed``: ``clients`` that each
    send their next request once they have their answer, after a think time (0, or exponential of mean ``think``);
    ``mixed``: both at once. ``keys`` > 0: each request's key is drawn from a Zipf law of exponent ``zipf`` over that
    many keys (items of different keys never share a batch). Latency and throughput count the requests sent in
    ``[warmup, duration)``; nothing is sent after ``duration``, and the run ends when every request is answered."""

    name: str
    kind: str
    rate: float = 0.0
    shape: str = "poisson"
    on: float = 0.05
    off: float = 0.15
    clients: int = 0
    think: float = 0.0
    keys: int = 0
    zipf: float = 1.1
    duration: float = 10.0
    warmup: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"scenario {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.shape not in SHAPES:
            raise ValueError(f"scenario {self.name!r}: shape {self.shape!r} is not one of {SHAPES}")
        if self.kind in ("open", "mixed") and self.rate <= 0:
            raise ValueError(f"scenario {self.name!r}: an open loop needs a rate > 0, got {self.rate}")
        if self.kind in ("closed", "mixed") and self.clients < 1:
            raise ValueError(f"scenario {self.name!r}: a closed loop needs clients >= 1, got {self.clients}")
        if not 0 <= self.warmup < self.duration:
            raise ValueError(
                f"scenario {self.name!r}: needs 0 <= warmup < duration, got {self.warmup}, {self.duration}"
            )

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def stream(self, name: str) -> random.Random:
        """The random generator of the stream ``name`` (seeded by the scenario's seed and that name alone)."""
        return random.Random(f"{self.seed}/{name}")


def open_arrivals(scenario: Scenario) -> Iterator[float]:
    """The open loop's send times, increasing, up to the scenario's duration."""
    rng = scenario.stream("open")
    if scenario.shape == "poisson":
        rate, t = scenario.rate, 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= scenario.duration:
                return
            yield t
    on, period = scenario.on, scenario.on + scenario.off
    peak = scenario.rate * period / on
    busy = 0.0  # time spent in "on" phases so far: the Poisson process runs on it
    while True:
        busy += rng.expovariate(peak)
        t = (busy // on) * period + busy % on
        if t >= scenario.duration:
            return
        yield t


class Keys:
    """Keys ``0 .. n-1`` drawn from a Zipf law of exponent ``s`` (key 0 the most frequent) with ``rng``."""

    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        self._cumulative = list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(n)))
        self._total = self._cumulative[-1]
        self._rng = rng

    def next(self) -> int:
        return bisect.bisect_right(self._cumulative, self._rng.random() * self._total)
