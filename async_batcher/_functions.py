"""The batchers behind ``@batch`` functions: a ``process_batch`` that calls the function, and the hooks made of the
decorator's ``key``, ``weight``, ``dedup`` and ``copy_result`` (private; :mod:`async_batcher.decorator`'s)."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any

from async_batcher import _misuse
from async_batcher.batcher import AsyncBatcher

__all__: list[str] = []


class _FunctionBatcher(AsyncBatcher[Any, Any]):
    """The batcher behind a decorated function: its ``process_batch`` calls the function with the batch.

    For a method it holds its instance weakly: the instance owns the batcher (through the descriptor's table),
    not the other way round, so dropping the instance frees both. A caller keeps the instance alive while it
    waits, because the :class:`BatchedFunction` it called holds it.
    """

    def __init__(self, func: Callable[..., Any], owner: object | None, **options: Any) -> None:
        super().__init__(**options)
        self.func = func
        self._owner: Callable[[], object] | None = None
        if owner is not None:
            self._owner = weakref.ref(owner)

    def _call(self, batch: list[Any]) -> Any:
        if self._owner is None:
            return self.func(batch)
        owner = self._owner()
        if owner is None:  # only reachable through a batcher kept after its instance was dropped
            raise ReferenceError(f"{self.name}: the instance this batcher belongs to no longer exists")
        return self.func(owner, batch)

    def _checked(self, results: Any, n: int) -> Any:
        return _misuse.checked(self.func, results, n, method=self._owner is not None)

    def _noted(self, exc: BaseException) -> None:
        _misuse.note(self.func, exc, method=self._owner is not None)


class _AsyncFunctionBatcher(_FunctionBatcher):
    async def process_batch(self, batch: list[Any]) -> Any:
        try:
            results = await self._call(batch)
        except Exception as exc:
            self._noted(exc)
            raise
        return self._checked(results, len(batch))


class _StreamFunctionBatcher(_FunctionBatcher):
    # An async generator function: its steps are the batch's, and callers iterate stream().
    async def process_batch(self, batch: list[Any]) -> AsyncIterator[Any]:
        try:
            async for step in self._call(batch):
                yield self._checked(step, len(batch))  # (the batch as it is at this step)
        except Exception as exc:
            self._noted(exc)
            raise


class _SyncFunctionBatcher(_FunctionBatcher):
    # A plain def: the core runs it in the batcher's executor, off the event loop.
    def process_batch(self, batch: list[Any]) -> Any:
        try:
            results = self._call(batch)
        except Exception as exc:
            self._noted(exc)
            raise
        if inspect.isawaitable(results):  # (the core awaits it on the loop)
            return self._awaited(results, len(batch))
        return self._checked(results, len(batch))

    async def _awaited(self, results: Awaitable[Any], n: int) -> Any:
        return self._checked(await results, n)


def _batcher_class(
    func: Callable[..., Any],
    key: Callable[[Any], Hashable] | None,
    weight: Callable[[Any], float] | None,
    *,
    continuous: bool,
    dedup: Callable[[Any], Hashable | None] | None = None,
    copy_result: Callable[[Any], Any] | None = None,
) -> type[_FunctionBatcher]:
    """The batcher class for ``func``: async, streaming or sync ``process_batch``, with the ``key`` / ``weight`` /
    ``dedup`` / ``copy_result`` hooks and continuous batching."""
    base: type[_FunctionBatcher]
    if inspect.isasyncgenfunction(func) or inspect.isasyncgenfunction(type(func).__call__):
        base = _StreamFunctionBatcher
    elif inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
        base = _AsyncFunctionBatcher
    else:
        base = _SyncFunctionBatcher
    if continuous and base is not _StreamFunctionBatcher:
        raise TypeError(f"@batch(continuous=True) needs an async generator function; {_qualname(func)!r} is not one")
    if key is None and weight is None and dedup is None and copy_result is None and not continuous:
        return base  # the core can tell that the hooks are not overridden, and skip them
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": base.__qualname__}
    if continuous:
        namespace["continuous_batching"] = True
    hooks: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
        "batch_key": ("key", key),
        "item_weight": ("weight", weight),
        "dedup_key": ("dedup", dedup),
        "copy_result": ("copy_result", copy_result),
    }
    for hook, (option, given) in hooks.items():
        if given is not None:
            _check_callable(option, given)
            namespace[hook] = _method(given)
    return type(base.__name__, (base,), namespace)


def _method(func: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """A hook of the batcher's class that calls ``func`` with its one argument (an item, or a result)."""

    def hook(self: Any, value: Any) -> Any:
        return func(value)

    return hook


def _check_callable(what: str, value: object) -> None:
    if not callable(value):
        raise TypeError(f"{what} must be callable, got {value!r}")
    if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):
        # Called once per item as it is submitted, never awaited: its coroutine would be the key, or the weight.
        raise TypeError(f"{what} must be a plain function (it is called, never awaited), got {value!r}")


def _qualname(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)
