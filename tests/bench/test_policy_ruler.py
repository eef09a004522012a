"""The policy ruler's verdicts (issue 52, section 3): the seeds' agreement (UNDECIDED where they differ), served
throughput instead of a p99 past capacity, no setting judged against a grid it belongs to; the paired real runs of
the decision and their sign test; the simulator's agreement with them, which alone makes it decision-grade; and the
sensitivity to each constant."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.openloop.report import sign_test
from benchmarks.openloop.steps import OpenStep
from benchmarks.peers.load import Step
from benchmarks.policy import pairs, sensitivity, validation
from benchmarks.policy.pairs import CELLS, TURNS, Cell
from benchmarks.policy.runner import Run
from benchmarks.policy.sim.traffic import Scenario
from benchmarks.policy.variants import RECOMMENDED, Variant
from benchmarks.policy.verdicts import FAIL, PASS, UNDECIDED, combine, judge, tally

pytestmark = pytest.mark.single_loop

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------- the sign test


@pytest.mark.parametrize(
    ("higher", "pairs", "p"),
    [
        (6, 6, 2 / 64),  # six of six: the least p six pairs can give, and significant
        (0, 6, 2 / 64),
        (5, 6, 2 * 7 / 64),  # five of six: not
        (9, 10, 2 * 11 / 1024),
        (5, 10, 1.0),
        (0, 0, 1.0),  # no pair: nothing to tell
    ],
)
def test_the_sign_test_is_the_exact_two_sided_binomial(higher: int, pairs: int, p: float) -> None:
    assert sign_test(higher, pairs) == pytest.approx(p, rel=1e-12)


# ------------------------------------------------------------------------------------------ the real pairs


def _closed(variant: str, rnd: int, conns: int, rps: float, p99: float) -> Step:
    return Step(variant, rnd, conns, 5.0, int(rps * 5), rps, 1.0, 2.0, p99, 1.5, 2 * p99, 0, 0, 8.0, 99.0, 9.0, 60.0,
                0.0)  # fmt: skip


def _open(
    variant: str, rnd: int, fraction: float, answered: float, p99: float, failed: int = 0, held: bool = True
) -> OpenStep:
    return OpenStep(
        variant=variant, round=rnd, shape="poisson", rate=1000 * fraction, fraction=fraction, scenario="sweep",
        mixed=0, seconds=5.0, scheduled=5000, offered_rps=1000 * fraction, answered_rps=answered, ok=5000 - failed,
        errors=0, timeouts=failed, p50_ms=p99 / 3, p90_ms=p99 / 2, p99_ms=p99, p999_ms=p99, max_ms=p99,
        mean_ms=p99 / 3, lag_p50_ms=0.1, lag_p99_ms=0.5, lag_max_ms=1.0, wait_p99_ms=0.0, max_waiting=0,
        connections=8, schedule_cv=1.0, items_per_call=4.0, server_cpu=80.0, gen_cpu=10.0, machine_busy=60.0,
        held=held,
    )  # fmt: skip


def _find(found: list[pairs.Paired], cell: str, turns: int, metric: str) -> pairs.Paired:
    return next(p for p in found if p.cell.name == cell and p.turns == turns and p.metric == metric)


def test_each_round_pairs_a_variant_with_the_default_in_each_cell() -> None:
    closed = []
    for rnd in range(6):
        closed += [_closed("ours", rnd, 64, 5000.0, 15.0), _closed("ours-turns32", rnd, 64, 4300.0, 21.0)]
        closed += [_closed("ours", rnd, 8, 2000.0, 6.0), _closed("ours-turns32", rnd, 8, 2000.0 + (-1) ** rnd, 6.0)]
    closed.append(_closed("ours-turns32", 7, 64, 9999.0, 1.0))  # the default missed round 7: no pair
    found = pairs.paired(closed, [])
    lost = _find(found, "closed 64", 32, "served")
    assert lost.ratios == [0.86] * 6 and (lost.higher, lost.lower) == (0, 6)
    assert lost.significant and lost.sign == -1 and lost.p == pytest.approx(2 / 64)
    slower = _find(found, "closed 64", 32, "p99")
    assert slower.significant and slower.sign == 1
    even = _find(found, "closed 8", 32, "served")  # three higher, three lower
    assert (even.higher, even.lower) == (3, 3) and not even.significant and even.sign == 0
    tie = _find(found, "closed 8", 32, "p99")  # every pair a tie: counted in neither
    assert (tie.higher, tie.lower, len(tie.ratios)) == (0, 0, 6) and not tie.significant
    assert _find(found, "closed 64", 16, "served").ratios == []  # 16 turns did not run


def test_an_open_loop_pair_compares_p99_within_capacity_only() -> None:
    steps = [
        _open("ours", 0, 0.9, 900.0, 10.0), _open("ours-turns0", 0, 0.9, 880.0, 30.0, failed=3),
        _open("ours", 1, 0.9, 900.0, 10.0), _open("ours-turns0", 1, 0.9, 900.0, 12.0),
        _open("ours", 1, 0.5, 500.0, 5.0), _open("ours-turns0", 1, 0.5, 500.0, 4.0),
        # The generator lagged behind its schedule: a step of other arrivals than asked, paired with nothing.
        _open("ours", 2, 0.5, 500.0, 5.0), _open("ours-turns0", 2, 0.5, 400.0, 50.0, held=False),
    ]  # fmt: skip
    found = pairs.paired([], steps)
    assert _find(found, "Poisson 90 %", 0, "served").ratios == pytest.approx([880 / 900, 1.0])
    assert _find(found, "Poisson 90 %", 0, "p99").ratios == [1.2]  # round 0 failed requests: no p99 ratio
    assert _find(found, "Poisson 50 %", 0, "p99").ratios == [0.8]
    assert _find(found, "Poisson 50 %", 0, "served").ratios == [1.0]


def test_the_real_runs_csvs_read_back_into_the_same_pairs(tmp_path: Path) -> None:
    from benchmarks.openloop.report import write_csv as write_open
    from benchmarks.peers.report import write_csv as write_closed

    closed = [_closed("ours", 0, 8, 2000.0, 6.0), _closed("ours-turns16", 0, 8, 2100.0, 5.0)]
    opened = [_open("ours", 0, 0.5, 500.0, 5.0), _open("ours-turns16", 0, 0.5, 500.0, 6.0)]
    write_closed(tmp_path / "c.csv", closed)
    write_open(tmp_path / "o.csv", opened)
    assert pairs.paired(*pairs.read(tmp_path / "c.csv", tmp_path / "o.csv")) == pairs.paired(closed, opened)
    assert all(not p.ratios for p in pairs.paired(*pairs.read(tmp_path / "none.csv", tmp_path / "none2.csv")))


# ------------------------------------------------------------------------------ the simulator against them


def _sim_result(throughput: float, p99: float, offered: float | None = None) -> dict[str, float]:
    return {"throughput": throughput, "p99": p99, "offered": throughput if offered is None else offered}


def _sims(per: dict[tuple[Cell, int | None], list[tuple[float, float]]], seeds: tuple[int, ...]) -> Any:
    """SimCells where each (cell, turns) not given ran like the default: (served, p99) per seed."""
    results = {}
    for cell in CELLS:
        for t in (None, *TURNS):
            figures = per.get((cell, t), [(1000.0, 10.0)] * len(seeds))
            for seed, (served, p99) in zip(seeds, figures, strict=True):
                results[(cell, t, seed)] = _sim_result(served, p99)
    return validation.SimCells(results, seeds, 1000.0)


def _real(cell: Cell, turns: int, metric: str, higher: int, lower: int) -> pairs.Paired:
    ratios = [1.1] * higher + [0.9] * lower
    return pairs.Paired(cell, turns, metric, ratios, higher, lower)


def _every_cell(short: int = 0) -> list[pairs.Paired]:
    """Six even pairs in every cell (nothing significant), less ``short`` in the first."""
    return [_real(c, t, m, 3, 3 - (short if c == CELLS[0] else 0)) for c in CELLS for t in TURNS
            for m in pairs.METRICS]  # fmt: skip


def test_the_simulator_is_decision_grade_only_where_it_agrees_with_every_significant_real_ratio() -> None:
    c64 = Cell("closed", 64)
    real = [p for p in _every_cell() if not (p.cell == c64 and p.turns == 32)]
    real += [_real(c64, 32, "served", 0, 6), _real(c64, 32, "p99", 6, 0)]  # significant: 32 turns lose there
    seeds = (1, 2, 3)
    agrees = _sims({(c64, 32): [(900.0, 12.0)] * 3}, seeds)
    verdict = validation.agreement(real, validation.simulated(agrees))
    assert verdict.decision_grade and (verdict.checked, verdict.agreed) == (2, 2) and verdict.reasons == []
    # The simulator favours 32 turns there (more served, lower p99): it disagrees with both.
    favours = _sims({(c64, 32): [(1100.0, 8.0)] * 3}, seeds)
    verdict = validation.agreement(real, validation.simulated(favours))
    assert not verdict.decision_grade and verdict.agreed == 0
    assert "disagrees with 2 of the 2 significant real ratios" in verdict.reasons[0]
    # Its seeds disagree: undecided, which is no agreement either.
    split = _sims({(c64, 32): [(900.0, 12.0), (1100.0, 12.0), (900.0, 12.0)]}, seeds)
    table = validation.simulated(split)
    assert table[(c64, 32, "served")].sign == 0 and table[(c64, 32, "p99")].sign == 1
    verdict = validation.agreement(real, table)
    assert not verdict.decision_grade and verdict.agreed == 1


def test_without_enough_pairs_or_a_significant_one_nothing_is_decision_grade() -> None:
    sims = validation.simulated(_sims({}, (1,)))
    none = validation.agreement([], sims)
    assert not none.decision_grade and "no paired real runs" in none.reasons[0]
    flat = validation.agreement(_every_cell(), sims)
    assert not flat.decision_grade and flat.reasons == [
        "no real ratio is significant: nothing tells the simulator's right from wrong"
    ]
    short = validation.agreement(_every_cell(short=1), sims)
    assert "fewer than 6 real pairs in closed 8" in short.reasons[0]


def test_a_p99_past_capacity_is_undecided_in_the_simulation() -> None:
    cell = Cell("poisson", 0.9)
    results = {}
    for t in (None, *TURNS):
        results[(cell, t, 1)] = _sim_result(800.0, 900.0, offered=900.0) if t == 0 else _sim_result(900.0, 10.0)
    for c in CELLS:
        for t in (None, *TURNS):
            results.setdefault((c, t, 1), _sim_result(900.0, 10.0))
    table = validation.simulated(validation.SimCells(results, (1,), 1000.0))
    assert math.isnan(table[(cell, 0, "p99")].ratios[0]) and table[(cell, 0, "p99")].sign == 0
    assert table[(cell, 0, "served")].sign == -1


def test_the_reports_prose_says_not_decision_grade_and_what_the_real_runs_favour() -> None:
    c64, c8 = Cell("closed", 64), Cell("closed", 8)
    real = [p for p in _every_cell() if p.cell not in (c64, c8)]
    real += [_real(c64, t, m, 3, 3) for t in TURNS for m in pairs.METRICS if t != 32]
    real += [_real(c64, 32, "served", 0, 6), _real(c64, 32, "p99", 3, 3)]  # 32 turns: worse at 64
    real += [_real(c8, t, m, 3, 3) for t in TURNS for m in pairs.METRICS if t != 16]
    real += [_real(c8, 16, "served", 6, 0), _real(c8, 16, "p99", 3, 3)]  # 16 turns: better at 8, worse nowhere
    verdict = validation.Agreement(False, ["it disagrees with 1 of the 2 significant real ratios (...)"], 2, 1)
    text = "\n".join(validation.decision_lines(real, verdict, 4))
    assert text.startswith("**Not decision-grade**: it disagrees with 1 of the 2")
    assert "the defaults are chosen from the paired real runs" in text
    assert "- 32 turns: better in no cell; worse in served in closed 64." in text
    assert "- 0 turns: no significant difference in any cell." in text
    assert "favour 16 turns over the default" in text
    assert "- 4 turns (the default's own, on a server of its own: a control): no significant difference" in text
    # The control better than the default: the rig's doing, said so, and no setting favoured for it.
    biased = [p for p in real if p.turns != 4] + [_real(c64, 4, "served", 6, 0)]
    biased += [_real(c, 4, m, 3, 3) for c in CELLS for m in pairs.METRICS if (c, m) != (c64, "served")]
    text = "\n".join(validation.decision_lines(biased, verdict, 4))
    assert "the rig, not the setting, made that difference" in text and "favour 16 turns over" in text
    assert "favour 4 turns" not in text
    grade = validation.Agreement(True, [], 2, 2)
    assert validation.decision_lines(real, grade, 4)[0].startswith("**Decision-grade**")
    assert "No paired real runs yet" in "\n".join(validation.decision_lines([], verdict, 4))


def test_the_simulated_ramp_finds_the_capacity_as_the_real_rig_does() -> None:
    rates = [100.0, 125.0, 156.0, 195.0]
    assert validation.ramp_capacity(200.0, [2.0, 2.1, 2.2, 2.3], rates) == 195.0  # never past the knee
    assert validation.ramp_capacity(200.0, [2.0, 1.5, 7.6, 50.0], rates) == 125.0  # 7.6 > 5 x 1.5
    assert validation.ramp_capacity(200.0, [], []) == 200.0


# ------------------------------------------------------------------------------------------ the sensitivity


def test_a_flipped_ranking_and_side_are_reported() -> None:
    c8 = Cell("closed", 8)
    base = _sims({(c8, 32): [(1100.0, 10.0)], (c8, 16): [(1100.0, 10.0)]}, (1,))
    other = _sims({(c8, 32): [(900.0, 10.0)], (c8, 16): [(1100.0, 10.0)]}, (1,))
    assert sensitivity.rankings(base)[c8] == ("16 turns = 32 turns", "default = 0 turns = 4 turns")
    ranked, sides = sensitivity.flips(base, other)
    before, after = (
        "16 turns = 32 turns > default = 0 turns = 4 turns",
        "16 turns > default = 0 turns = 4 turns > 32 turns",
    )
    assert ranked == [f"closed 8: {before} -> {after}"]
    assert sides == ["32 turns' served in closed 8 (> 1 -> < 1)"]
    assert sensitivity.flips(base, base) == ([], [])
    # A move within 1 %: no flip of the ranking, and no side either way.
    near = _sims({(c8, 32): [(1100.0, 10.0)], (c8, 16): [(1095.0, 10.0)]}, (1,))
    slightly = _sims({(c8, 32): [(995.0, 10.0)], (c8, 16): [(1100.0, 10.0)]}, (1,))
    assert sensitivity.rankings(near)[c8] == ("16 turns = 32 turns", "default = 0 turns = 4 turns")
    assert sensitivity.flips(base, near) == ([], [])
    # 32 turns fall from first to the default's place: no swap with it (a tie), and no side crossed (995/1000).
    assert sensitivity.rankings(slightly)[c8] == ("16 turns", "default = 0 turns = 4 turns = 32 turns")
    assert sensitivity.flips(near, slightly) == ([], [])


# ---------------------------------------------------------------------------------- the seeds' verdicts


def _run(scenario: Scenario, name: str, role: str, throughput: float, p99: float, offered: float = 0.0) -> Run:
    result = {"throughput": throughput, "p99": p99, "offered": offered or throughput}
    return Run(scenario, Variant(name, "ours", "", role), result)


def test_a_target_the_seeds_disagree_on_is_undecided() -> None:
    assert combine([True, True, True]) == PASS
    assert combine([False, False]) == FAIL
    assert combine([True, False, True]) == UNDECIDED
    assert combine([True, None]) == UNDECIDED  # judged at one seed only
    assert combine([None, None]) is None
    closed = [Scenario("c8", "closed", clients=8, seed=s) for s in (1, 2)]
    runs = [
        _run(closed[0], "greedy", "grid", 1000.0, 10.0), _run(closed[0], "wait1ms", "grid", 1000.0, 10.0),
        _run(closed[0], "x", "candidate", 1000.0, 10.5),  # within 1.1x
        _run(closed[1], "greedy", "grid", 1000.0, 10.0), _run(closed[1], "wait1ms", "grid", 1000.0, 10.0),
        _run(closed[1], "x", "candidate", 1000.0, 12.0),  # not
    ]  # fmt: skip
    [j] = judge(runs)
    assert j.verdicts("x") == {"p99": UNDECIDED, "served": PASS}
    assert tally([j], "x") == (1, 0, 1)


def test_a_p99_past_capacity_is_not_judged_the_served_throughput_is() -> None:
    s = Scenario("p130", "open", rate=1300.0)
    runs = [
        _run(s, "greedy", "grid", 1000.0, 900.0, offered=1300.0),  # past capacity: its p99 is the run's length
        _run(s, "wait2ms", "grid", 1100.0, 800.0, offered=1300.0),
        _run(s, "wait5ms", "grid", 1290.0, 50.0, offered=1300.0),  # kept up: the grid's best p99
        _run(s, "slow", "candidate", 700.0, 400.0, offered=1300.0),  # past its capacity: its p99 is not judged
        _run(s, "fast", "candidate", 1300.0, 52.0, offered=1300.0),  # kept up: judged on both
    ]
    [j] = judge(runs)
    assert j.verdicts("slow") == {"served": FAIL}
    assert j.first.p99_ratio("slow") is None and j.first.served_ratio("slow") == pytest.approx(700 / 1290)
    assert j.verdicts("fast") == {"p99": PASS, "served": PASS}
    assert j.first.p99_ratio("fast") == pytest.approx(52 / 50)


def test_no_setting_is_judged_against_a_grid_it_belongs_to() -> None:
    s = Scenario("c64", "closed", clients=64)
    runs = [
        _run(s, "greedy", "grid", 5000.0, 10.0), _run(s, "wait1ms", "grid", 4000.0, 20.0),
        _run(s, RECOMMENDED.name, "recommended", 5000.0, 10.0),
    ]  # fmt: skip
    [j] = judge(runs)
    x = j.first
    # greedy's bar is the rest of the grid; the README's settings are greedy: not their own bar either.
    assert x.best_served("greedy").variant.name == "wait1ms"
    assert x.best_served(RECOMMENDED.name).variant.name == "wait1ms"
    assert x.p99_ratio(RECOMMENDED.name) == pytest.approx(0.5)
    assert x.served_ratio("greedy") == pytest.approx(1.25)
    with pytest.raises(ValueError, match="no setting of the grid"):
        judge([_run(s, "x", "candidate", 1.0, 1.0)])


# ------------------------------------------------------------------------------------------------ the report


def test_a_quick_report_says_it_is_not_decision_grade_and_reads_no_fixed_verdict(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.policy", "--quick", "--no-peers", "--no-calibration", "--seeds", "1",
           "--scenarios", "closed-8", "--sensitivity-constants", "cores", "--duration", "1", "--warmup", "0.2",
           "--out-dir", str(tmp_path),
           "--real-closed", str(tmp_path / "none.csv"), "--real-open", str(tmp_path / "none.csv")]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    md = (tmp_path / "policy.md").read_text()
    for heading in ("## Status", "## Validation: the decision, simulated and real", "## Sensitivity"):
        assert heading in md, heading
    status = md.split("## Status")[1].split("\n## ")[0]
    assert "**Not decision-grade**: no paired real runs" in status and "No paired real runs yet" in status
    assert "calibrated mode" not in md  # the paragraph that asserted one core is gone
    assert "| cores | 0.5 | 1 |" in md and "| cores | 2 | 2 |" in md
    rows = [line for line in md.splitlines() if line.startswith(("| closed 8 |", "| Poisson 90 % |"))]
    assert len(rows) == 2 * len(TURNS) * len(pairs.METRICS)


def test_the_default_the_real_rig_runs_is_the_package_default() -> None:
    from async_batcher.policies import Deadline
    from benchmarks.policy.pairs import default_policy

    policy, turns = default_policy()
    assert turns == Deadline().turns and policy.startswith("Deadline(max_queue_time=0.0")
    assert dataclasses.is_dataclass(Cell)
