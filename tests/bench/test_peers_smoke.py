"""Smoke test of the head-to-head rig (``python -m benchmarks.peers --quick``) in both modes, closed loop (wrk) and
open loop, for the variants that need no environment of their own: the unbatched server, ours, ours with other
settings given on the command line, and ours-greedy (added for the open loop). Real servers on 127.0.0.1, real wrk,
the real model; no assertion on speed.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.openloop import report as open_report
from benchmarks.peers.__main__ import parse_args

pytestmark = pytest.mark.single_loop

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["none", "ours", "ours-wait", "ours-greedy"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("peers")
    cmd = [sys.executable, "-m", "benchmarks.peers", "--quick", "--variants", "none,ours"]
    cmd += ["--ours", "wait:max_queue_time=0.002", "--out-dir", str(out), "--peers-dir", str(out / "envs")]
    cmd += ["--modes", "closed,open", "--fractions", "0.5"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "peers.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    opened = open_report.read_csv(out / "peers-open.csv")
    return {"out": out, "rows": rows, "open": opened, "md": (out / "peers.md").read_text(encoding="utf-8")}


def test_every_variant_answers_every_step(run: dict[str, Any]) -> None:
    rows = run["rows"]
    assert sorted((r["variant"], int(r["connections"])) for r in rows) == sorted(
        (v, c) for v in VARIANTS for c in (1, 8)
    )
    for r in rows:
        assert int(r["requests"]) > 0 and float(r["rps"]) > 0, r
        assert int(r["errors"]) == 0 and int(r["timeouts"]) == 0, r
        assert 0 < float(r["p50_ms"]) <= float(r["p95_ms"]) <= float(r["p99_ms"]), r
        assert float(r["server_cpu"]) > 0 and float(r["wrk_cpu"]) > 0, r
        assert float(r["others_cpu"]) < 5, r  # the servers not under load are paused


def test_each_app_counts_its_model_calls(run: dict[str, Any]) -> None:
    per_call = {(r["variant"], int(r["connections"])): float(r["items_per_call"]) for r in run["rows"]}
    assert per_call[("none", 1)] == per_call[("none", 8)] == 1.0  # one call per request
    for v in ("ours", "ours-wait"):
        assert 1.0 <= per_call[(v, 1)] <= per_call[(v, 8)] <= 8.0, per_call  # batches, of at most 8 requests


def test_the_open_loop_ran_each_variant_at_half_the_saturation(run: dict[str, Any]) -> None:
    steps = run["open"]
    assert sorted(s.variant for s in steps) == sorted(VARIANTS)  # (the capacity ramp's steps are not the sweep's)
    # The saturation is ours-greedy's open-loop capacity: a rate of its ramp, which stops at its closed-loop maximum.
    line = next(x for x in run["md"].splitlines() if "Saturation (the rates' 100 %)" in x)
    saturation = float(line.split(":", 1)[1].split("req/s")[0].replace(" ", ""))
    greedy_max = max(float(r["rps"]) for r in run["rows"] if r["variant"] == "ours-greedy")
    assert 0 < saturation <= greedy_max + 1, line
    for s in steps:
        assert s.scenario == "sweep" and s.shape == "poisson" and s.fraction == pytest.approx(0.5, abs=0.02), s
        assert s.rate == pytest.approx(saturation / 2, rel=0.02, abs=10), s
        assert s.scheduled > 0 and s.ok + s.errors + s.timeouts == s.scheduled, s


def test_report_says_what_ran(run: dict[str, Any]) -> None:
    md = run["md"]
    assert "All agree within a relative" in md
    for v in VARIANTS:
        assert f"| {v} |" in md
    assert "max_queue_time=0.002" in md  # the settings given on the command line reached the server
    # ours-greedy is plain greedy dispatch: its app takes turns= and builds the Deadline policy with it.
    assert "max_queue_time=0, max_hold_time=0, max_queue_size=4096, turns=0." in md
    assert "## Closed loop (wrk)" in md and "## Open loop, Poisson" in md  # both modes, one report
    assert "## Targets (issue 24)" in md and "| ours | Poisson " in md
    assert "ours-greedy's open-loop capacity: the last rate of a Poisson ramp" in md and "req/s: wrk, " in md
    assert (run["out"] / "peers.png").read_bytes().startswith(b"\x89PNG")
    assert (run["out"] / "peers-open.png").read_bytes().startswith(b"\x89PNG")


def test_settings_on_the_command_line() -> None:
    args = parse_args(["--variants", "none,ours", "--ours", "a:max_queue_time=0.001,max_latency=null"])
    assert args.plan == [
        ("none", "none", {}),
        ("ours", "ours", {}),
        ("ours-a", "ours", {"max_queue_time": 0.001, "max_latency": None}),
        ("ours-greedy", "ours", {"max_queue_time": 0, "max_hold_time": 0, "turns": 0}),  # plain greedy: the reference
    ]
    assert [n for n, _, _ in parse_args(["--variants", "ours", "--modes", "closed"]).plan] == ["ours"]
    given = parse_args(["--variants", "ours", "--ours", "greedy:max_queue_time=0,max_hold_time=0.001"]).plan
    assert given[-1] == ("ours-greedy", "ours", {"max_queue_time": 0, "max_hold_time": 0.001})
    with pytest.raises(SystemExit):  # no saturation reference and none given
        parse_args(["--variants", "ours", "--no-greedy", "--modes", "open"])
    with pytest.raises(SystemExit):
        parse_args(["--modes", "open,sideways"])
    with pytest.raises(SystemExit):
        parse_args(["--shapes", "poisson,lumpy"])
    with pytest.raises(SystemExit):
        parse_args(["--variants", "none", "--settings", "batched:timeout_ms=2"])  # not in the run
    with pytest.raises(SystemExit):
        parse_args(["--variants", "nothing"])


def test_the_cohort_ceiling_runs_one_closed_step_with_its_size_set_to_the_connections() -> None:
    plan = parse_args(["--variants", "ours,cohort", "--modes", "closed", "--connections", "8"]).plan
    assert plan == [("ours", "ours", {}), ("cohort", "cohort", {"size": 8})]
    given = parse_args(
        ["--variants", "cohort", "--modes", "closed", "--connections", "4", "--settings", "cohort:fallback=0.1"]
    )
    assert given.plan == [("cohort", "cohort", {"size": 4, "fallback": 0.1})]
    with pytest.raises(SystemExit):  # its size is the step's connections: one step only
        parse_args(["--variants", "cohort", "--modes", "closed", "--connections", "1,8"])
    with pytest.raises(SystemExit):  # no closed population in the open loop
        parse_args(["--variants", "cohort", "--modes", "closed,open", "--connections", "8", "--saturation", "100"])


def test_the_cohort_ceiling_sends_the_whole_population_in_each_batch(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.peers", "--quick", "--variants", "cohort", "--modes", "closed"]
    cmd += ["--connections", "4", "--out-dir", str(tmp_path), "--peers-dir", str(tmp_path / "envs")]
    cmd += ["--settings", "cohort:fallback=1"]  # a batch short of 4 only if a request is a second late: none is
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "peers.csv", newline="", encoding="utf-8") as f:
        (row,) = csv.DictReader(f)
    assert (row["variant"], int(row["connections"]), int(row["errors"])) == ("cohort", 4, 0)
    assert float(row["rps"]) > 0
    assert float(row["items_per_call"]) == 4.0  # never fewer: no batch leaves before the last caller is in
    assert "the ceiling of dispatch" in (tmp_path / "peers.md").read_text(encoding="utf-8")


def test_windows_give_the_variants_turns_within_a_round_and_pair_them_by_window(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--variants", "ours", "--modes", "closed", "--windows", "0"])
    with pytest.raises(SystemExit):  # windows of the closed loop's steps, and no closed loop
        parse_args(["--variants", "ours", "--modes", "open", "--windows", "2", "--saturation", "100"])
    cmd = [sys.executable, "-m", "benchmarks.peers", "--quick", "--variants", "ours,cohort", "--modes", "closed"]
    cmd += ["--connections", "2", "--windows", "3", "--warmup", "0", "--out-dir", str(tmp_path)]
    cmd += ["--peers-dir", str(tmp_path / "envs"), "--report", "w"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "w.csv", newline="", encoding="utf-8") as f:
        rows = [(r["variant"], int(r["round"]), int(r["connections"])) for r in csv.DictReader(f)]
    # Window by window, the order reversed every other window; each window a round of its own.
    assert rows == [
        ("ours", 0, 2),
        ("cohort", 0, 2),
        ("cohort", 1, 2),
        ("ours", 1, 2),
        ("ours", 2, 2),
        ("cohort", 2, 2),
    ]
    text = (tmp_path / "w.md").read_text(encoding="utf-8")
    assert "each round's step in 3 windows" in text
    assert any(line.startswith("| 2 | ours | cohort | 3 | ") for line in text.splitlines()), text
