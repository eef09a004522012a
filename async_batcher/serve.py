"""``python -m async_batcher.serve module:factory``: a process that owns a shared batcher and does nothing else.

.. code-block:: text

    python -m async_batcher.serve myapp.models:make_predictor --address /run/myapp/predictor.sock

It calls the factory (a zero-argument callable returning an :class:`~async_batcher.AsyncBatcher`, or an awaitable of
one), serves the batcher on the socket until SIGTERM or SIGINT, then stops it, draining what it accepted. The app's
workers use ``SharedBatcher(make_predictor, address=..., role="client")``: none of them loads the model, and their
items wait (``owner_wait``) while this process starts or restarts. With ``--authkey-file``, the key is the file's
content (the workers pass the same bytes as ``authkey=``); without it, a random key is written beside the socket
for the workers to read (same user).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from async_batcher.exceptions import BatcherStoppedError
from async_batcher.shared import SharedBatcher

__all__ = ["main"]

logger = logging.getLogger("async_batcher.serve")


def load(target: str) -> Callable[[], Any]:
    """The callable ``module:attribute`` (dotted attributes allowed) names; a clear error if it does not."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"expected module:factory (e.g. myapp.models:make_predictor), got {target!r}")
    module = importlib.import_module(module_name)
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no {attribute!r}") from None
    if not callable(found):
        raise TypeError(f"{target} is {found!r}, not a callable that makes the batcher")
    return found  # type: ignore[no-any-return]


async def serve(shared: SharedBatcher[Any, Any], stop_timeout: float | None) -> None:
    """Own ``shared`` until SIGTERM or SIGINT, then stop it (draining, at most ``stop_timeout`` seconds). A signal
    while the factory still loads ends the start (an ``async def`` factory is cancelled; a thread's is left to
    finish, and what it makes dropped)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    starting = asyncio.ensure_future(shared.__aenter__())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            logger.info("%s: stopping before its factory is done", shared.name)
            await shared.stop(timeout=stop_timeout)
            await asyncio.wait([starting])
            with contextlib.suppress(BatcherStoppedError):
                starting.result()
            return
        starting.result()  # (the factory's error, if it failed)
        logger.info("%s: serving at %s", shared.name, shared.address)
        await stopped
        logger.info("%s: stopping", shared.name)
        await shared.stop(timeout=stop_timeout)
    finally:
        stopped.cancel()
        await shared.stop(timeout=stop_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m async_batcher.serve module:factory [--address PATH] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m async_batcher.serve", description="Own a shared batcher: serve it to the other processes."
    )
    parser.add_argument("factory", help="module:callable that returns the AsyncBatcher (called once, here)")
    parser.add_argument("--address", help="the socket's path (default: derived from the factory and the directory)")
    parser.add_argument("--name", help="the batcher's name (default: the factory's)")
    parser.add_argument("--authkey-file", help="a file whose content is the key (default: a random key file)")
    parser.add_argument("--max-message-size", type=int, default=None, help="bytes (default: 64 MiB)")
    parser.add_argument("--stop-timeout", type=float, default=None, help="seconds the stop may drain")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        factory = load(args.factory)
    except (ImportError, ValueError, TypeError) as exc:
        parser.error(str(exc))
    options: dict[str, Any] = {"address": args.address, "name": args.name, "role": "owner"}
    if args.authkey_file:
        with open(args.authkey_file, "rb") as f:
            options["authkey"] = f.read().strip()
    if args.max_message_size is not None:
        options["max_message_size"] = args.max_message_size
    shared: SharedBatcher[Any, Any] = SharedBatcher(factory, **options)
    try:
        asyncio.run(serve(shared, args.stop_timeout))
    except Exception as exc:
        logger.error("%s: %s: %s", shared.name, type(exc).__name__, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
