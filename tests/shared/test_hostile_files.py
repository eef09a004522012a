"""A hostile environment around the socket: files planted or left at its paths (a symbolic link, a lock file that is
not a plain file of this user's), a lock file that cannot be opened while a client looks for the next owner, gone
boards left in /dev/shm by a client killed in its handshake, a peer that does not know the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from async_batcher.shared import SharedBatcher, _paths
from tests.shared.models import Model


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
