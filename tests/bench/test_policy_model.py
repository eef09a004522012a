"""The dispatch simulator's model of the real server (issue 52, section 3): a loop iteration costs a turn, the
model's thread holds the interpreter's lock for a share of its time, the core count is fitted to the measured closed
loops, the constants are scaled to the saturated loop, and the measurement refuses a busy machine."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.policy import fit, measure, quiet, worker
from benchmarks.policy.sim.batchers import adapter_factory
from benchmarks.policy.sim.server import Costs, run
from benchmarks.policy.sim.traffic import Scenario
from benchmarks.policy.sim.vloop import SimLoop

pytestmark = pytest.mark.single_loop

COSTS = Costs(read=5e-5, pre=2e-4, post=1e-4, submit=1.5e-4, model_a=9e-4, model_b=6e-6, net=6e-5)
POLICIES = "from async_batcher.policies import Deadline"


# ---------------------------------------------------------------------------------------------- the turn's cost


def test_every_iteration_that_runs_a_callback_costs_the_loop_a_turn() -> None:
    loop = SimLoop(clock="asyncio", turn=0.001)
    ran: list[float] = []

    def link(left: int) -> None:
        ran.append(loop.now)
        if left:
            loop.call_soon(link, left - 1)

    loop.call_soon(link, 9)
    loop.run_until_complete(asyncio.sleep(0.5))  # idle from the chain's end: the clock jumps, no turn is spent
    loop.close()
    # Each link is the only callback of its iteration: it runs after that iteration's turn.
    assert ran == pytest.approx([0.001 * (i + 1) for i in range(10)], abs=1e-12)
    assert loop.busy == pytest.approx(0.001 * loop.iterations)


def test_turns_cost_time_so_more_turns_can_lose() -> None:
    """Eight closed-loop clients on one core: with turns free, 32 turns serve as many requests a second as 4 or more
    (a batch of all eight); at a dear turn, the 32 turns' iterations, most with nothing else to do, cost the loop
    more than the fuller batches save."""
    scenario = Scenario("c8", "closed", clients=8, duration=1.0, warmup=0.2)

    def rps(turns: int, turn: float) -> float:
        kwargs = f"max_batch_size=256, policy=Deadline(0, turns={turns})"
        make = adapter_factory("ours", worker.kwargs_maker("ours", kwargs, POLICIES))
        costs = Costs(**{**COSTS.as_dict(), "turn": turn})
        return run(scenario, costs, make, clock="uvloop", cores=1.0).throughput

    assert rps(32, 0.0) >= rps(4, 0.0)
    assert rps(32, 3e-5) < 0.9 * rps(4, 3e-5)


def test_the_clock_chooses_the_turn_measured_on_its_loop() -> None:
    costs = Costs(**{**COSTS.as_dict(), "turn": 3e-6, "turn_asyncio": 7e-6})
    assert (costs.turn_of("uvloop"), costs.turn_of("asyncio")) == (3e-6, 7e-6)


# ------------------------------------------------------------------------------------------ the interpreter's lock


def test_the_lock_bounds_the_capacity_and_bad_shares_are_refused() -> None:
    held = Costs(**{**COSTS.as_dict(), "gil": 1.0})
    assert held.capacity(256, cores=2.0) == pytest.approx(COSTS.capacity(256, cores=1.0))
    assert COSTS.capacity(256, cores=2.0) > held.capacity(256, cores=2.0)
    assert held.scaled("gil", 2.0).gil == 1.0  # a share stays one at most
    assert COSTS.scaled("read", 0.5).read == COSTS.read / 2
    for bad in ({"gil": 1.5}, {"turn": -1e-6}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SimLoop(**bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- the fitted cores


def test_the_fit_keeps_the_core_count_nearest_the_measured_figures() -> None:
    points = [(1, 1000.0, 0.001), (64, 4000.0, 0.016)]
    sims = {1: {"throughput": 1000.0, "p50": 0.001}, 64: {"throughput": 4000.0 * math.e, "p50": 0.016}}
    assert fit.error(sims, points) == pytest.approx(0.5)  # one of the four logarithms is 1
    assert fit.error({1: sims[1]}, points) == math.inf  # a point not simulated
    assert fit.choose({1.0: 0.3, 1.5: 0.1, 2.0: 0.1}) == 1.5  # the least error; a tie to the fewer cores
    with pytest.raises(ValueError, match="no core count"):
        fit.choose({1.0: math.inf})
    measured = {"measured": {"steps": [{"connections": 8, "rps": 2000.0, "p50_ms": 4.0}]}}
    assert fit.targets(measured) == [(8, 2000.0, 0.004)]


def test_the_fit_finds_the_core_count_a_simulation_ran_on() -> None:
    """The figures of a simulation on 1.5 cores, fitted: the fit gives 1.5 back."""
    truth = [(c, *_closed(c, 1.5)) for c in (8, 64)]
    best, table = fit.fit(COSTS, truth, cores=(1.0, 1.5, 2.0), duration=1.0, workers=1)
    assert best == 1.5
    assert [row["cores"] for row in table] == [1.0, 1.5, 2.0] and table[1]["error"] == pytest.approx(0.0, abs=1e-12)


def _closed(clients: int, cores: float) -> tuple[float, float]:
    from benchmarks.policy.variants import RECOMMENDED

    make = adapter_factory("ours", worker.kwargs_maker("ours", RECOMMENDED.kwargs, ""))
    result = run(Scenario(f"fit-closed-{clients}", "closed", clients=clients, duration=1.0, warmup=0.1), COSTS, make,
                 cores=cores)  # fmt: skip
    return result.throughput, result.p50


# ------------------------------------------------------------------------------- the constants, scaled to the loop


def _probe(requests: int, calls: int, loop_cpu: float, read: float, pre: float, post: float, wait: float) -> dict:  # type: ignore[type-arg]
    ns = 1e9 * requests
    return {
        "requests": requests, "read_cpu_ns": read * ns, "pre_cpu_ns": pre * ns, "post_cpu_ns": post * ns,
        "wait_cpu_ns": wait * ns, "loop_cpu_ns": loop_cpu * ns, "batches": [[requests // calls, 2_000_000]] * calls,
        "waits": [1_000_000] * 4, "servers": [1_200_000] * 4,
    }  # fmt: skip


def test_derive_scales_read_pre_post_to_the_saturated_loop_less_its_per_batch_part() -> None:
    steps = [
        {"connections": 0, "model": [[n, 1_000_000 + 5_000 * n] for n in (1, 2, 4, 8) for _ in range(3)]},
        {"connections": -1, "turns": {"uvloop": 3e-6, "asyncio": 6e-6}},
        {"connections": 1, "wrk": {"p50_ms": 1.3}, "probe": _probe(100, 100, 5.5e-4, 5e-5, 2e-4, 1e-4, 1.5e-4)},
        {"connections": 64, "wrk": {"p50_ms": 15.0}, "probe": _probe(6400, 100, 2.0e-4, 1e-5, 1e-4, 8e-5, 2e-4)},
        {"connections": -2, "gil": {"gil": 0.3}},
    ]
    costs = measure.derive(steps)
    # At 64 connections: 200 µs of loop CPU per request, less the batch's 150 µs over its 64 items.
    assert costs["read"] + costs["pre"] + costs["post"] == pytest.approx(2.0e-4 - 1.5e-4 / 64)
    # The parts keep one connection's proportions; submit stays one connection's.
    assert costs["read"] / costs["pre"] == pytest.approx(5e-5 / 2e-4) and costs["submit"] == pytest.approx(1.5e-4)
    assert (costs["turn"], costs["turn_asyncio"], costs["gil"]) == (3e-6, 6e-6, 0.3)
    assert costs["derived_from"]["scaled"]["connections"] == 64
    assert costs["model_b"] == pytest.approx(5e-6)


# ------------------------------------------------------------------------------------------- the busy machine


def _snap(at: float, ticks: dict[int, tuple[str, int]], parents: dict[int, int], machine: int = 0) -> quiet.Snapshot:
    return quiet.Snapshot(at, ticks, parents, (machine, 1000 * int(at)) if machine else None, None)


def test_the_quiet_check_counts_every_process_but_this_tree() -> None:
    before = _snap(1.0, {1: ("init", 10), 50: ("me", 0), 51: ("child", 0), 60: ("tests", 100)}, {50: 1, 51: 50})
    after = _snap(3.0, {1: ("init", 10), 50: ("me", 300), 51: ("child", 150), 60: ("tests", 180), 70: ("new", 4)},
                  {50: 1, 51: 50, 60: 1, 70: 1})  # fmt: skip
    seen = quiet.judge(before, after, me=50, hz=100, cpus=2, limit=25)
    # tests: 80 ticks in 2 s = 40 % of a core; new (began meanwhile): 4 ticks = 2 %; this process and its child
    # not counted.
    assert seen.top == [(60, "tests", 40.0), (70, "new", 2.0)]
    assert seen.others == pytest.approx(42.0) and not seen.ok
    assert "tests (pid 60) 40.0 %" in seen.describe() and "limit 25 %" in seen.describe()
    assert quiet.judge(before, after, me=50, hz=100, cpus=2, limit=50).ok
    # A pid that now names another process: all its CPU is new.
    reused = _snap(3.0, {60: ("other", 30)}, {60: 1})
    assert quiet.judge(before, reused, me=50, hz=100, cpus=2).top == [(60, "other", 15.0)]


def test_the_quiet_check_counts_the_machines_busy_time_that_no_process_shows() -> None:
    """Processes that came and went between the readings show in the machine's busy ticks only."""
    before = _snap(1.0, {50: ("me", 0)}, {50: 1}, machine=100)
    after = _snap(2.0, {50: ("me", 0)}, {50: 1}, machine=600)  # 500 of the 1000 ticks busy, on 2 CPUs
    seen = quiet.judge(before, after, me=50, hz=100, cpus=2)
    assert seen.others == pytest.approx(100.0) and seen.top == [] and not seen.ok


def test_the_quiet_check_refuses_high_steal() -> None:
    before = quiet.Snapshot(1.0, {}, {}, None, (0, 1000))
    after = quiet.Snapshot(2.0, {}, {}, None, (100, 2000))
    seen = quiet.judge(before, after, me=1, hz=100, cpus=2)
    assert seen.steal == pytest.approx(10.0) and not seen.ok and "steal 10.0 %" in seen.describe()


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc")
def test_a_busy_machine_is_refused_naming_the_process_that_keeps_it_busy() -> None:
    """A process outside this one's tree spins: the check sees it, and refuses, saying so."""
    # The grandchild spins (20 s at most); its parent exits at once, so that it is no descendant of this process.
    spin = "import os, time\nif os.fork(): os._exit(0)\nprint(os.getpid(), flush=True)\nos.close(1); os.close(2)\n"
    spin += "end = time.monotonic() + 20\nwhile time.monotonic() < end: pass\n"
    parent = subprocess.run([sys.executable, "-c", spin], capture_output=True, text=True, timeout=30, check=True)
    pid = int(parent.stdout.strip())
    try:
        deadline = time.monotonic() + 10
        while _ticks(pid) < 5 and time.monotonic() < deadline:  # bounded: until it has run a little
            time.sleep(0.05)
        seen = quiet.check(window=1.0, limit=10.0)
        assert seen is not None and not seen.ok
        assert any(p == pid and pct > 10 for p, _, pct in seen.top), seen.describe()
        with pytest.raises(SystemExit, match=rf"the machine is busy: .*\(pid {pid}\)"):
            quiet.require_quiet("timing", allow_busy=False, window=1.0, limit=10.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])
