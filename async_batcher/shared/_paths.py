"""Where a shared batcher lives and who owns it: the socket's address, its directory, the key file, and the election
by a lock file (private).

Files beside the socket ``<address>``: ``<address>.lock``, whose POSIX record lock (``fcntl.lockf``) the owner holds
(the kernel releases it when the process dies; it is not inherited by a forked child, unlike ``flock``'s; the file
holds the owner's pid, for messages) and which is never removed (a lock on a removed file would elect a second
owner); ``<address>.key``, the random key the owner writes (mode 0600, written whole by a rename) and its clients read,
unless the application passes ``authkey=``.

The default address is in a directory of this user's (``$XDG_RUNTIME_DIR``, or the temporary directory, then
``async-batcher-<uid>/``, mode 0700, checked), named after the factory's qualified name and the working directory,
so that the workers of one app agree on it and two apps do not.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Final

__all__: list[str] = []

#: The longest path a Unix socket's address may have (sun_path's 108 bytes, less the final NUL).
MAX_ADDRESS: Final = 107


def default_address(qualname: str) -> str:
    """The address of the shared batcher of the factory named ``qualname`` in this working directory."""
    where = hashlib.sha256(f"{os.getcwd()}\0{qualname}".encode()).hexdigest()[:12]
    short = re.sub(r"[^A-Za-z0-9_.-]+", "_", qualname)[-40:].lstrip("._") or "batcher"
    path = str(runtime_dir() / f"{short}-{where}.sock")
    if len(os.fsencode(path)) > MAX_ADDRESS:  # (a long $XDG_RUNTIME_DIR or temporary directory)
        raise ValueError(
            f"the default address {path!r} is longer than a Unix socket's {MAX_ADDRESS} bytes: pass a shorter address="
        )
    return path


def runtime_dir() -> Path:
    """This user's directory for the sockets: created (mode 0700) if need be, and checked."""
    base = os.environ.get("XDG_RUNTIME_DIR") or ""
    if not base or not os.path.isdir(base):
        base = tempfile.gettempdir()
    path = Path(base) / f"async-batcher-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{path} is not a directory (a symbolic link?): pass address= elsewhere")
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to user {info.st_uid}, not to this process's user: pass address=")
    if info.st_mode & 0o077:
        raise PermissionError(
            f"{path} has mode {stat.S_IMODE(info.st_mode):o}: others may use it; make it 0700, or pass address="
        )
    return path


def check_address(address: str) -> str:
    """An address given by the application: absolute, short enough, in a directory others cannot plant files in."""
    path = os.path.abspath(address)
    if len(os.fsencode(path)) > MAX_ADDRESS:
        raise ValueError(f"address {path!r} is longer than a Unix socket's {MAX_ADDRESS} bytes: choose a shorter path")
    directory = os.path.dirname(path)
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        raise FileNotFoundError(f"address {path!r}: its directory {directory!r} does not exist") from None
    writable_by_others = info.st_mode & 0o022
    if writable_by_others and not info.st_mode & stat.S_ISVTX:
        raise PermissionError(
            f"address {path!r}: its directory {directory!r} may be written by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}, no sticky bit), who could replace the socket or its key"
        )
    return path


# ---------------------------------------------------------------------- the key


def write_key(address: str) -> bytes:
    """A new random key, written to ``<address>.key`` (mode 0600, whole: a temporary file renamed)."""
    key = os.urandom(32)
    directory, name = os.path.split(address)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".key", dir=directory)  # (created 0600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key.hex().encode())
        os.replace(tmp, address + ".key")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return key


def read_key(address: str) -> bytes:
    """The key the owner wrote; refused if the file is not this user's alone."""
    path = address + ".key"
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(
                f"{path} is not this user's alone (owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}): "
                "refusing its key"
            )
        text = os.read(fd, 1024)
    finally:
        os.close(fd)
    try:
        return bytes.fromhex(text.decode())
    except ValueError:
        raise ValueError(f"{path} does not hold a key (written half? it is rewritten by each owner)") from None


# ---------------------------------------------------------------------- the election


def _open_lock(path: str) -> int:
    """The lock file, opened (created 0600 if need be): refused unless it is a plain file of this user's alone, since
    its owner truncates it and writes its pid into it (through a link planted there, it would clobber another file)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(f"{path} is a symbolic link: refusing to lock (and write to) what it names") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022 or info.st_nlink != 1:
        os.close(fd)
        raise PermissionError(
            f"{path} is not a plain file of this user's alone (owner {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}, {info.st_nlink} names): refusing to lock it; remove it, or pass another "
            "address="
        )
    return fd


# The elections this process holds, by lock file: a second one in this process must not lock again (POSIX locks are
# per process: it would succeed), nor open and close the file (closing any descriptor of it drops the lock).
_held: dict[str, tuple[int, Election]] = {}


class Election:
    """The lock file of an address: who owns the shared batcher there."""

    __slots__ = ("fd", "path")

    def __init__(self, address: str) -> None:
        self.path = address + ".lock"
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it (without waiting); True if this process now owns the address."""
        if self.fd is not None:
            return True
        held = _held.get(self.path)
        if held is not None and held[0] == os.getpid():
            return False  # another shared batcher of this process owns it: this one is a client
        fd = _open_lock(self.path)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # (EAGAIN or EACCES: held)
            os.close(fd)
            return False
        self.fd = fd
        _held[self.path] = (os.getpid(), self)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return True

    def release(self) -> None:
        """Give the lock up (the file stays)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if _held.get(self.path, (0, None))[1] is self:
            del _held[self.path]
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # (releases the lock)

    def holder(self) -> int | None:
        """The pid the lock file names (the owner's, if it is held), or None."""
        held = _held.get(self.path)
        if held is not None and held[0] == os.getpid():
            return held[0]  # (never open the file this process locks: closing that descriptor would unlock it)
        try:
            with open(self.path, "rb") as f:  # (read by path: this process holds no lock on it, or this is the fd's)
                text = f.read(32)
        except OSError:
            return None
        return int(text) if text.strip().isdigit() else None

    @property
    def held(self) -> bool:
        return self.fd is not None
