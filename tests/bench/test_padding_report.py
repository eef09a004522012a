"""benchmarks/padding.py's arithmetic and report on made-up steps (its load needs locust: make bench-padding)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.padding import FIELDS, padding_row, write
from benchmarks.run import Step


def _step(users: int, rps: float) -> Step:
    return Step("/optimized_predict", users, 10, 1000, 0, rps, 5.0, 9.0, 12.0, 6.0, 1.0, 1.0, 11.0, None)


def test_a_row_is_the_difference_of_two_stats_readings() -> None:
    before = {"batches": 10, "processed": 100, "batch_rows": 120}
    row = padding_row("buckets only", _step(32, 500.0), before, {"batches": 60, "processed": 400, "batch_rows": 520})
    assert (row["batches"], row["real_rows"], row["computed_rows"]) == (50, 300, 400)
    assert row["padding"] == pytest.approx(0.25) and row["mean_batch"] == pytest.approx(6.0)
    assert row["rps"] == 500.0 and row["config"] == "buckets only"
    idle = padding_row("x", _step(1, 0.0), before, before)
    assert idle["padding"] is None and idle["mean_batch"] is None


def test_the_report_has_a_row_per_step_and_a_csv(tmp_path: Path) -> None:
    before = {"batches": 0, "processed": 0, "batch_rows": 0}
    steps = [
        padding_row("buckets only", _step(32, 500.0), before, {"batches": 4, "processed": 20, "batch_rows": 32}),
        padding_row(
            "buckets + preferred sizes", _step(32, 480.0), before, {"batches": 5, "processed": 20, "batch_rows": 20}
        ),
    ]
    env = {
        "command": "python -m benchmarks.padding",
        "date": "today",
        "cpu": "cpu",
        "cpus": 2,
        "python": "3.11",
        "versions": {"numpy": "2"},
        "load_average_before": [1.0, 1.0, 1.0],
        "locust": {"step_seconds": 10},
    }
    text = write({"environment": env, "buckets": "1,2,4,8", "steps": steps}, tmp_path)
    assert "| 32 | buckets only | 500 | 5 | 9 | 4 | 5.0 | 20 | 32 | 37.5 % | 0 |" in text
    assert "| 32 | buckets + preferred sizes | 480 | 5 | 9 | 5 | 4.0 | 20 | 20 | 0.0 % | 0 |" in text
    lines = (tmp_path / "padding.csv").read_text().splitlines()
    assert lines[0] == ",".join(FIELDS) and len(lines) == 3
