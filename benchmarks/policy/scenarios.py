"""The traffic the report covers, at fractions of the simulated server's capacity (:meth:`Costs.capacity`, on the
simulation's cores).

* Poisson arrivals at 10 to 130 % of capacity;
* on/off bursts: Poisson at 120 % of capacity for 50 ms out of every 200 ms (30 % on average), and at 160 % for
  100 ms out of every 400 ms (40 %);
* closed loops of 1, 8, 64 and 256 clients, without think time and with an exponential one (mean 5 ms);
* mixed: Poisson at 30 % beside 8 closed-loop clients without think time (the head-to-head's mixed scenario);
* keyed: Poisson at 50 % over 32 keys drawn from a Zipf law (exponent 1.1; items of different keys never share a
  batch), and 64 closed-loop clients doing the same.
"""

from __future__ import annotations

from typing import Any

from .sim.server import Costs
from .sim.traffic import Scenario

__all__ = ["FRACTIONS", "MAX_BATCH_SIZE", "QUICK", "scenarios"]

MAX_BATCH_SIZE = 256  # the recommended settings' and the grid's: capacity is at full batches of it
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.3)
THINK = 0.005
QUICK = ("poisson-50", "closed-8", "keyed-poisson-50")


def scenarios(
    costs: Costs, *, duration: float = 10.0, warmup: float = 1.0, seed: int = 1, cores: float = 2.0
) -> list[Scenario]:
    capacity = costs.capacity(MAX_BATCH_SIZE, cores)

    def make(name: str, kind: str, **traffic: Any) -> Scenario:
        return Scenario(name, kind, duration=duration, warmup=warmup, seed=seed, **traffic)

    out = [make(f"poisson-{f * 100:.0f}", "open", rate=f * capacity) for f in FRACTIONS]
    out.append(make("onoff-30", "open", rate=0.3 * capacity, shape="onoff", on=0.05, off=0.15))
    out.append(make("onoff-40", "open", rate=0.4 * capacity, shape="onoff", on=0.1, off=0.3))
    for think in (0.0, THINK):
        for clients in (1, 8, 64, 256):
            name = f"closed-{clients}" + (f"-think{think * 1000:g}ms" if think else "")
            out.append(make(name, "closed", clients=clients, think=think))
    out.append(make("mixed-30+8", "mixed", rate=0.3 * capacity, clients=8))
    out.append(make("keyed-poisson-50", "open", rate=0.5 * capacity, keys=32, zipf=1.1))
    out.append(make("keyed-closed-64", "closed", clients=64, keys=32, zipf=1.1))
    return out
