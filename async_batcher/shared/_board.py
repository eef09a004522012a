"""The gone board: which of a client's items went into a batch, written by the owner into memory the two share
(private; beside :mod:`~async_batcher.shared._wire`, at the bottom).

When an owner dies, its client must tell an item whose outcome is unknown (it went into a batch: ``process_batch``
may have written, sent, charged) from one safe to send to the next owner. The owner knows as each batch goes; the
client must know even if the owner is killed the next instant. A message per batch would say it, at the price of a
write and a wake-up of the client per batch (measured: a quarter more on a round trip at one caller, and ten times
the p99 on a loaded machine), and a message still in the owner's buffers dies with it. Here the client makes a small
file in memory (``/dev/shm``, else the socket's directory: mode 0600, a random name) and maps it; the owner maps it
too (the path comes in the client's hello, after the key's challenge) and, before ``process_batch`` is called, writes
each item's id in its slot (``id % SLOTS``): a store, no system call, no wake-up, and nothing to lose when the owner
dies, since the memory is the client's as much. The client removes the file's name once the owner has mapped it (the
mapping lives on in both), and reads the board only when the connection drops.

A slot is one unresolved call's: the client gives a new call an id whose slot no unresolved call holds (else a call
that stays unresolved while ``SLOTS`` others pass, a long stream, would find its mark overwritten by a later call's
and be sent again after it went). Only with more unresolved calls than slots do two share one: the client then takes
both as gone (reporting an outcome unknown that was not is safe; sending again an item that went is not).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from typing import Final

__all__: list[str] = []

#: Slots of a board: ids 8 bytes each (1 MiB, its pages touched only as the ids reach them).
SLOTS: Final = 1 << 17
SIZE: Final = 8 * SLOTS


class Board:
    """One connection's board, mapped (see the module's docstring)."""

    __slots__ = ("map", "path", "slots")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        try:
            self.map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.slots = memoryview(self.map).cast("Q")

    @classmethod
    def create(cls, beside: str) -> Board:
        """A new board (the client's), in ``/dev/shm`` if the system has it, else in the directory of ``beside``."""
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else os.path.dirname(beside)
        path = os.path.join(directory, f"async-batcher-{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        return cls(path, fd)

    @classmethod
    def attach(cls, path: str) -> Board:
        """The board a client made (the owner's side): refused unless it is this user's alone, and of its size."""
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o077 or info.st_size != SIZE:
            os.close(fd)
            raise PermissionError(f"{path} is not a board of this user's alone, or not of its size")
        return cls(path, fd)

    def mark(self, id: int) -> None:
        """The owner: item ``id`` has gone into a batch."""
        self.slots[id & (SLOTS - 1)] = id

    def gone(self, ids: list[int]) -> set[int]:
        """The client: which of ``ids`` (its items sent and not answered) have gone."""
        by_slot: dict[int, list[int]] = {}
        for id in ids:
            by_slot.setdefault(id & (SLOTS - 1), []).append(id)
        found: set[int] = set()
        for slot, group in by_slot.items():
            if len(group) > 1:  # (either may have overwritten the other's mark: both are taken as gone)
                found.update(group)
            elif self.slots[slot] == group[0]:
                found.add(group[0])
        return found

    def unlink(self) -> None:
        """Remove the file's name (the mappings live on)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        self.slots.release()
        self.map.close()
