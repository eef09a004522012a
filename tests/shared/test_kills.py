"""kill -9 at the moments a test cannot hit from outside (tests/shared/node.py's ``--die-at``: the process kills
itself there): an owner as a client's answer to its challenge arrives, an owner between a batch's end and its answers
written, a client in its handshake; and from outside, an owner killed while its factory loads or while it drains.
Each checks what every caller received against the model's call log (tests/shared/procs.py)."""

from __future__ import annotations

import glob
import os
from functools import partial
from pathlib import Path

from tests.shared.procs import Node, cluster, wait_for


def done(node: Node, n: int) -> bool:
    return len(node.outcomes()) == n


def boards_of(pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/async-batcher-{pid}-*")


def test_a_client_killed_in_its_handshake_leaves_no_gone_board_behind(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.0, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        doomed = start("--items", "0:1", "--role", "client", "--die-at", "answered")  # its board made, its answer sent
        doomed.process.wait(30)
        other = start("--items", "0:3", "--role", "client")  # (the owner serves on)
        assert other.ready() == "client"
        wait_for(partial(done, other, 3), 30, "the other client's outcomes")
        try:
            wait_for(lambda: not boards_of(doomed.pid), 10, "the killed client's board to be removed")
        finally:
            for path in boards_of(doomed.pid):
                os.unlink(path)
        other.terminate()
        owner.terminate()
