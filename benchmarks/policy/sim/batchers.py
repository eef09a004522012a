"""The batchers under test, each wired as its README shows, around the simulated model (a plain ``def``, run in the
model's executor, as in the HTTP benchmark's apps).

* ``ours``: this package's ``AsyncBatcher`` subclass; ``executor=`` the model's; keyed traffic through its
  ``batch_key`` hook (one batcher, the keys' lanes sharing its slot).
* ``async-batcher-0.2.2``: its ``AsyncBatcher`` subclass, the same way (it shares this package's import name: it
  runs in a process and environment of its own); keyed traffic through one batcher per key, all on the one model
  executor, as a user without a key hook would do.
* ``batched``: ``batched.aio.dynamically`` on the plain ``def``, which it runs with ``asyncio.to_thread`` (the loop's
  default executor: here the model's); keyed traffic through one processor per key.

Keyed traffic is like for like where it matters: every batcher's model calls run in the one model thread (the
simulator's one-worker executor: 0.2.2's batchers get it as ``executor=``, batched's ``asyncio.to_thread`` lands in
the loop's default executor, which is the same one), one batch at a time, at the same cost. What differs is each
design's own: a peer's batchers per key each send their batch when their own rule says, and the batches queue for
the model thread (up to one per key in flight); ours, with one slot (``concurrency=1``), forms the next batch when
the model is free, of the due key served longest ago. ``--variant slots32`` runs ours with a slot per key.

Both peers time themselves by the loop's clock (``loop.time()``, ``asyncio.sleep``, ``asyncio.wait_for``): they
need no patching (the simulator counts wall-clock reads all the same, :func:`.server.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .server import Adapter, MakeAdapter
from .vloop import SimExecutor

__all__ = ["KINDS", "adapter_factory"]

KINDS = ("ours", "async-batcher-0.2.2", "batched")
BatchFn = Callable[[list[Any]], list[Any]]


def adapter_factory(kind: str, make_kwargs: Callable[[], dict[str, Any]]) -> MakeAdapter:
    """What builds batcher ``kind`` for a run; ``make_kwargs()`` gives its keyword arguments (called once per
    batcher built, so that an object among them, a policy say, is never shared between runs)."""
    if kind not in KINDS:
        raise ValueError(f"unknown batcher kind {kind!r}; expected one of {KINDS}")

    def make(model: BatchFn, executor: SimExecutor, keyed: bool) -> Adapter:
        if kind == "ours":
            return _ours(model, executor, keyed, make_kwargs)
        if kind == "async-batcher-0.2.2":
            return _per_key(keyed, lambda: _old(model, executor, make_kwargs()))
        return _per_key(keyed, lambda: _batched(model, make_kwargs()))

    return make


def _subclass(model: BatchFn, keyed: bool) -> type[Any]:
    from async_batcher.batcher import AsyncBatcher

    class Simulated(AsyncBatcher):  # type: ignore[misc,type-arg]
        def process_batch(self, batch: list[Any]) -> list[Any]:
            return model(batch)

    if keyed:

        class KeyedSimulated(Simulated):
            def batch_key(self, item: Any) -> Any:
                return item[0]

        return KeyedSimulated
    return Simulated


def _ours(model: BatchFn, executor: SimExecutor, keyed: bool, make_kwargs: Callable[[], dict[str, Any]]) -> Adapter:
    batcher = _subclass(model, keyed)(**{**make_kwargs(), "executor": executor})
    batcher.start()
    return Adapter(batcher.process, batcher.stop)


def _old(model: BatchFn, executor: SimExecutor, kwargs: dict[str, Any]) -> Adapter:
    batcher = _subclass(model, False)(**{**kwargs, "executor": executor})

    async def close() -> None:
        await batcher.stop(force=True)  # without force its stop polls its queue for up to a second

    return Adapter(batcher.process, close)


def _batched(model: BatchFn, kwargs: dict[str, Any]) -> Adapter:
    from batched import aio

    def predict(items: list[Any]) -> list[Any]:  # a plain def: batched runs it with asyncio.to_thread
        return model(items)

    processor = aio.dynamically(predict, **kwargs)

    async def close() -> None:
        pass  # it has no stop: its polling task is cancelled with the run's leftovers

    return Adapter(processor, close)


def _per_key(keyed: bool, build: Callable[[], Adapter]) -> Adapter:
    if not keyed:
        return build()
    by_key: dict[Any, Adapter] = {}

    async def submit(item: Any) -> Any:
        adapter = by_key.get(item[0])
        if adapter is None:
            adapter = by_key[item[0]] = build()
        return await adapter.submit(item)

    async def close() -> None:
        for adapter in by_key.values():
            await adapter.close()

    return Adapter(submit, close)
