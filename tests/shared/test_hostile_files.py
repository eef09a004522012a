"""A hostile environment around the socket: files planted or left at its paths (a symbolic link, a lock file that is
not a plain file of this user's), a lock file that cannot be opened while a client looks for the next owner, gone
boards left in /dev/shm by a client killed in its handshake, a peer that does not know the key."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import stat
import struct
from pathlib import Path
from typing import Any

import pytest

from async_batcher import OwnerUnavailableError
from async_batcher.shared import SharedBatcher, _paths, _wire
from async_batcher.shared._link import DENY
from tests.loops import until
from tests.shared.models import Model
from tests.shared.test_socket import write


async def test_a_symbolic_link_at_the_lock_path_is_refused_not_followed(address: str, tmp_path: Path) -> None:
    # The owner writes its pid into the lock file (after truncating it): through a link planted there it would
    # clobber whatever file the link names.
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, address + ".lock")
    with pytest.raises(PermissionError, match="symbolic link"):
        async with SharedBatcher(Model, address=address, name="m"):
            pass
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("what", ["not this user's", "others may write", "other names"])
def test_a_lock_file_that_is_not_this_users_alone_is_refused(address: str, tmp_path: Path, what: str) -> None:
    lock = address + ".lock"
    with open(lock, "w") as f:
        f.write("123")
    if what == "not this user's":
        if os.getuid() != 0:
            pytest.skip("giving a file to another user takes root")
        os.chown(lock, 12345, -1)
    elif what == "others may write":
        os.chmod(lock, 0o666)
    else:
        os.link(lock, tmp_path / "another-name")  # (a hard link: truncating it clobbers the other name's file)
    with pytest.raises(PermissionError, match=str(lock)):
        _paths.Election(address).try_acquire()
    with open(lock) as f:
        assert f.read() == "123"  # untouched


# ---------------------------------------------------------------------- a peer that does not know the key


async def test_before_the_key_is_proved_a_frame_longer_than_a_handshake_closes_the_connection(address: str) -> None:
    # A peer that has proved nothing must not make the owner set 64 MiB aside for a frame (nor hold a connection
    # open while it sends it): a handshake is a few hundred bytes.
    async with SharedBatcher(Model, address=address, name="m") as owner:
        reader, writer = await asyncio.open_unix_connection(address)
        await reader.readexactly(4 + _wire.HELLO_SIZE + 32)  # the owner's hello and challenge
        writer.write(struct.pack("<I", 60 * 1024 * 1024))
        async with asyncio.timeout(2):  # (not the handshake's 10 s)
            assert await reader.read() == b""
        writer.close()
        assert await owner.process(1) == 2


async def test_a_client_closes_at_once_an_impostor_that_announces_a_huge_frame(address: str) -> None:
    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack("<I", 60 * 1024 * 1024) + b"x" * 1000)
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    server = await asyncio.start_unix_server(impostor, address)
    try:
        _paths.write_key(address)
        async with SharedBatcher(Model, address=address, role="client", name="m", owner_wait=5) as client:
            seat = client._seat
            assert seat is not None
            await until(lambda: isinstance(seat.client.last_error, _wire.Violation), within=3)
            assert "over the limit" in str(seat.client.last_error)
    finally:
        server.close()
        await server.wait_closed()


class _Evil:
    """Unpickled, it makes a directory: proof that a pickle was loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (os.mkdir, (self.path,))


async def test_pickles_from_a_peer_that_does_not_know_the_key_are_never_loaded(address: str, tmp_path: Path) -> None:
    mark = tmp_path / "loaded"
    frame = b"".join(bytes(c) for c in _wire.encode([1], [_Evil(str(mark))], 2**30))
    async with SharedBatcher(Model, address=address, name="m") as owner:
        reader, writer = await asyncio.open_unix_connection(address)  # a pickle for a handshake
        writer.write(frame)
        async with asyncio.timeout(5):
            await reader.read()
        writer.close()
        reader, writer = await asyncio.open_unix_connection(address)  # a wrong answer, and pickles after it
        await reader.readexactly(4 + _wire.HELLO_SIZE + 32)
        board = os.fsencode(tmp_path / "board")
        writer.write(_wire.raw(b"x" * 32 + _wire.hello(os.getpid(), 2**20) + board + b"c" * 32) + frame + frame)
        async with asyncio.timeout(5):
            await reader.read()
        writer.close()
        assert await owner.process(1) == 2
    assert not mark.exists()


async def test_a_client_never_loads_a_pickle_from_a_socket_that_does_not_know_the_key(
    address: str, tmp_path: Path
) -> None:
    mark = tmp_path / "loaded"
    frame = b"".join(bytes(c) for c in _wire.encode([1], [_Evil(str(mark))], 2**30))

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_wire.raw(_wire.hello(os.getpid(), 2**20) + b"c" * 32))  # a hello anyone can write
        await reader.read(100)
        writer.write(frame + _wire.raw(b"y" * 32) + frame)  # pickles, a wrong answer, pickles
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            await reader.read()
        writer.close()

    server = await asyncio.start_unix_server(impostor, address)
    try:
        _paths.write_key(address)
        async with SharedBatcher(Model, address=address, role="client", name="m", owner_wait=0.5) as client:
            with pytest.raises(OwnerUnavailableError, match="does not know the key"):
                await client.process(1)
    finally:
        server.close()
        await server.wait_closed()
    assert not mark.exists()
    assert not glob.glob(f"/dev/shm/async-batcher-{os.getpid()}-*")  # (its gone boards removed)


# ---------------------------------------------------------------------- the key file


async def test_a_stale_key_file_that_is_not_this_users_alone_makes_a_client_wait_for_the_owner(address: str) -> None:
    # A key file left by an earlier run, with modes that let others read it: refused (its key may be known), but
    # not a refusal by an owner. The client waits for one, which writes a key of its own.
    write(address + ".key", "00" * 32)
    os.chmod(address + ".key", 0o644)
    async with SharedBatcher(Model, address=address, role="client", name="m", owner_wait=10) as client:
        early = asyncio.ensure_future(client.process(1))
        seat = client._seat
        assert seat is not None
        await until(lambda: isinstance(seat.client.last_error, PermissionError))  # (it read the file and refused it)
        with contextlib.suppress(AssertionError):
            await until(early.done, within=0.5)  # (it must not fail: it looks again, and again)
        assert not early.done()
        async with SharedBatcher(Model, address=address, role="owner", name="m"):
            async with asyncio.timeout(10):
                assert await early == 2


@pytest.mark.parametrize(
    ("key", "says"),
    [("abc", "does not hold a key"), ("", "refused this process's key"), ("11" * 32, "refused this process's key")],
)
async def test_a_key_file_truncated_or_wrong_fails_the_items_naming_it(address: str, key: str, says: str) -> None:
    async with SharedBatcher(Model, address=address, name="m") as owner:
        write(address + ".key", key)  # (rewritten in place: its mode stays 0600)
        async with SharedBatcher(Model, address=address, role="client", name="m", owner_wait=1) as client:
            with pytest.raises(OwnerUnavailableError, match=says):
                async with asyncio.timeout(10):
                    await client.process(1)
        assert await owner.process(1) == 2  # (the owner serves on)


async def test_peers_that_idle_send_half_a_frame_or_garbage_do_not_hold_the_owner_up(address: str) -> None:
    async with SharedBatcher(Model, address=address, name="m") as owner:
        peers = [await asyncio.open_unix_connection(address) for _ in range(4)]
        for reader, _ in peers:
            await reader.readexactly(4 + _wire.HELLO_SIZE + 32)
        peers[1][1].write(struct.pack("<I", 500) + b"x" * 100)  # half a frame, then nothing
        peers[2][1].write(_wire.raw(os.urandom(300)))  # garbage
        peers[3][1].write(os.urandom(3))  # not even a length
        async with SharedBatcher(Model, address=address, name="m", role="client") as client:
            async with asyncio.timeout(5):
                assert await client.process(1) == 2  # (served meanwhile)
        async with asyncio.timeout(5):
            assert await peers[2][0].read() == _wire.raw(DENY)  # refused, and closed
        assert owner.stats.submitted == 1
        for _, writer in peers:
            writer.close()


async def test_links_planted_at_the_socket_and_key_paths_are_never_followed(address: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, address)
    with pytest.raises(FileExistsError, match="not a socket"):  # (never unlinked through, nor bound over)
        async with SharedBatcher(Model, address=address, name="m"):
            pass
    os.unlink(address)
    os.unlink(address + ".key")  # (the key of the owner refused)
    os.symlink(victim, address + ".key")
    async with SharedBatcher(Model, address=address, name="m") as owner:  # its key replaces the link itself
        assert stat.S_ISREG(os.lstat(address + ".key").st_mode)
        assert await owner.process(1) == 2
    assert victim.read_text() == "precious"
