"""The decision's real side: the turns of the loop against the default, on the real server, in interleaved pairs.

The head-to-head (``python -m benchmarks.peers``, :data:`RIG_ARGS`) runs the default (``ours``: the README's
settings, ``Deadline(0)`` at its default turns) and ``ours-turns0``, ``ours-turns4``, ``ours-turns16``,
``ours-turns32`` round after round, each round on servers started afresh, the variants' order rotating: in a closed
loop of 8 and of 64 connections (wrk) and under Poisson arrivals at 50 and 90 % of the default's open-loop capacity
(a ramp finds it). Each round pairs every variant with the default in each :class:`Cell`: the ratio of its **served
throughput** (answers a second within the measured time) and of its **p99** to the default's. The sign test (exact
binomial, two-sided) says how often two alike variants would split the pairs at least as unevenly; a split it finds
unlikely (``p < ALPHA``) is **significant**, and its direction is the real answer the simulator must agree with.

``ours-turns4`` is the default's own setting given explicitly, on a server of its own: a control. Its ratios can
only be the rig's (the order of the variants, one process against another); a significant one says the rig is
biased, and the simulator, which runs the two alike, cannot agree with it.

A pair whose open-loop step failed a request (a p99 past the timeout: the rate was past that server's capacity) has
no p99 ratio: p99 is compared within capacity only. An open-loop step whose generator did not keep to its schedule
(``held`` false: it lagged, so the arrivals were not the ones asked for) pairs with nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.openloop.report import read_csv as read_open_csv
from benchmarks.openloop.report import sign_test
from benchmarks.openloop.steps import OpenStep
from benchmarks.peers.load import Step
from benchmarks.peers.report import read_csv as read_closed_csv

__all__ = [
    "ALPHA",
    "CELLS",
    "DEFAULT",
    "METRICS",
    "MIN_PAIRS",
    "REAL_CLOSED",
    "REAL_OPEN",
    "RIG_ARGS",
    "TURNS",
    "Cell",
    "Paired",
    "default_policy",
    "paired",
    "read",
    "real_name",
]

HERE = Path(__file__).resolve().parent
#: Where the paired real runs' steps are kept (``python -m benchmarks.policy.validate`` copies them there).
REAL_CLOSED = HERE / "measured" / "turns-closed.csv"
REAL_OPEN = HERE / "measured" / "turns-open.csv"

#: The turns compared with the default's (whatever the default is: ``ours`` runs the package's own; 4, its turns
#: today, is the control).
TURNS = (0, 4, 16, 32)
#: The real rig's name for the default.
DEFAULT = "ours"
#: A split of the pairs this unlikely between alike variants is significant.
ALPHA = 0.05
#: The fewest pairs per cell the issue asks for (with six, only a clean sweep is significant: p = 0.03).
MIN_PAIRS = 6
METRICS = ("served", "p99")  # served: higher is better; p99: lower is better
#: The head-to-head's options for the decision's runs (``--rounds``, ``--out-dir`` and ``--report`` come apart).
RIG_ARGS = (
    "--variants", "ours", *(a for t in TURNS for a in ("--ours", f"turns{t}:turns={t}")), "--no-greedy",
    "--modes", "closed,open", "--connections", "8,64", "--seconds", "5", "--warmup", "2",
    "--shapes", "poisson", "--fractions", "0.5,0.9", "--open-seconds", "5", "--open-warmup", "1",
    "--saturation-from", DEFAULT, "--taskset-server", "1", "--taskset-load", "0",
)  # fmt: skip


def default_policy() -> tuple[str, int]:
    """The policy a batcher gets at the README's settings (the real rig's ``ours``), and its turns."""
    from async_batcher import AsyncBatcher

    class Probe(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return batch

    policy = Probe(max_batch_size=256, max_queue_time=0, max_queue_size=4096).policy
    return repr(policy), int(policy.turns)


def real_name(turns: int) -> str:
    """The real rig's name for the variant at ``turns`` turns."""
    return f"ours-turns{turns}"


@dataclass(frozen=True)
class Cell:
    """Where the decision is checked: a closed loop of ``level`` connections, or Poisson arrivals at ``level`` of
    the default's open-loop capacity."""

    kind: str  # "closed" or "poisson"
    level: float

    @property
    def name(self) -> str:
        return f"closed {self.level:g}" if self.kind == "closed" else f"Poisson {self.level * 100:.0f} %"


CELLS = (Cell("closed", 8), Cell("closed", 64), Cell("poisson", 0.5), Cell("poisson", 0.9))


@dataclass(frozen=True)
class Paired:
    """One variant against the default in one cell, on one metric: the rounds' ratios (the variant's over the
    default's), how many were higher and lower (a tie counts in neither), and the sign test's probability."""

    cell: Cell
    turns: int
    metric: str
    ratios: list[float]
    higher: int
    lower: int

    @property
    def p(self) -> float:
        return sign_test(self.higher, self.higher + self.lower)

    @property
    def significant(self) -> bool:
        return self.higher + self.lower > 0 and self.p < ALPHA

    @property
    def sign(self) -> int:
        """+1: the variant's figure is higher, -1: lower (significant or not); 0: an even split."""
        return (self.higher > self.lower) - (self.higher < self.lower)

    @property
    def median(self) -> float:
        return statistics.median(self.ratios) if self.ratios else math.nan


def _ratio(a: float, b: float) -> float | None:
    """``a / b``; None where it tells nothing (both infinite, or not positive)."""
    if math.isinf(a) and math.isinf(b):
        return None
    if math.isinf(a):
        return math.inf
    return a / b if b > 0 and a >= 0 else None


def _count(cell: Cell, turns: int, metric: str, ratios: Iterable[float]) -> Paired:
    kept = list(ratios)
    return Paired(cell, turns, metric, kept, sum(r > 1 for r in kept), sum(r < 1 for r in kept))


def _in_cell(step: OpenStep, cell: Cell) -> bool:
    """A step of the Poisson sweep at the cell's fraction of the capacity (the rig rounds the rate a little) whose
    generator kept to its schedule."""
    fraction = step.fraction
    near = fraction is not None and abs(fraction - cell.level) <= 0.01 * cell.level
    return step.scenario == "sweep" and step.shape == "poisson" and near and step.held


def paired(closed: list[Step], open_steps: list[OpenStep]) -> list[Paired]:
    """Every (cell, turns, metric) of :data:`CELLS` x :data:`TURNS` x :data:`METRICS` that the steps pair."""
    out = []
    for cell in CELLS:
        for turns in TURNS:
            name = real_name(turns)
            served: list[float] = []
            p99: list[float] = []
            if cell.kind == "closed":
                mine = {(s.round, s.variant): s for s in closed if s.connections == cell.level}
                for (rnd, variant), step in mine.items():
                    ref = mine.get((rnd, DEFAULT))
                    if variant != name or ref is None:
                        continue
                    for into, a, b in ((served, step.rps, ref.rps), (p99, step.p99_ms, ref.p99_ms)):
                        r = _ratio(a, b)
                        if r is not None:
                            into.append(r)
            else:
                sweep = {(s.round, s.variant): s for s in open_steps if _in_cell(s, cell)}
                for (rnd, variant), o in sweep.items():
                    base = sweep.get((rnd, DEFAULT))
                    if variant != name or base is None:
                        continue
                    r = _ratio(o.answered_rps, base.answered_rps)
                    if r is not None:
                        served.append(r)
                    if not (o.errors + o.timeouts or base.errors + base.timeouts):  # p99 within capacity only
                        r = _ratio(o.p99_ms, base.p99_ms)
                        if r is not None:
                            p99.append(r)
            out += [_count(cell, turns, "served", served), _count(cell, turns, "p99", p99)]
    return out


def read(closed_csv: Path, open_csv: Path) -> tuple[list[Step], list[OpenStep]]:
    """The real runs' steps (either file may be missing: no steps of that kind)."""
    closed = read_closed_csv(closed_csv) if closed_csv.is_file() else []
    open_steps = read_open_csv(open_csv) if open_csv.is_file() else []
    return closed, open_steps
