"""Arrival schedules: when each request of an open-loop step is meant to be sent, fixed before the step starts.

A schedule is a sorted list of offsets in seconds from the step's start. It never depends on the answers: that is
what makes the load open-loop. Two shapes:

- **Poisson**: independent users; the gaps between arrivals are exponential with mean ``1 / rate`` (coefficient of
  variation 1).
- **on/off** (bursty): a square wave, ``on`` seconds of Poisson arrivals at ``rate * (on + off) / on``, then ``off``
  seconds of none, so that the mean rate over whole periods is ``rate`` while bursts run several times as fast. The
  gaps' coefficient of variation is above 1 (the off periods are the long gaps).

The same seed gives the same schedule: every variant of a round sees the same arrivals.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass

__all__ = ["Shape", "cv", "offsets", "parse_shape"]


@dataclass(frozen=True)
class Shape:
    """``kind`` is ``poisson`` or ``onoff``; ``on_s`` and ``off_s`` are the on/off square wave's phases."""

    kind: str
    on_s: float = 0.0
    off_s: float = 0.0

    @property
    def name(self) -> str:
        if self.kind == "poisson":
            return "poisson"
        return f"onoff:{self.on_s * 1000:g}/{self.off_s * 1000:g}"  # what parse_shape reads back

    @property
    def peak(self) -> float:
        """The rate during a burst as a multiple of the mean rate (1 for Poisson)."""
        return 1.0 if self.kind == "poisson" else (self.on_s + self.off_s) / self.on_s

    def describe(self) -> str:
        if self.kind == "poisson":
            return "Poisson: exponential gaps, coefficient of variation 1"
        return (
            f"on/off: {self.on_s * 1000:g} ms of Poisson arrivals at {self.peak:g}x the mean rate, then "
            f"{self.off_s * 1000:g} ms of none, repeated"
        )


def parse_shape(text: str) -> Shape:
    """``poisson``, ``onoff`` (50 ms on, 150 ms off) or ``onoff:ON_MS/OFF_MS``; ValueError names a bad one."""
    kind, _, rest = text.strip().partition(":")
    if kind == "poisson" and not rest:
        return Shape("poisson")
    if kind == "onoff":
        on_ms, off_ms = 50.0, 150.0
        if rest:
            try:
                on_ms, off_ms = (float(v) for v in rest.split("/"))
            except ValueError:
                raise ValueError(f"{text!r}: expected onoff:ON_MS/OFF_MS, e.g. onoff:50/150") from None
        if not (on_ms > 0 and off_ms >= 0 and math.isfinite(on_ms + off_ms)):
            raise ValueError(f"{text!r}: the on phase must be > 0 ms and the off phase >= 0 ms")
        return Shape("onoff", on_ms / 1000, off_ms / 1000)
    raise ValueError(f"{text!r}: expected poisson, onoff or onoff:ON_MS/OFF_MS")


def _poisson(rnd: random.Random, rate: float, start: float, end: float, out: list[float]) -> None:
    t = start + rnd.expovariate(rate)
    while t < end:
        out.append(t)
        t += rnd.expovariate(rate)


def offsets(shape: Shape, rate: float, seconds: float, seed: int) -> list[float]:
    """The send times of a step of ``seconds`` at a mean of ``rate`` requests a second, in seconds from its start."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of requests a second, got {rate!r}")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    rnd = random.Random(seed)
    out: list[float] = []
    if shape.kind == "poisson":
        _poisson(rnd, rate, 0.0, seconds, out)
        return out
    period = shape.on_s + shape.off_s
    start = 0.0
    while start < seconds:
        # Each burst draws afresh from where it starts: Poisson within it, nothing in the off phase.
        _poisson(rnd, rate * shape.peak, start, min(start + shape.on_s, seconds), out)
        start += period
    return out


def cv(times: list[float]) -> float:
    """The coefficient of variation of the gaps between consecutive times (nan with fewer than 3 times)."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if len(gaps) < 2:
        return math.nan
    mean = statistics.fmean(gaps)
    return statistics.pstdev(gaps) / mean if mean > 0 else math.nan
