"""The batchers the shared batcher's tests share between their processes (importable by a child process): each
records its batches, and can log them to a file (the model's call log, which outlives a killed owner)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Hashable
from functools import partial
from typing import Any

from async_batcher import AsyncBatcher, Retry


class Model(AsyncBatcher[Any, Any]):
    """Doubles numbers; an item ``"fail"`` fails alone, ``"raise"`` fails the batch, ``("sleep", s)`` holds the batch
    ``s`` seconds. Records its batches; with ``log`` set, appends each batch to that file (one JSON line, written
    before the batch is processed: a record of what the model was called with, that a kill -9 does not lose)."""

    def __init__(self, *, log: str | None = None, delay: float = 0.0, gate: asyncio.Event | None = None, **kw: Any):
        super().__init__(**kw)
        self.log = log
        self.delay = delay
        self.gate = gate
        self.batches: list[list[Any]] = []

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        self.batches.append(list(batch))
        if self.log is not None:
            with open(self.log, "a") as f:  # noqa: ASYNC230 - written before the batch goes on, on purpose
                f.write(json.dumps({"pid": os.getpid(), "items": batch}) + "\n")
        if self.gate is not None:
            await self.gate.wait()
        for item in batch:
            if isinstance(item, list) and item[:1] == ["sleep"]:
                await asyncio.sleep(item[1])
        if self.delay:
            await asyncio.sleep(self.delay)
        if "raise" in batch:
            raise RuntimeError("the whole batch failed")
        return [_answer(x) for x in batch]

    @property
    def items(self) -> list[Any]:
        return [x for b in self.batches for x in b]


def _answer(x: Any) -> Any:
    if x == "fail":
        return ValueError("this item failed")
    if x == "retry":
        return Retry()
    if isinstance(x, int | float) and not isinstance(x, bool):
        return x * 2
    return x


class Keyed(Model):
    """Items are (key, value) pairs, batched by key; identical pairs share a row (dedup)."""

    def batch_key(self, item: Any) -> Hashable:
        return str(item[0])

    def dedup_key(self, item: Any) -> Hashable | None:
        return tuple(item)

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        self.batches.append(list(batch))
        if self.gate is not None:
            await self.gate.wait()
        return [f"{key}:{value}" for key, value in batch]


class Steps(AsyncBatcher[int, int]):
    """Streams: each item gets ``item`` parts (its value, counting down), one per step."""

    async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
        from async_batcher import END

        left = list(batch)
        while any(left):
            yield [n if n > 0 else END for n in left]
            left = [max(0, n - 1) for n in left]
            await asyncio.sleep(0)


class Unpicklable(Exception):
    """An exception that pickles but does not unpickle (its __init__ wants a keyword its args do not hold)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


class Odd(AsyncBatcher[Any, Any]):
    """Answers what does not cross: "lock" gets a lock (unpicklable), "exc" an Unpicklable, "big" 2 MiB of bytes."""

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        import threading

        out: list[Any] = []
        for x in batch:
            if x == "lock":
                out.append(threading.Lock())
            elif x == "exc":
                out.append(Unpicklable("no way back", code=7))
            elif x == "big":
                out.append(b"x" * (2 * 1024 * 1024))
            else:
                out.append(x)
        return out


def model(**kwargs: Any) -> Model:
    """The factory the child processes use: a Model logging to $SHARED_TEST_LOG/calls-<pid>.jsonl (after
    $SHARED_TEST_LOAD seconds of loading, if set: the factory runs in a thread)."""
    import time

    time.sleep(float(os.environ.get("SHARED_TEST_LOAD", "0")))
    log_dir = os.environ.get("SHARED_TEST_LOG")
    log = None if log_dir is None else os.path.join(log_dir, f"calls-{os.getpid()}.jsonl")
    delay = float(os.environ.get("SHARED_TEST_DELAY", "0"))
    size = int(os.environ.get("SHARED_TEST_BATCH", "8"))
    pad = int(os.environ.get("SHARED_TEST_PAD", "0"))
    made = Model if not pad else partial(Padded, pad=pad)
    return made(log=log, delay=delay, max_batch_size=size, max_queue_time=0.001, concurrency=1, **kwargs)


class Padded(Model):
    """A Model whose answers are ``(answer, pad bytes)``: large answers (``$SHARED_TEST_PAD`` for the nodes)."""

    def __init__(self, *, pad: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.pad = pad

    async def process_batch(self, batch: list[Any]) -> list[Any]:
        return [(answer, bytes(self.pad)) for answer in await super().process_batch(batch)]


async def never() -> Model:
    """A factory that never returns (a model that hangs as it loads): ``python -m async_batcher.serve`` tests."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")
