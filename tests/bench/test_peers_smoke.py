"""Smoke test of the head-to-head rig (``python -m benchmarks.peers --quick``), for the variants that need no
environment of their own: the unbatched server, ours, and ours with other settings given on the command line. Real
servers on 127.0.0.1, real wrk, the real model; no assertion on speed.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers import report
from benchmarks.peers.__main__ import parse_args
from benchmarks.peers.load import Step

pytestmark = pytest.mark.single_loop

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["none", "ours", "ours-wait"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("peers")
    cmd = [sys.executable, "-m", "benchmarks.peers", "--quick", "--variants", "none,ours"]
    cmd += ["--ours", "wait:max_queue_time=0.002", "--out-dir", str(out), "--peers-dir", str(out / "envs")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "peers.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return {"out": out, "rows": rows, "md": (out / "peers.md").read_text(encoding="utf-8")}


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


def test_report_says_what_ran(run: dict[str, Any]) -> None:
    md = run["md"]
    assert "All agree within a relative" in md
    for v in VARIANTS:
        assert f"| {v} |" in md
    assert "max_queue_time=0.002" in md  # the settings given on the command line reached the server
    assert "## Targets: ahead of the best peer" in md and "| ours | 1 | p50 no higher than `ours-wait`'s |" in md
    assert (run["out"] / "peers.png").read_bytes().startswith(b"\x89PNG")


def test_settings_on_the_command_line() -> None:
    args = parse_args(["--variants", "none,ours", "--ours", "a:max_queue_time=0.001,max_latency=null"])
    assert args.plan == [
        ("none", "none", {}),
        ("ours", "ours", {}),
        ("ours-a", "ours", {"max_queue_time": 0.001, "max_latency": None}),
    ]
    with pytest.raises(SystemExit):
        parse_args(["--variants", "none", "--settings", "batched:timeout_ms=2"])  # not in the run
    with pytest.raises(SystemExit):
        parse_args(["--variants", "nothing"])


def _step(variant: str, conns: int, rps: float, p50: float, p99: float) -> Step:
    return Step(variant, 0, conns, 10.0, int(rps * 10), rps, p50, p50, p99, p50, p99, 0, 0, 2.0, 100.0, 5.0, 90.0, 0.0)


def test_targets_verdicts() -> None:
    steps = [
        _step("ours", 64, 1100.0, 5.0, 10.0),  # 1.1x the best peer, same p99: passes
        _step("batched", 64, 1000.0, 5.0, 10.0),
        _step("async-batcher-0.2.2", 64, 500.0, 5.0, 10.0),
        _step("ours", 256, 1300.0, 5.0, 30.0),  # 1.3x, but a higher p99: fails
        _step("batched", 256, 1000.0, 5.0, 20.0),
        _step("ours", 1, 100.0, 2.0, 3.0),
        _step("ours-x", 1, 100.0, 1.5, 3.0),  # a lower p50 than ours's: ours fails
        _step("ours-x", 64, 1200.0, 5.0, 9.0),  # 1.2x and a lower p99: passes
    ]
    variants = ["ours", "ours-x", "async-batcher-0.2.2", "batched"]
    lines = report.targets(report.summarise(steps), variants, [1, 64, 256])
    verdicts = [
        (line.split(" | ")[0].strip("| "), line.split(" | ")[1], line.rstrip(" |").rsplit(" | ", 1)[1])
        for line in lines[2:]
    ]
    assert verdicts == [
        ("ours", "64", "PASS"),
        ("ours", "256", "FAIL"),
        ("ours-x", "64", "PASS"),
        ("ours", "1", "FAIL"),
    ]
