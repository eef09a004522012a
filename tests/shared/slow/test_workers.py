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
