"""Faults with real processes: kill -9 of the owner mid-batch, kill -9 of a worker, a graceful hand-over. Each checks
what every caller received against what the model was called with (its call log, which each owner writes to a
file): no item answered twice, none processed twice unless its caller was told the outcome is unknown, none lost
without an error."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tests.shared.procs import batches, calls, check_exactly_once, cluster, done, wait_for


def test_the_owner_killed_mid_batch(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.3, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        clients = [start("--items", "0:16", "--pace", "0.01"), start("--items", "100:116", "--pace", "0.01")]
        assert [c.ready() for c in clients] == ["client", "client"]
        wait_for(lambda: owner.pid in calls(tmp_path), 20, "the owner's first batch")
        owner.kill()  # mid-batch: its model sleeps on the batch it logged
        for c in clients:
            wait_for(partial(done, c, 16), 30, f"client {c.pid}'s outcomes")
        log = calls(tmp_path)
        kinds = check_exactly_once(
            [o for c in clients for o in c.outcomes()], set(range(16)) | set(range(100, 116)), log
        )
        assert kinds["OutcomeUnknownError"] >= 1  # the batch in flight
        assert kinds["ok"] >= 16  # the rest, by the next owner: one of the clients took over
        assert sorted(pid for pid in log if pid != owner.pid) in ([clients[0].pid], [clients[1].pid])
        for c in clients:
            c.terminate()


def test_a_worker_killed_leaves_nothing_of_its_own_in_the_owners_queue(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.3, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        doomed = start("--items", "0:16")
        assert doomed.ready() == "client"
        wait_for(lambda: owner.pid in calls(tmp_path), 20, "the owner's first batch")
        other = start("--items", "100:104")
        assert other.ready() == "client"
        doomed.kill()
        before = len(batches(tmp_path, owner.pid))
        wait_for(partial(done, other, 4), 30, "the other client's outcomes")
        assert all(o.get("ok") == 2 * o["item"] for o in other.outcomes())
        after = batches(tmp_path, owner.pid)[before:]
        # Once it was killed, no batch but the one that may have gone as it died has an item of its: the rest of
        # its items were withdrawn from the owner's queue.
        assert not [b for b in after[1:] if any(x < 100 for x in b)], after
        assert len([x for b in batches(tmp_path, owner.pid) for x in b if x < 100]) < 16
        other.terminate()
        owner.terminate()


def test_a_graceful_hand_over_loses_nothing_and_does_nothing_twice(address: str, tmp_path: Path) -> None:
    with cluster(address, tmp_path, delay=0.1, batch=4) as start:
        owner = start()
        assert owner.ready() == "owner"
        client = start("--items", "0:30", "--pace", "0.02")
        assert client.ready() == "client"
        wait_for(lambda: owner.pid in calls(tmp_path), 20, "the owner's first batch")
        owner.terminate()  # it drains what it accepted; the client holds the rest, then takes over
        wait_for(lambda: len(client.outcomes()) == 30, 30, "the client's outcomes")
        log = calls(tmp_path)
        kinds = check_exactly_once(client.outcomes(), set(range(30)), log)
        assert kinds == {"ok": 30}
        assert set(log) == {owner.pid, client.pid}  # both processed some: the client took over
        client.terminate()
