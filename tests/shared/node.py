"""A process of the fault tests: ``python -m tests.shared.node ADDRESS DIR --items 0:20 [--pace s] [--role r]``.

It starts a shared batcher of :func:`tests.shared.models.model` (which logs the model's calls to
``$SHARED_TEST_LOG``), writes ``DIR/ready-<pid>`` (its role), submits its items (``--pace`` seconds apart, or all
at once) and writes each one's outcome to ``DIR/out-<pid>.jsonl`` as it comes, then runs until SIGTERM, when it
stops gracefully (an owner hands over) and writes ``DIR/stopped-<pid>``.

``--die-at WHERE`` makes the process kill itself (SIGKILL: nothing of it runs after) at a moment a test cannot hit
from outside: ``handshake`` (an owner, as a client's answer to its challenge arrives), ``ended`` (an owner, as a
batch has ended and before its answers are written), ``answered`` (a client, once it has sent its answer to the
owner's challenge, its gone board made). ``--uvloop`` runs it on uvloop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from async_batcher.shared import SharedBatcher
from tests.shared.models import model


def die_at(where: str) -> None:
    """Patch the moment ``where`` (see the module's docstring) to kill this process."""
    from async_batcher.shared import _client_link, _owner, _owner_link

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "handshake":
        _owner_link.OwnerLink.handshake = lambda self, payload: die()  # type: ignore[method-assign]
    elif where == "ended":
        _owner.Owner.ended = lambda self, contexts: die()  # type: ignore[method-assign]
    elif where == "answered":
        original = _client_link.ClientLink.handshake

        def handshake(self: Any, payload: bytes) -> None:
            original(self, payload)
            if self.step == 1 and self.board is not None:
                die()

        _client_link.ClientLink.handshake = handshake  # type: ignore[method-assign]
    else:
        raise ValueError(f"--die-at {where!r}?")


async def main(
    address: str, directory: Path, items: range, pace: float, role: Any, timeout: float | None, owner_wait: float
) -> None:
    shared: SharedBatcher[Any, Any] = SharedBatcher(
        model, address=address, role=role, name="model", owner_wait=owner_wait
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    pid = os.getpid()
    out = open(directory / f"out-{pid}.jsonl", "a", buffering=1)  # noqa: ASYNC230 - a line per outcome

    async def one(item: int) -> None:
        try:
            value = await shared.process(item, timeout=timeout)
        except Exception as exc:
            record = {"item": item, "error": type(exc).__name__, "message": str(exc)}
        else:
            record = {"item": item, "ok": value[0] if isinstance(value, tuple) else value}  # (a Padded answer's)
        out.write(json.dumps(record) + "\n")

    async with shared:
        (directory / f".ready-{pid}").write_text(str(shared.role))
        (directory / f".ready-{pid}").rename(directory / f"ready-{pid}")  # (whole, or not there)
        tasks = []
        for item in items:
            tasks.append(asyncio.ensure_future(one(item)))
            if pace:
                await asyncio.sleep(pace)
        await asyncio.gather(*tasks)
        await stop.wait()
    out.close()
    (directory / f"stopped-{pid}").write_text("")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--items", default="0:0")
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--role", default="auto")
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--owner-wait", type=float, default=20.0)
    parser.add_argument("--die-at", default=None)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    if args.die_at:
        die_at(args.die_at)
    start, _, stop = args.items.partition(":")
    items = range(int(start), int(stop))
    run = main(args.address, args.directory, items, args.pace, args.role, args.timeout, args.owner_wait)
    if args.uvloop:
        import uvloop

        uvloop.run(run)
    else:
        asyncio.run(run)
