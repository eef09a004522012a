"""SIGSTOP: an owner that hangs (its clients' timeouts still fire, and it does not hold the others forever) and a
client that hangs (the owner serves the others); each checked against the model's call log."""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

from tests.shared.procs import batches, calls, check_exactly_once, cluster, done, wait_for


def test_an_owner_that_hangs_does_not_hold_its_clients_forever(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.0, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        connected = start("--items", "0:0")
        assert connected.ready() == "client"
        os.kill(owner.pid, signal.SIGSTOP)
        try:
            timed = start("--items", "0:5", "--timeout", "0.5")  # (connects: its handshake waits)
            waiting = start("--items", "100:103", "--owner-wait", "1")  # no timeout: owner_wait bounds the wait
            assert (timed.ready(), waiting.ready()) == ("client", "client")
            wait_for(partial(done, timed, 5), 20, "the timed-out items")
            wait_for(partial(done, waiting, 3), 20, "the items that waited for an owner")
        finally:
            os.kill(owner.pid, signal.SIGCONT)
        assert {o.get("error") for o in timed.outcomes()} == {"TimeoutError"}
        assert {o.get("error") for o in waiting.outcomes()} == {"OwnerUnavailableError"}
        late = start("--items", "200:203")  # the owner serves again
        late.ready()
        wait_for(partial(done, late, 3), 20, "the items after the owner came back")
        assert check_exactly_once(late.outcomes(), {200, 201, 202}, calls(tmp_path)) == {"ok": 3}
        assert not [x for x in calls(tmp_path).get(owner.pid, []) if x < 200]  # nothing timed out was processed
        for node in (late, waiting, timed, connected, owner):
            node.terminate()


def test_a_client_that_hangs_does_not_hold_the_owner_up(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.2, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        hung = start("--items", "0:8")
        assert hung.ready() == "client"
        wait_for(lambda: batches(tmp_path, owner.pid), 20, "the owner's first batch")
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            other = start("--items", "100:108")
            other.ready()
            wait_for(partial(done, other, 8), 30, "the other client's outcomes")
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        wait_for(partial(done, hung, 8), 30, "the hung client's outcomes, once it runs again")
        outcomes = hung.outcomes() + other.outcomes()
        kinds = check_exactly_once(outcomes, set(range(8)) | set(range(100, 108)), calls(tmp_path))
        assert kinds == {"ok": 16}
        for node in (hung, other, owner):
            node.terminate()


def test_a_client_that_hangs_with_megabytes_unread_is_disconnected_and_loses_nothing(
    address: str, tmp_path: Path
) -> None:
    with cluster(address, tmp_path, delay=0.05, batch=4, pad=1024 * 1024) as start:
        owner = start()
        assert owner.ready() == "owner"
        hung = start("--items", "0:40")  # 40 MB of answers
        assert hung.ready() == "client"
        wait_for(lambda: batches(tmp_path, owner.pid), 20, "the owner's first batch")
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            other = start("--items", "100:120", "--pace", "0.1")  # (2 s: past the owner's bound on an unread client)
            other.ready()
            wait_for(partial(done, other, 20), 30, "the other client's outcomes")
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        wait_for(partial(done, hung, 40), 30, "the hung client's outcomes, once it runs again")
        outcomes = hung.outcomes() + other.outcomes()
        kinds = check_exactly_once(outcomes, set(range(40)) | set(range(100, 120)), calls(tmp_path))
        assert kinds["OutcomeUnknownError"] >= 1  # (it was disconnected: what it had not read was lost with it)
        assert all("ok" in o for o in other.outcomes())
        for node in (hung, other, owner):
            node.terminate()
