"""The verdicts of ``make bench-policy``: each setting's targets in each scenario, at each seed, and their agreement.

Targets (issue 44), per scenario, against the **grid** (the fixed settings a user can set: ``max_queue_time`` by
``max_hold_time``, the policies' four turns), never counting the setting judged, nor its twin (the README's
settings are the grid's ``greedy``): a setting is not judged against a grid it belongs to.

* ``p99``: at most :data:`P99_RATIO` x the best p99 of the grid's settings that kept up; judged **within capacity**
  only: where the setting kept up (served at least :data:`KEEP_UP` of what was sent within the counted time; a
  closed loop always does), as a p99 past capacity only grows with the run's length;
* ``served``: the served throughput (answers a second within the counted time) at least :data:`SERVED_RATIO` x the
  grid's best: what a setting past its capacity is judged on;
* ``peers``: no peer better (p99 no higher where both kept up; served throughput no lower).

Each scenario runs at every seed; a target met at every seed is PASS, missed at every seed FAIL, and else
UNDECIDED: the seeds' traffic alone decides it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from .runner import Run
from .sim.traffic import Scenario

__all__ = [
    "FAIL",
    "KEEP_UP",
    "P99_RATIO",
    "PASS",
    "SERVED_RATIO",
    "TWINS",
    "UNDECIDED",
    "Judged",
    "Verdicts",
    "combine",
    "judge",
    "kept_up",
    "tally",
]

P99_RATIO = 1.1
SERVED_RATIO = 0.97
KEEP_UP = 0.97
#: Settings that are the same batcher under two names: the README's settings are the grid's ``greedy``.
TWINS = {"recommended": "greedy", "greedy": "recommended"}
PASS, FAIL, UNDECIDED = "PASS", "FAIL", "UNDECIDED"


def kept_up(result: dict[str, float]) -> bool:
    """Whether a run served at least :data:`KEEP_UP` of what was sent within the counted time."""
    return result["offered"] <= 0 or result["throughput"] >= KEEP_UP * result["offered"]


@dataclass
class Verdicts:
    """One scenario at one seed: every variant's run, and the targets against the grid."""

    scenario: Scenario
    runs: dict[str, Run]  # by variant name

    def grid(self, judged: str = "") -> list[Run]:
        """The grid's runs, less ``judged`` and its twin."""
        out = [r for r in self.runs.values() if r.variant.role == "grid"]
        return [r for r in out if r.variant.name not in (judged, TWINS.get(judged))]

    def best_p99(self, judged: str = "") -> Run | None:
        """The grid's lowest p99 among its settings that kept up (ties: the grid's first); None if none did."""
        within = [r for r in self.grid(judged) if kept_up(r.result)]
        return min(within, key=lambda r: r.result["p99"]) if within else None

    def best_served(self, judged: str = "") -> Run:
        grid = self.grid(judged)
        if not grid:
            raise ValueError(f"scenario {self.scenario.name}: no setting of the grid ran")
        return max(grid, key=lambda r: r.result["throughput"])

    def p99_ratio(self, name: str) -> float | None:
        """``name``'s p99 over the grid's best; None where it is not judged (past capacity, or no reference)."""
        best = self.best_p99(name)
        mine = self.runs[name].result
        if best is None or not kept_up(mine):
            return None
        return float(mine["p99"] / best.result["p99"])

    def served_ratio(self, name: str) -> float:
        best = self.best_served(name).result["throughput"]
        return float(self.runs[name].result["throughput"] / best) if best > 0 else 0.0

    def beats(self, name: str, peer: str) -> bool:
        """No worse than ``peer``: not past capacity where it kept up; served throughput no lower (in an open loop,
        within :data:`SERVED_RATIO`: what both serve there is what was sent); p99 no higher where both kept up."""
        ours, theirs = self.runs[name].result, self.runs[peer].result
        if kept_up(theirs) and not kept_up(ours):
            return False
        floor = theirs["throughput"] * (1.0 if self.scenario.kind == "closed" else SERVED_RATIO)
        if ours["throughput"] < floor:
            return False
        return not (kept_up(ours) and kept_up(theirs)) or ours["p99"] <= theirs["p99"]

    def targets(self, name: str, peers: Iterable[str] = ()) -> dict[str, bool]:
        """The targets ``name`` is judged on here, and whether it meets each (module docstring)."""
        out = {}
        ratio = self.p99_ratio(name)
        if ratio is not None:
            out["p99"] = ratio <= P99_RATIO
        out["served"] = self.served_ratio(name) >= SERVED_RATIO
        ran = [p for p in peers if p in self.runs]
        if ran:
            out["peers"] = all(self.beats(name, p) for p in ran)
        return out


def combine(values: list[bool | None]) -> str | None:
    """A target over the seeds: PASS (met at every seed), FAIL (missed at every seed), UNDECIDED (else, or judged
    at some seeds only); None where no seed judged it."""
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        return UNDECIDED
    if all(values):
        return PASS
    return FAIL if not any(values) else UNDECIDED


@dataclass
class Judged:
    """One scenario over every seed."""

    seeds: list[Verdicts]

    @property
    def scenario(self) -> Scenario:
        return self.seeds[0].scenario

    @property
    def first(self) -> Verdicts:
        return self.seeds[0]

    def has(self, name: str) -> bool:
        return all(name in v.runs for v in self.seeds)

    def verdicts(self, name: str, peers: Iterable[str] = ()) -> dict[str, str]:
        """Each target's verdict over the seeds."""
        peers = list(peers)
        per = [v.targets(name, peers) for v in self.seeds]
        keys = [k for k in ("p99", "served", "peers") if any(k in t for t in per)]
        out = {}
        for k in keys:
            combined = combine([t.get(k) for t in per])
            if combined is not None:
                out[k] = combined
        return out

    def serves(self, name: str) -> str:
        """Whether ``name`` meets the grid's targets here (p99 and served): PASS, FAIL or UNDECIDED."""
        found = self.verdicts(name)
        if FAIL in found.values():
            return FAIL
        return UNDECIDED if UNDECIDED in found.values() else PASS

    def median(self, ratio: str, name: str) -> float | None:
        """The median over the seeds of ``p99_ratio`` or ``served_ratio``; None if no seed judges it."""
        values = [getattr(v, ratio)(name) for v in self.seeds]
        kept = [x for x in values if x is not None]
        return statistics.median(kept) if kept else None


def judge(runs: Iterable[Run]) -> list[Judged]:
    """The runs, by scenario (in their order) and seed."""
    by_scenario: dict[str, dict[int, dict[str, Run]]] = {}
    scenario_of: dict[tuple[str, int], Scenario] = {}
    for run in runs:
        s = run.scenario
        by_scenario.setdefault(s.name, {}).setdefault(s.seed, {})[run.variant.name] = run
        scenario_of.setdefault((s.name, s.seed), s)
    out = []
    for name, seeds in by_scenario.items():
        judged = Judged([Verdicts(scenario_of[(name, seed)], runs) for seed, runs in sorted(seeds.items())])
        for v in judged.seeds:
            v.best_served()  # (raises where no setting of the grid ran)
        out.append(judged)
    return out


def tally(judged: list[Judged], name: str, peers: Iterable[str] = ()) -> tuple[int, int, int]:
    """The targets ``name`` meets, misses and leaves undecided over every scenario it ran in."""
    peers = list(peers)
    found = [v for j in judged if j.has(name) for v in j.verdicts(name, peers).values()]
    return found.count(PASS), found.count(FAIL), found.count(UNDECIDED)
