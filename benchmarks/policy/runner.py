"""Runs the simulation jobs, each variant in its interpreter: ours in this one's (with this repository first on its
path), each peer in its own virtual environment under ``.cache/peers/`` (those of ``make bench-overhead``, built on
first use: pip, needs PyPI), in worker processes (:mod:`benchmarks.policy.worker`) at most ``workers`` at a time.

Every job is independent and seeded: which process runs it changes nothing in its numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .sim.server import Costs
from .sim.traffic import Scenario
from .variants import Variant

__all__ = ["ROOT", "Run", "interpreters", "run_all"]

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")
CHUNK = 6  # jobs per worker process: small enough to share the work out evenly


@dataclass(frozen=True)
class Run:
    scenario: Scenario
    variant: Variant
    result: dict[str, Any]
    cores: float = 2.0


def interpreters(kinds: set[str], peers_dir: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The interpreter of each kind, and why each other kind cannot run."""
    found = {"ours": Path(sys.executable)} if "ours" in kinds else {}
    wanted = sorted(kinds - {"ours"})
    if not wanted:
        return found, {}
    from benchmarks.overhead.peers import interpreters as peer_interpreters

    peers, missing = peer_interpreters(wanted, peers_dir)
    return {**found, **peers}, missing


def _command(kind: str, python: Path) -> list[str]:
    cmd = [str(python), "-I", str(WORKER)]
    return [*cmd, "--repo", str(ROOT)] if kind == "ours" else cmd


def run_all(
    pairs: list[tuple[Scenario, Variant]],
    costs: Costs,
    pythons: dict[str, Path],
    workers: int,
    progress: Callable[[int, int], None] | None = None,
    clock: str = "uvloop",
    cores: float | Sequence[float] = 2.0,
) -> list[Run]:
    """Run every (scenario, variant) pair, on ``cores`` (one value, or one per pair); raises on the first job that
    failed, with its traceback."""
    each = [float(cores)] * len(pairs) if isinstance(cores, int | float) else [float(c) for c in cores]
    jobs: list[dict[str, Any]] = [
        {"id": i, "scenario": s.as_dict(), "costs": costs.as_dict(), "clock": clock, "cores": each[i], **v.job()}
        for i, (s, v) in enumerate(pairs)
        if v.kind in pythons
    ]
    # Chunks of one kind each, the longest scenarios first (the pool then ends evenly).
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for job in sorted(jobs, key=lambda j: -_weight(pairs[j["id"]][0])):
        by_kind.setdefault(job["kind"], []).append(job)
    chunks = [(kind, js[i : i + CHUNK]) for kind, js in by_kind.items() for i in range(0, len(js), CHUNK)]
    chunks.sort(key=lambda c: -sum(_weight(pairs[j["id"]][0]) for j in c[1]))
    results: dict[int, dict[str, Any]] = {}

    def one(chunk: tuple[str, list[dict[str, Any]]]) -> None:
        kind, chunk_jobs = chunk
        done = subprocess.run(
            _command(kind, pythons[kind]),
            input=json.dumps({"jobs": chunk_jobs}),
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or len(lines) != len(chunk_jobs):
            raise RuntimeError(f"the {kind} worker failed (exit {done.returncode}): {done.stderr.strip()[-3000:]}")
        for line in lines:
            if "error" in line:
                s, v = pairs[line["id"]]
                raise RuntimeError(f"{v.name} on {s.name} failed:\n{line['error']}")
            results[line["id"]] = line["result"]
        if progress is not None:
            progress(len(results), len(jobs))

    with ThreadPoolExecutor(max(1, workers)) as pool:
        for future in [pool.submit(one, chunk) for chunk in chunks]:
            future.result()
    return [Run(pairs[i][0], pairs[i][1], results[i], each[i]) for i in sorted(results)]


def _weight(scenario: Scenario) -> float:
    """A guess at a job's cost, to order them: requests scale with the rate or the clients."""
    return scenario.duration * (scenario.rate + 300 * min(scenario.clients, 8) + 2 * scenario.clients + 1)
