"""How a batcher is shared: :class:`Sharing`, the settings of a :class:`~async_batcher.shared.SharedBatcher` (and of
``@batch(shared=...)``), checked once (private; re-exported by :mod:`async_batcher.shared`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final, Literal

from async_batcher import _checks
from async_batcher.shared import _paths, _wire

__all__ = ["Sharing"]

#: The default ``max_message_size``: 64 MiB.
DEFAULT_MAX_MESSAGE_SIZE: Final = 64 * 1024 * 1024
Role = Literal["auto", "owner", "client"]
_ROLES: Final = ("auto", "owner", "client")


@dataclass(frozen=True, slots=True)
class Sharing:
    """How the processes of one machine share a batcher. Every field is optional.

    Args:
        address: The path of the Unix socket (and, beside it, of ``<address>.lock`` and ``<address>.key``). Every
            process that shares the batcher must use the same. By default a file in this user's runtime directory
            (``$XDG_RUNTIME_DIR`` or the temporary directory, then ``async-batcher-<uid>/``, mode 0700), named after
            the factory and the working directory; in production, pass your own (in a directory only the service's
            user can write to, ``/run/<service>/`` say).
        role: ``"auto"``: the first process to start owns the batcher, the others are its clients, and one of them
            takes over when the owner stops or dies. ``"owner"``: this process must own it (an error names the
            process that does, if another does). ``"client"``: this process never owns it (a dedicated owner runs
            ``python -m async_batcher.serve module:factory``).
        authkey: The key the processes prove they hold (bytes, 16 or more). ``None``: the owner writes a random one
            to ``<address>.key`` (mode 0600), which its clients read.
        max_message_size: The largest message, in bytes, between two processes: an item (or a result) larger
            than this, pickled, fails its caller with :class:`~async_batcher.MessageTooLargeError`. A client
            that leaves twice this much unread is disconnected.
        owner_wait: Seconds an item waits for an owner when there is none (not yet, or the last one stopped or
            died) before it fails with :class:`~async_batcher.OwnerUnavailableError`. ``None``: 10 seconds more
            than the last owner's factory took to load.
    """

    address: str | None = None
    role: Role = "auto"
    authkey: bytes | None = None
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    owner_wait: float | None = None

    def __post_init__(self) -> None:
        if self.address is not None:
            if not isinstance(self.address, str | os.PathLike):
                raise TypeError(f"address must be a path, got {self.address!r}")
            object.__setattr__(self, "address", os.path.abspath(os.fspath(self.address)))
        if self.role not in _ROLES:
            raise ValueError(f"role must be one of {', '.join(map(repr, _ROLES))}, got {self.role!r}")
        if self.authkey is not None and (not isinstance(self.authkey, bytes) or len(self.authkey) < 16):
            raise ValueError(f"authkey must be bytes, 16 or more of them (os.urandom(32)), got {self.authkey!r}")
        size = _checks.count("max_message_size", self.max_message_size, unlimited=False)
        if not 1024 <= size <= _wire.MAX_FRAME:
            raise ValueError(f"max_message_size must be between 1024 and {_wire.MAX_FRAME} bytes, got {size!r}")
        object.__setattr__(self, "max_message_size", size)
        if self.owner_wait is not None:
            object.__setattr__(self, "owner_wait", _checks.seconds("owner_wait", self.owner_wait))

    def __repr__(self) -> str:
        key = None if self.authkey is None else "<hidden>"  # (never a key in a log)
        return (
            f"Sharing(address={self.address!r}, role={self.role!r}, authkey={key}, "
            f"max_message_size={self.max_message_size}, owner_wait={self.owner_wait!r})"
        )


def address_of(sharing: Sharing, qualname: str) -> str:
    """The address, checked: the one given, or the default for the factory named ``qualname``."""
    return _paths.check_address(sharing.address) if sharing.address is not None else _paths.default_address(qualname)


def qualified_name(factory: object) -> str | None:
    """``module.qualname`` of a factory (``__main__`` for a spawned child's main module too), or None."""
    qualname = getattr(factory, "__qualname__", None)
    if not isinstance(qualname, str):
        return None
    module = getattr(factory, "__module__", None) or ""
    if module == "__mp_main__":  # (multiprocessing's name for the parent's __main__ in a spawned child)
        module = "__main__"
    return f"{module}.{qualname}" if module else qualname
