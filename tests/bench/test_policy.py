"""The dispatch simulator (``python -m benchmarks.policy``): its loop's clock, an analysable case against its exact
answer, a variant's keyword arguments evaluated anew for each batcher, and a quick run's report (its structure, and
the same numbers from the same seed, other numbers from another). No peers: their environments need PyPI."""

from __future__ import annotations

import asyncio
import csv
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.policy import worker
from benchmarks.policy.sim.batchers import adapter_factory
from benchmarks.policy.sim.server import Costs, run
from benchmarks.policy.sim.traffic import Scenario
from benchmarks.policy.sim.vloop import SimLoop
from benchmarks.policy.variants import RECOMMENDED, parse

pytestmark = pytest.mark.single_loop

ROOT = Path(__file__).resolve().parents[2]
COSTS = Costs(read=5e-5, pre=2e-4, post=1e-4, submit=1.5e-4, model_a=9e-4, model_b=6e-6, net=6e-5)


def test_spent_cpu_delays_timers_and_gathers_what_came_meanwhile() -> None:
    loop = SimLoop(clock="asyncio")
    seen: list[tuple[str, float, int]] = []
    iteration = [0]

    def tick() -> None:
        iteration[0] += 1
        if iteration[0] < 5:
            loop.call_soon(tick)

    def busy() -> None:
        seen.append(("busy", loop.time(), iteration[0]))
        loop.spend(1.0)

    def at(name: str) -> None:
        seen.append((name, loop.time(), iteration[0]))

    loop.at(0.0, busy)
    loop.at(0.5, at, "a")
    loop.at(0.7, at, "b")
    loop.call_soon(tick)
    loop.run_until_complete(asyncio.sleep(2))
    loop.close()
    # Both timers fire late, at 1.0, in the same iteration: the one after the callback that spent the second.
    assert seen[1:] == [("a", 1.0, seen[0][2] + 1), ("b", 1.0, seen[0][2] + 1)]
    assert loop.busy == 1.0


def test_the_uvloop_clock_counts_whole_milliseconds() -> None:
    loop = SimLoop(clock="uvloop")
    fired: dict[str, float] = {}
    shown: list[float] = []

    def schedule() -> None:
        shown.append(loop.time())
        for name, delay in (("0.4ms", 0.0004), ("0.6ms", 0.0006), ("1.6ms", 0.0016)):
            loop.call_later(delay, lambda name=name: fired.__setitem__(name, loop.now))

    loop.at(0.0123, schedule)
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()
    assert shown == [0.012]
    assert fired["0.4ms"] == pytest.approx(0.0123)  # rounded to 0: at the next iteration
    assert fired["0.6ms"] == pytest.approx(0.0133)  # 1 ms
    assert fired["1.6ms"] == pytest.approx(0.0143)  # 2 ms


def test_one_client_without_think_time_waits_exactly_the_costs() -> None:
    """One closed-loop client on an idle batcher: every request costs the loop read + pre + submit + post, the model
    a + b (one item), the network net: nothing else, to the nanosecond."""
    scenario = Scenario("one", "closed", clients=1, duration=1.0, warmup=0.1)
    make = adapter_factory("ours", worker.kwargs_maker("ours", RECOMMENDED.kwargs, ""))
    result = run(scenario, COSTS, make, clock="asyncio")
    c = COSTS
    expected = c.net + c.read + c.pre + c.submit + c.model_a + c.model_b + c.post
    assert result.p50 == pytest.approx(expected, rel=0, abs=1e-9)
    assert result.p999 == pytest.approx(expected, rel=0, abs=1e-9)
    assert result.items_per_call == 1.0
    assert result.throughput == pytest.approx(1 / expected, rel=0.01)
    assert result.wall_clock_reads == 0


def test_a_variants_kwargs_are_evaluated_anew_for_each_batcher() -> None:
    variant = parse("fresh:max_queue_time=0, name=f'b{next(counter)}'", "import itertools; counter = itertools.count()")
    make = worker.kwargs_maker(variant.kind, variant.kwargs, variant.setup)
    # kwargs_maker evaluated them once, to check them: then each batcher gets its own.
    assert [make()["name"], make()["name"]] == ["b1", "b2"]
    with pytest.raises(NameError):
        worker.kwargs_maker("ours", "policy=NoSuchPolicy()", "")
    assert parse("recommended") is RECOMMENDED
    with pytest.raises(ValueError, match="not one of"):
        parse("no-such-variant")


def _quick(out: Path, *extra: str) -> tuple[str, list[dict[str, str]]]:
    cmd = [sys.executable, "-m", "benchmarks.policy", "--quick", "--no-peers", "--out-dir", str(out), *extra]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    md = (out / "policy.md").read_text()
    with open(out / "policy.csv", newline="") as f:
        rows = [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(f)]
    return md, rows


def test_quick_run_reports_every_scenario_and_the_same_seed_gives_the_same_numbers(tmp_path: Path) -> None:
    md, rows = _quick(tmp_path / "a")
    _, again = _quick(tmp_path / "b")
    _, other_seed = _quick(tmp_path / "c", "--seed", "2")
    assert rows == again
    assert rows != other_seed
    assert md.splitlines()[0] == "# Dispatch policy on a simulated server (`make bench-policy`)"
    headings = ["## The simulated server", "## Calibration", "## Targets (issue 44)", "### recommended"]
    headings += ["### constructor-defaults", "## Which setting serves which traffic", "## Per scenario"]
    for heading in headings:
        assert heading in md, heading
    scenarios = {"poisson-50", "closed-8", "keyed-poisson-50"}
    variants = {"recommended", "constructor-defaults", "greedy", "wait2ms", "wait0ms+hold2ms", "wait2ms+hold2ms"}
    assert {(r["scenario"], r["variant"]) for r in rows} == {(s, v) for s in scenarios for v in variants}
    for r in rows:
        assert int(r["answered"]) > 0 and float(r["throughput"]) > 0, r
        assert r["wall_clock_reads"] == "0", r
    for s in scenarios:
        assert f"### {s}:" in md
        assert any(line.startswith(f"| {s} |") and ("PASS" in line or "FAIL" in line) for line in md.splitlines())
