"""The shared batcher under real process managers and repeated faults: the full tier's (a few seconds each)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.shared.procs import ROOT, wait_for


def test_uvicorn_workers_share_one_batcher(address: str, tmp_path: Path) -> None:
    from tests.processes import kill_group
    from tests.servers import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARED_TEST_LOG": str(tmp_path), "SHARED_TEST_ADDRESS": address}
    command = [sys.executable, "-m", "uvicorn", "tests.shared.app:app", "--workers", "2", "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/double"

        def up() -> bool:
            try:
                return httpx.post(url, params={"x": 0}, timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, 60, "the server")

        async def load() -> list[dict[str, Any]]:
            async def one(x: int) -> dict[str, Any]:
                async with httpx.AsyncClient(timeout=30) as http:  # (a connection each: both workers get some)
                    answer = await http.post(url, params={"x": x})
                    assert answer.status_code == 200, answer.text
                    return dict(answer.json())

            return list(await asyncio.gather(*(one(x) for x in range(1, 41))))

        answers = asyncio.run(load())
        assert [a["result"] for a in answers] == [2 * x for x in range(1, 41)]
        roles = {a["pid"]: a["role"] for a in answers}
        logs = list(tmp_path.glob("calls-*.jsonl"))
        assert len(logs) == 1  # one model: only the owner's factory ran
        assert sorted(roles.values()) in (["client", "owner"], ["owner"], ["client"])
    finally:
        left = kill_group(server, grace=20)
    assert not left, f"left behind after SIGINT: {left}"


def test_owner_after_owner_killed_mid_batch(address: str, tmp_path: Path) -> None:
    """Three processes, two of them killed in turn while the model works for them: the third ends with every item
    answered once, and the model's log agrees."""
    from functools import partial

    from tests.shared.procs import Node, batches, calls, check_exactly_once, cluster

    def done(node: Node, n: int) -> bool:
        return len(node.outcomes()) == n

    with cluster(address, tmp_path, delay=0.2, batch=4) as start:
        first = start()
        assert first.ready() == "owner"
        others = [start("--items", f"{k}:{k + 40}", "--pace", "0.01") for k in (0, 100, 200)]
        ranges = {node.pid: range(k, k + 40) for node, k in zip(others, (0, 100, 200), strict=True)}
        assert [o.ready() for o in others] == ["client"] * 3
        wait_for(lambda: batches(tmp_path, first.pid), 20, "the first owner's first batch")
        first.kill()
        wait_for(lambda: any(o.pid in calls(tmp_path) for o in others), 30, "a second owner's batch")
        (second,) = [o for o in others if o.pid in calls(tmp_path)]
        second.kill()
        left = [o for o in others if o is not second]
        for node in left:
            wait_for(partial(done, node, 40), 60, f"node {node.pid}'s outcomes")
        outcomes = [o for node in left for o in node.outcomes()]
        items = {x for node in left for x in ranges[node.pid]}
        kinds = check_exactly_once(outcomes, items, calls(tmp_path))
        assert set(kinds) <= {"ok", "OutcomeUnknownError"} and kinds["ok"] >= 40
        for node in left:
            node.terminate()
