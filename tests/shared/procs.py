"""Real processes for the fault tests (tests/shared/node.py), and what they and the model said."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.processes import kill_group

ROOT = Path(__file__).resolve().parents[2]


class Node:
    """A process of tests/shared/node.py (its own session, so that nothing it starts outlives the test)."""

    def __init__(self, address: str, directory: Path, env: dict[str, str], *args: str) -> None:
        self.directory = directory
        command = [sys.executable, "-m", "tests.shared.node", address, str(directory), *args]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
        self.pid = self.process.pid

    def ready(self, within: float = 30.0) -> str:
        """Its role, once it has started."""
        path = self.directory / f"ready-{self.pid}"
        wait_for(lambda: path.exists() or self.process.poll() is not None, within, f"node {self.pid} to start")
        assert self.process.poll() is None, f"node {self.pid} exited with {self.process.returncode}"
        return path.read_text()

    def outcomes(self) -> list[dict[str, Any]]:
        path = self.directory / f"out-{self.pid}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def kill(self) -> None:
        """kill -9."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, within: float = 30.0) -> None:
        """SIGTERM: it stops gracefully; fails if it does not exit in time, or exits in error."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(within)
        assert self.process.returncode == 0, f"node {self.pid} exited with {self.process.returncode}"
        assert (self.directory / f"stopped-{self.pid}").exists()


def done(node: Node, n: int) -> bool:
    """Whether ``node`` has written the outcomes of ``n`` items."""
    return len(node.outcomes()) == n


def wait_for(condition: Callable[[], object], within: float, what: str) -> None:
    """Poll a real condition (a file, a process), bounded."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within} s for {what}")
        time.sleep(0.01)


@contextlib.contextmanager
def cluster(
    address: str, directory: Path, *, delay: float, batch: int, load: float = 0.0, pad: int = 0
) -> Iterator[Callable[..., Node]]:
    """Start nodes with ``start(*args)``; every one is ended (killed if it must be) on the way out. Their model
    takes ``delay`` seconds a batch of at most ``batch`` items, its factory ``load`` seconds, and its answers carry
    ``pad`` bytes each."""
    env = {**os.environ, "SHARED_TEST_LOG": str(directory), "SHARED_TEST_DELAY": str(delay)}
    env["SHARED_TEST_BATCH"] = str(batch)
    env["SHARED_TEST_LOAD"] = str(load)
    env["SHARED_TEST_PAD"] = str(pad)
    env["PYTHONPATH"] = str(ROOT)
    nodes: list[Node] = []

    def start(*args: str) -> Node:
        node = Node(address, directory, env, *args)
        nodes.append(node)
        return node

    try:
        yield start
    finally:
        left = [pid for node in nodes for pid in kill_group(node.process, grace=10)]
        assert not left, f"processes left behind: {left}"


def batches(directory: Path, pid: int) -> list[list[Any]]:
    """The batches the model of owner ``pid`` was called with, in order."""
    path = directory / f"calls-{pid}.jsonl"
    return [json.loads(line)["items"] for line in path.read_text().splitlines()] if path.exists() else []


def calls(directory: Path) -> dict[int, list[Any]]:
    """The model's call log: the items of every batch, by the pid of the owner that processed them."""
    log: dict[int, list[Any]] = {}
    for path in directory.glob("calls-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            log.setdefault(record["pid"], []).extend(record["items"])
    return log


def check_exactly_once(outcomes: list[dict[str, Any]], items: set[int], log: dict[int, list[Any]]) -> Counter[str]:
    """Every item answered exactly once; none processed twice unless its caller was told the outcome is unknown;
    none lost: an item answered with its result was processed, and an error is one of those allowed. Returns how
    many items got each outcome."""
    answered = Counter(o["item"] for o in outcomes)
    assert set(answered) == items, f"unanswered: {items - set(answered)}, unexpected: {set(answered) - items}"
    assert max(answered.values()) == 1, f"answered twice: {[i for i, n in answered.items() if n > 1]}"
    processed = Counter(x for items_of in log.values() for x in items_of)
    kinds: Counter[str] = Counter()
    for o in outcomes:
        kind = o.get("error", "ok")
        kinds[kind] += 1
        n = processed[o["item"]]
        if kind == "ok":
            assert o["ok"] == 2 * o["item"] and n == 1, (o, n)
        elif kind == "OutcomeUnknownError":
            assert n == 1, f"{o}: reported unknown, but the model saw it {n} times"
        else:
            raise AssertionError(f"an item failed otherwise: {o}")
    return kinds
