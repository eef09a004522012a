"""kill -9 at the moments a test cannot hit from outside (tests/shared/node.py's ``--die-at``: the process kills
itself there): an owner as a client's answer to its challenge arrives, an owner between a batch's end and its answers
written, a client in its handshake; and from outside, an owner killed while its factory loads or while it drains.
Each checks what every caller received against the model's call log (tests/shared/procs.py)."""

from __future__ import annotations

import glob
import os
import signal
from functools import partial
from pathlib import Path

from tests.shared.procs import calls, check_exactly_once, cluster, done, wait_for


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


def test_an_owner_killed_as_a_client_answers_its_challenge_is_replaced(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.0, batch=4) as start:
        owner = start("--die-at", "handshake")
        assert owner.ready() == "owner"
        client = start("--items", "0:10")
        client.ready()
        wait_for(partial(done, client, 10), 30, "the client's outcomes")
        assert owner.process.wait(10) == -signal.SIGKILL
        assert check_exactly_once(client.outcomes(), set(range(10)), calls(tmp_path)) == {"ok": 10}
        assert set(calls(tmp_path)) == {client.pid}  # it took over
        client.terminate()


def test_an_owner_killed_between_a_batchs_end_and_its_answers_leaves_that_batch_unknown(
    address: str, tmp_path: Path
) -> None:
    with cluster(address, tmp_path, delay=0.05, batch=4) as start:
        owner = start("--die-at", "ended")
        assert owner.ready() == "owner"
        client = start("--items", "0:12", "--pace", "0.01")
        client.ready()
        wait_for(partial(done, client, 12), 30, "the client's outcomes")
        log = calls(tmp_path)
        kinds = check_exactly_once(client.outcomes(), set(range(12)), log)
        # The batch that ended was processed; its answers died with the owner: those callers are told so.
        assert kinds["OutcomeUnknownError"] == len(log[owner.pid]) >= 1
        client.terminate()


def test_an_owner_killed_while_its_factory_loads_is_replaced(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.0, batch=8, load=1.0) as start:
        owner = start()
        wait_for(lambda: _holder(address) == owner.pid, 20, "the first process to take the lock")
        client = start("--items", "0:5")
        assert client.ready() == "client"  # (its own factory runs only if it takes over)
        owner.kill()
        wait_for(partial(done, client, 5), 30, "the client's outcomes")
        assert check_exactly_once(client.outcomes(), set(range(5)), calls(tmp_path)) == {"ok": 5}
        client.terminate()


def test_an_owner_killed_while_it_drains(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.3, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        client = start("--items", "0:16", "--pace", "0.01")
        client.ready()
        wait_for(lambda: owner.pid in calls(tmp_path), 20, "the owner's first batch")
        owner.process.send_signal(signal.SIGTERM)  # it drains (its batch takes 0.3 s) ...
        wait_for(lambda: not os.path.exists(address), 10, "the owner to leave")
        owner.kill()  # ... and dies doing it
        wait_for(partial(done, client, 16), 30, "the client's outcomes")
        kinds = check_exactly_once(client.outcomes(), set(range(16)), calls(tmp_path))
        assert kinds["OutcomeUnknownError"] >= 1 and kinds["ok"] >= 1
        client.terminate()


def test_processes_started_at_once_elect_one_owner(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.0, batch=8) as start:
        nodes = [start("--items", f"{100 * k}:{100 * k + 10}") for k in range(4)]
        assert sorted(node.ready() for node in nodes) == ["client", "client", "client", "owner"]
        for node in nodes:
            wait_for(partial(done, node, 10), 30, f"node {node.pid}'s outcomes")
        items = {100 * k + i for k in range(4) for i in range(10)}
        log = calls(tmp_path)
        assert check_exactly_once([o for n in nodes for o in n.outcomes()], items, log) == {"ok": 40}
        assert len(log) == 1  # one model
        for node in nodes:
            node.terminate()


def test_a_client_on_uvloop_survives_an_owner_on_asyncio_killed_mid_batch(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.3, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        client = start("--items", "0:16", "--pace", "0.01", "--uvloop")
        assert client.ready() == "client"
        wait_for(lambda: owner.pid in calls(tmp_path), 20, "the owner's first batch")
        owner.kill()
        wait_for(partial(done, client, 16), 30, "the client's outcomes")
        kinds = check_exactly_once(client.outcomes(), set(range(16)), calls(tmp_path))
        assert kinds["OutcomeUnknownError"] >= 1 and kinds["ok"] >= 1
        assert client.pid in calls(tmp_path)  # the uvloop client took over
        client.terminate()


def _holder(address: str) -> int | None:
    try:
        with open(address + ".lock") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None
