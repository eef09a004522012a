"""The dispatch simulator (``python -m benchmarks.policy``): its loop's clock, the loop and the model sharing one
core or running on two, analysable cases against their exact answers, a variant's keyword arguments evaluated anew
for each batcher, and a quick run's report (its structure, and the same numbers from the same seed, other numbers
from another). No peers: their environments need PyPI."""

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


def _shared(cores: float, job: float, start: float, spend: float, gil: float = 0.0) -> tuple[float, float]:
    """A model job of ``job`` CPU seconds submitted at 0, and the loop's ``spend`` seconds of CPU from ``start``, on
    ``cores``, the job holding the interpreter's lock for the share ``gil`` of its time: when the loop's work ends,
    and when the job's result reaches the loop."""
    loop = SimLoop(clock="asyncio", cores=cores, gil=gil)
    loop.default_executor.cost = lambda: job
    ends: dict[str, float] = {}

    def work() -> None:
        loop.spend(spend)
        ends["loop"] = loop.now

    async def main() -> None:
        loop.at(start, work)
        await loop.run_in_executor(None, lambda: None)
        ends["job"] = loop.now
        await asyncio.sleep(max(0.0, start + 2 * spend - loop.now) + 0.1)

    loop.run_until_complete(main())
    loop.close()
    return ends["loop"], ends["job"]


@pytest.mark.parametrize(
    ("cores", "job", "start", "spend", "loop_end", "job_end"),
    [
        # Two cores: neither waits.
        (2.0, 1.0, 0.1, 0.4, 0.5, 1.0),
        # One core: from 0.1 to 0.9 each gets half of it, the loop's 0.4 s then the job's 0.4 s; the job's last
        # 0.5 s alone after that. Each is late by the CPU the other took beside it.
        (1.0, 1.0, 0.1, 0.4, 0.9, 1.4),
        # The job ends while the loop works (its last 0.1 s shared: 0.2 s of wall time): the loop learns it once its
        # callback is done.
        (1.0, 0.2, 0.1, 1.0, 1.2, 1.2),
        # 1.5 cores: each gets 0.75 of a core while both work.
        (1.5, 1.0, 0.1, 0.4, 0.1 + 0.4 / 0.75, 0.1 + 0.4 / 0.75 + 0.5),
    ],
)
def test_the_loop_and_the_model_share_the_cores(
    cores: float, job: float, start: float, spend: float, loop_end: float, job_end: float
) -> None:
    assert _shared(cores, job, start, spend) == pytest.approx((loop_end, job_end), rel=0, abs=1e-12)


@pytest.mark.parametrize(
    ("cores", "gil", "loop_end", "job_end"),
    [
        (2.0, 0.0, 0.5, 1.0),  # two cores, the lock never held: neither waits
        (2.0, 1.0, 0.9, 1.4),  # the model holds the lock all the time: they take turns, as on one core
        (2.0, 0.5, 0.1 + 0.4 * 1.5, 0.1 + 0.4 * 1.5 + 0.5),  # each gets 1 / (1 + 0.5) of the time beside the other
        (1.0, 0.5, 0.9, 1.4),  # one core binds first: the lock changes nothing
    ],
)
def test_the_models_hold_on_the_lock_slows_the_loop_beside_it(
    cores: float, gil: float, loop_end: float, job_end: float
) -> None:
    assert _shared(cores, 1.0, 0.1, 0.4, gil) == pytest.approx((loop_end, job_end), rel=0, abs=1e-12)


def test_fewer_than_one_core_is_refused() -> None:
    with pytest.raises(ValueError, match="cores must be 1 or more"):
        SimLoop(cores=0.5)


@pytest.mark.parametrize("cores", [1.0, 2.0])
def test_one_client_without_think_time_waits_exactly_the_costs(cores: float) -> None:
    """One closed-loop client on an idle batcher: every request costs the loop read + pre + submit + post, the model
    a + b (one item), the network net: nothing else, to the nanosecond, on one core as on two (the model never runs
    while the loop works)."""
    scenario = Scenario("one", "closed", clients=1, duration=1.0, warmup=0.1)
    make = adapter_factory("ours", worker.kwargs_maker("ours", RECOMMENDED.kwargs, ""))
    result = run(scenario, COSTS, make, clock="asyncio", cores=cores)
    c = COSTS
    expected = c.net + c.read + c.pre + c.submit + c.model_a + c.model_b + c.post
    assert result.p50 == pytest.approx(expected, rel=0, abs=1e-9)
    assert result.p999 == pytest.approx(expected, rel=0, abs=1e-9)
    assert result.items_per_call == 1.0
    assert result.throughput == pytest.approx(1 / expected, rel=0.01)
    assert result.wall_clock_reads == 0


def test_on_one_core_two_cohorts_that_alternate_gain_nothing() -> None:
    """Eight clients, batches formed at once (no turns): they split into two cohorts of four, one in the model while
    the loop serves the other. On two cores that overlap is free; on one, the loop pays for the model's time, and
    two model calls per round cost more than one: fewer requests a second than on two cores, and than one cohort of
    eight (four turns) on one core."""
    scenario = Scenario("eight", "closed", clients=8, duration=1.0, warmup=0.2)

    def rps(kwargs: str, cores: float) -> tuple[float, float]:
        setup = "from async_batcher.policies import Deadline"
        result = run(scenario, COSTS, adapter_factory("ours", worker.kwargs_maker("ours", kwargs, setup)), cores=cores)
        return result.throughput, result.items_per_call

    split = "max_batch_size=256, policy=Deadline(0, turns=0)"
    (two, two_ipc), (one, one_ipc) = rps(split, 2.0), rps(split, 1.0)
    together, together_ipc = rps("max_batch_size=256, policy=Deadline(0, turns=4)", 1.0)
    assert two_ipc == pytest.approx(4, abs=0.2) and one_ipc == pytest.approx(4, abs=0.2) and together_ipc > 6
    assert one < 0.8 * two
    assert one < 0.9 * together


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
    cmd = [sys.executable, "-m", "benchmarks.policy", "--quick", "--no-peers", "--no-validation", "--no-sensitivity"]
    cmd += ["--out-dir", str(out), *extra]
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
    headings = ["## Status", "## The simulated server", "## Calibration", "## Targets (issue 44)", "### recommended"]
    headings += ["### constructor-defaults", "## Candidates for the default", "## Which setting serves which traffic"]
    headings += ["## Per scenario"]
    for heading in headings:
        assert heading in md, heading
    scenarios = {"poisson-50", "closed-8", "keyed-poisson-50"}
    variants = {"recommended", "constructor-defaults", "greedy", "wait2ms", "wait0ms+hold2ms", "wait2ms+hold2ms"}
    variants |= {"greedy-turns0", "greedy-turns32"}  # candidates, not in the grid
    assert {(r["scenario"], r["variant"], r["seed"]) for r in rows} == {
        (s, v, seed) for s in scenarios for v in variants for seed in ("1", "2")
    }
    assert {r["role"] for r in rows if r["variant"].startswith("greedy-turns")} == {"candidate"}
    for r in rows:
        assert int(r["answered"]) > 0 and float(r["throughput"]) > 0, r
        assert r["wall_clock_reads"] == "0", r
    for s in scenarios:
        assert f"### {s}:" in md
        assert any(line.startswith(f"| {s} |") and ("PASS" in line or "FAIL" in line) for line in md.splitlines())
