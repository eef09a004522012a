"""The socket and its files: permissions, the key, a stale socket, a slow client, who may own the address."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import tempfile
from typing import Any

import pytest

from async_batcher import OutcomeUnknownError, OwnerUnavailableError
from async_batcher.shared import SharedBatcher, _paths
from tests.loops import until
from tests.shared.models import Model, Odd
from tests.shared.test_contract import pair


def mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def exists(path: str) -> bool:
    return os.path.exists(path)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


async def test_the_socket_and_the_key_are_the_users_alone(address: str) -> None:
    async with pair(address, Model) as (_, client):
        assert stat.S_ISSOCK(os.lstat(address).st_mode)
        assert mode(address) == 0o600
        assert mode(address + ".key") == 0o600
        assert mode(address + ".lock") == 0o600
        assert await client.process(1) == 2
    assert not exists(address)  # the owner removed its socket as it left
    assert exists(address + ".lock")  # (never removed: a lock on a removed file would elect two owners)


def test_the_default_directory_is_private_and_checked(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    short = tempfile.mkdtemp(prefix="ab-", dir="/tmp")  # (pytest's tmp_path is too deep for a socket's path)
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", short)
        first = _paths.default_address("app.make_model")
        directory = os.path.dirname(first)
        assert mode(directory) == 0o700
        assert first == _paths.default_address("app.make_model")  # the workers of one app agree
        assert first != _paths.default_address("app.make_other")
        os.chmod(directory, 0o770)
        with pytest.raises(PermissionError, match="mode 770"):
            _paths.default_address("app.make_model")
    finally:
        shutil.rmtree(short)
    deep = tmp_path / ("x" * 60) / ("y" * 60)  # refused where it is made, not as the socket is bound
    deep.mkdir(parents=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    with pytest.raises(ValueError, match=r"the default address .* is longer than a Unix socket's 107 bytes"):
        _paths.default_address("app.make_model")


def test_an_address_in_a_directory_others_may_write_to_is_refused(tmp_path: Any) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(PermissionError, match="may be written by others"):
        _paths.check_address(str(shared / "b.sock"))
    os.chmod(shared, 0o1777)  # with the sticky bit (as /tmp): others cannot replace our files
    assert _paths.check_address(str(shared / "b.sock")) == str(shared / "b.sock")
    with pytest.raises(ValueError, match="longer than"):
        _paths.check_address("/tmp/" + "x" * 200)


async def test_a_key_file_others_can_read_is_refused(address: str) -> None:
    async with pair(address, Model):
        os.chmod(address + ".key", 0o644)
        with pytest.raises(PermissionError, match="not this user's alone"):
            _paths.read_key(address)


async def test_a_client_with_the_wrong_key_is_refused_quickly(address: str) -> None:
    owner = SharedBatcher(Model, address=address, authkey=b"k" * 32, name="m")
    intruder = SharedBatcher(Model, address=address, authkey=b"x" * 32, role="client", name="m", owner_wait=60)
    async with owner, intruder:
        with pytest.raises(OwnerUnavailableError, match="refused this process's key"):
            async with asyncio.timeout(10):
                await intruder.process(1)
        assert owner.stats.submitted == 0


async def test_a_stale_socket_is_replaced_and_anything_else_refused(address: str) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(address)
    stale.close()  # (a socket file nobody listens on: what a killed owner leaves)
    async with SharedBatcher(Model, address=address, name="m") as owner:
        assert owner.role == "owner" and await owner.process(1) == 2
    write(address, "not a socket")
    with pytest.raises(FileExistsError, match="not a socket"):
        async with SharedBatcher(Model, address=address, name="m"):
            pass
    assert read(address + ".lock") == ""  # (the lock given up, its pid erased)


async def test_a_client_started_before_the_owner_waits_for_it(address: str) -> None:
    client = SharedBatcher(Model, address=address, role="client", name="m")
    async with client:
        early = asyncio.ensure_future(client.process(1))
        await asyncio.sleep(0.05)
        assert not early.done()
        async with SharedBatcher(Model, address=address, role="owner", name="m") as owner:
            assert await early == 2
            assert owner.stats.submitted == 1


async def test_a_client_waits_for_an_owner_no_longer_than_owner_wait(address: str) -> None:
    async with SharedBatcher(Model, address=address, role="client", name="m", owner_wait=0.2) as client:
        with pytest.raises(OwnerUnavailableError, match=r"owner_wait=0\.2s") as raised:
            await client.process(1)
        assert address in str(raised.value)


async def test_role_owner_names_the_process_that_owns_the_address(address: str) -> None:
    async with SharedBatcher(Model, address=address, name="m"):
        with pytest.raises(RuntimeError, match=f"process {os.getpid()} owns"):
            async with SharedBatcher(Model, address=address, role="owner", name="m"):
                pass


async def test_a_client_that_does_not_read_is_disconnected_without_holding_the_owner_up(address: str) -> None:
    async with pair(address, Odd, max_message_size=1024 * 1024) as (owner, client):
        assert client._seat is not None
        link = client._seat.client.link
        assert link is not None and link.transport is not None
        link.transport.pause_reading()  # this client stops reading its results
        assert owner._seat is not None and owner._seat.owner is not None
        (served,) = owner._seat.owner.links
        calls = [asyncio.ensure_future(client.process(b"y" * 600_000)) for _ in range(12)]
        await until(lambda: served.closed, within=20)  # disconnected
        assert await owner.process("still serving") == "still serving"
        link.transport.resume_reading()  # it reads at last: what reached it, then the end
        await until(lambda: all(c.done() for c in calls), within=20)
        outcomes = [c.result() if c.exception() is None else c.exception() for c in calls]
        assert all(o == b"y" * 600_000 or isinstance(o, OutcomeUnknownError) for o in outcomes)
        assert any(isinstance(o, OutcomeUnknownError) for o in outcomes)
        await until(lambda: client._seat is not None and client._seat.client.link is not None, within=10)
        assert await client.process(1) == 1  # it connects again


def test_the_lock_is_this_processs_for_one_election_only() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        address = os.path.join(directory, "b.sock")
        first, second = _paths.Election(address), _paths.Election(address)
        assert first.try_acquire()
        assert not second.try_acquire()  # (POSIX locks are per process: without the table it would succeed)
        assert second.holder() == os.getpid()
        first.release()
        assert second.try_acquire()
        second.release()


async def test_a_socket_that_is_not_an_owners_fails_the_items_clearly(address: str) -> None:
    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x10\x00\x00\x00" + b"HTTP/1.1 200 OK\r\n")
        await writer.drain()

    server = await asyncio.start_unix_server(impostor, address)
    try:
        _paths.write_key(address)
        async with SharedBatcher(Model, address=address, role="client", name="m", owner_wait=0.5) as client:
            with pytest.raises(OwnerUnavailableError, match="not an async-batcher"):
                await client.process(1)
    finally:
        server.close()
        await server.wait_closed()
