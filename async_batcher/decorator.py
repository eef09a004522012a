"""``@batch``: turn a function over a list of items into a function over one item, batched.

.. code-block:: python

    @batch(max_batch_size=64, max_queue_time=0.002)
    async def embed(texts: list[str]) -> list[list[float]]: ...

    vector = await embed("hello")

The function gets an :class:`~async_batcher.AsyncBatcher` of its own (a method gets one per instance); the
decorator only adapts it, so everything the batcher promises holds for the function.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable, Iterable, Sequence
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar, cast, overload

from async_batcher import _misuse
from async_batcher._checks import unexpected_keywords
from async_batcher.batcher import AsyncBatcher
from async_batcher.stats import BatcherStats

__all__ = ["BatchDecorator", "BatchedFunction", "BatchedMethod", "batch"]

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")


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
) -> type[_FunctionBatcher]:
    """The batcher class for ``func``: async, streaming or sync ``process_batch``, with the ``key`` / ``weight``
    hooks and continuous batching."""
    base: type[_FunctionBatcher]
    if inspect.isasyncgenfunction(func) or inspect.isasyncgenfunction(type(func).__call__):
        base = _StreamFunctionBatcher
    elif inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
        base = _AsyncFunctionBatcher
    else:
        base = _SyncFunctionBatcher
    if continuous and base is not _StreamFunctionBatcher:
        raise TypeError(f"@batch(continuous=True) needs an async generator function; {_qualname(func)!r} is not one")
    if key is None and weight is None and not continuous:
        return base  # the core can tell that the hooks are not overridden, and skip them
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": base.__qualname__}
    if continuous:
        namespace["continuous_batching"] = True
    if key is not None:
        _check_callable("key", key)

        def batch_key(self: Any, item: Any) -> Hashable:
            return key(item)

        namespace["batch_key"] = batch_key
    if weight is not None:
        _check_callable("weight", weight)

        def item_weight(self: Any, item: Any) -> float:
            return weight(item)

        namespace["item_weight"] = item_weight
    return type(base.__name__, (base,), namespace)


@functools.cache
def _options() -> frozenset[str]:
    """The options ``@batch(...)`` takes: the keywords of ``AsyncBatcher()``, and its own ``key``, ``weight`` and
    ``continuous``."""
    parameters = inspect.signature(AsyncBatcher.__init__).parameters.values()
    keywords = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return frozenset(p.name for p in parameters if p.kind in keywords and p.name != "self") | _OWN_OPTIONS


_OWN_OPTIONS = frozenset({"key", "weight", "continuous"})


def _check_flag(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, got {value!r}")
    return value


def _check_callable(what: str, value: object) -> None:
    if not callable(value):
        raise TypeError(f"{what} must be callable, got {value!r}")
    if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):
        # Called once per item as it is submitted, never awaited: its coroutine would be the key, or the weight.
        raise TypeError(f"{what} must be a plain function (it is called, never awaited), got {value!r}")


def _required_positionals(func: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: assume it takes the batch
        return 1
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional and p.default is p.empty)


def _qualname(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)


def _names(func: Callable[..., Any]) -> dict[str, Any]:
    """What a wrapper copies from the function it wraps (as ``functools.update_wrapper`` would)."""
    names = {a: getattr(func, a) for a in ("__module__", "__name__", "__qualname__", "__doc__") if hasattr(func, a)}
    names["__wrapped__"] = func
    return names


async def _holding_stream(instance: object, parts: AsyncIterator[R]) -> AsyncIterator[R]:
    """Iterate ``parts`` with ``instance`` alive until the stream ends (see :func:`_holding`)."""
    try:
        async for part in parts:
            yield part
    finally:
        await parts.aclose()  # type: ignore[attr-defined]


async def _holding(instance: object, call: Awaitable[R]) -> R:
    """Await ``call`` with ``instance`` alive until the result is in.

    A method's batcher holds its instance only weakly; this coroutine's argument is the caller's hold on it.
    """
    return await call


class BatchedFunction(Generic[T, R]):
    """A function of one item whose calls are batched: ``await f(item)`` gives that item's result.

    Made by :func:`batch`. Its :class:`~async_batcher.AsyncBatcher` is :attr:`batcher`; :attr:`stats`,
    :meth:`process_many` and :meth:`stop` are shortcuts to it.
    """

    __wrapped__: Callable[..., Any]

    def __init__(self, batcher: AsyncBatcher[T, R], func: Callable[..., Any], instance: object = None) -> None:
        #: The batcher behind the function: its settings can be changed live (``f.batcher.max_batch_size = 8``).
        self.batcher = batcher
        #: The instance of a method, ``None`` for a plain function.
        self.__self__ = instance
        self.__dict__.update(_names(func))

    @classmethod
    def _bound(cls, batcher: AsyncBatcher[T, R], names: dict[str, Any], instance: object) -> BatchedFunction[T, R]:
        # A method's is made at every attribute access, like a bound method: the fast way, without __init__.
        bound = cls.__new__(cls)
        bound.__dict__ = {"batcher": batcher, "__self__": instance, **names}
        return bound

    def __call__(self, item: T, *, timeout: float | None = None, priority: float = 0) -> Coroutine[Any, Any, R]:
        """Submit ``item`` and wait for its result (see :meth:`AsyncBatcher.process`)."""
        call = self.batcher.process(item, timeout=timeout, priority=priority)
        return call if self.__self__ is None else _holding(self.__self__, call)

    def stream(self, item: T, *, timeout: float | None = None, priority: float = 0) -> AsyncIterator[R]:
        """Submit ``item`` and iterate its results as the (async generator) function yields them (see
        :meth:`AsyncBatcher.stream`)."""
        parts = self.batcher.stream(item, timeout=timeout, priority=priority)
        return parts if self.__self__ is None else _holding_stream(self.__self__, parts)

    def process_many(
        self,
        items: Iterable[T],
        *,
        timeout: float | None = None,
        priority: float = 0,
        return_exceptions: bool = False,
    ) -> Coroutine[Any, Any, list[R]]:
        """Submit many items at once; their results in order (see :meth:`AsyncBatcher.process_many`)."""
        call = self.batcher.process_many(items, timeout=timeout, priority=priority, return_exceptions=return_exceptions)
        return call if self.__self__ is None else _holding(self.__self__, call)

    def sync(self, item: T, *, timeout: float | None = None, priority: float = 0) -> R:
        """Blocking call for sync code, from any thread but an event loop's (see :meth:`AsyncBatcher.process_sync`)."""
        return self.batcher.process_sync(item, timeout=timeout, priority=priority)

    def process_many_sync(
        self,
        items: Iterable[T],
        *,
        timeout: float | None = None,
        priority: float = 0,
        return_exceptions: bool = False,
    ) -> list[R]:
        """Blocking :meth:`process_many` for sync code (see :meth:`AsyncBatcher.process_many_sync`)."""
        return self.batcher.process_many_sync(
            items, timeout=timeout, priority=priority, return_exceptions=return_exceptions
        )

    def stop_sync(self, force: bool = False, timeout: float | None = None) -> None:
        """Blocking :meth:`stop` for sync code (see :meth:`AsyncBatcher.stop_sync`)."""
        self.batcher.stop_sync(force=force, timeout=timeout)

    def stop(self, force: bool = False, timeout: float | None = None) -> Coroutine[Any, Any, None]:
        """Stop the batcher (see :meth:`AsyncBatcher.stop`)."""
        return self.batcher.stop(force=force, timeout=timeout)

    @property
    def stats(self) -> BatcherStats:
        """A snapshot of the batcher's statistics."""
        return self.batcher.stats

    def __repr__(self) -> str:
        return f"<batched function {_qualname(self.__wrapped__)} of {self.batcher!r}>"


class BatchedMethod(Generic[S, T, R]):
    """A batched method: each instance gets its own batcher, made at first use and dropped with the instance.

    Reading the attribute on an instance gives a :class:`BatchedFunction` bound to it; on the class, this
    descriptor.
    """

    __wrapped__: Callable[..., Any]

    def __init__(self, func: Callable[..., Any], options: dict[str, Any], cls: type[_FunctionBatcher]) -> None:
        self._func = func
        self._options = options
        self._cls = cls
        self._batchers: dict[int, AsyncBatcher[T, R]] = {}  # by id(instance), removed when it dies
        self._lock = threading.Lock()
        self._names = _names(func)
        self.__dict__.update(self._names)

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.__name__ = name

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> BatchedMethod[S, T, R]: ...

    @overload
    def __get__(self, instance: S, owner: type[Any] | None = None) -> BatchedFunction[T, R]: ...

    def __get__(self, instance: S | None, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        batcher = self._batchers.get(id(instance))
        if batcher is None:
            batcher = self._new_batcher(instance)
        return BatchedFunction._bound(batcher, self._names, instance)

    def _new_batcher(self, instance: S) -> AsyncBatcher[T, R]:
        # Two threads reaching a new instance at once must end up with the same batcher.
        with self._lock:
            batcher = self._batchers.get(id(instance))
            if batcher is None:
                try:
                    weakref.finalize(instance, self._batchers.pop, id(instance), None)
                except TypeError:
                    raise TypeError(
                        f"@batch on {self._func.__qualname__} needs weak-referenceable instances; "
                        f"{type(instance).__qualname__} has __slots__ without '__weakref__'"
                    ) from None
                batcher = cast(AsyncBatcher[T, R], self._cls(self._func, instance, **self._options))
                self._batchers[id(instance)] = batcher
        return batcher

    def __repr__(self) -> str:
        return f"<batched method {_qualname(self._func)}>"


class BatchDecorator:
    """The type of :data:`batch`: a decorator, used bare (``@batch``) or with settings (``@batch(...)``)."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self._options: dict[str, Any] = options or {}

    @overload
    def __call__(self, func: Callable[[list[T]], AsyncIterator[Sequence[R]]], /) -> BatchedFunction[T, R]: ...

    @overload
    def __call__(self, func: Callable[[list[T]], Awaitable[Sequence[R]]], /) -> BatchedFunction[T, R]: ...

    @overload
    def __call__(self, func: Callable[[list[T]], Sequence[R]], /) -> BatchedFunction[T, R]: ...

    @overload
    def __call__(self, func: Callable[[S, list[T]], AsyncIterator[Sequence[R]]], /) -> BatchedMethod[S, T, R]: ...

    @overload
    def __call__(self, func: Callable[[S, list[T]], Awaitable[Sequence[R]]], /) -> BatchedMethod[S, T, R]: ...

    @overload
    def __call__(self, func: Callable[[S, list[T]], Sequence[R]], /) -> BatchedMethod[S, T, R]: ...

    @overload
    def __call__(
        self,
        *,
        max_batch_size: int = ...,
        max_queue_time: float = ...,
        concurrency: int = ...,
        max_queue_size: int = ...,
        executor: Executor | None = ...,
        wait_when_full: bool = ...,
        max_batch_weight: float | None = ...,
        max_priority_wait: float = ...,
        max_latency: float | None = ...,
        preferred_batch_sizes: Iterable[int] = ...,
        default_timeout: float | None = ...,
        stream_buffer: int = ...,
        stream_stall_timeout: float | None = ...,
        name: str | None = ...,
        key: Callable[[Any], Hashable] | None = ...,
        weight: Callable[[Any], float] | None = ...,
        continuous: bool = ...,
    ) -> BatchDecorator: ...

    def __call__(self, *args: Any, **options: Any) -> Any:
        """Decorate ``func``, or, given only settings, return a decorator that uses them.

        Args:
            func: An ``async def`` or plain ``def`` taking a list of items and returning one result per item
                (a plain ``def`` runs in ``executor``), or an async generator function yielding one part per item
                at each step (called with ``f.stream(item)``); or a method taking ``self`` and the list.
            **options: The keyword arguments of :class:`~async_batcher.AsyncBatcher` (``max_batch_size``,
                ``max_queue_time``, ``concurrency``, ``max_queue_size``, ``executor``, ``wait_when_full``,
                ``max_batch_weight``, ``max_priority_wait``, ``max_latency``, ``preferred_batch_sizes``,
                ``default_timeout``, ``stream_buffer``, ``stream_stall_timeout``, ``name``: the function's
                qualified name by default),
                ``key`` / ``weight``: callables of one item that become the batcher's ``batch_key`` (items with
                different keys never share a batch) and ``item_weight`` hooks, and ``continuous``: for an async
                generator function, let waiting items join a running batch between its steps.
        """
        if len(args) > 1:
            raise TypeError(f"batch() takes the function to decorate and keyword settings; got {args!r}")
        if not options.keys() <= _options():
            raise unexpected_keywords(options, _options(), "@batch()")
        merged = {**self._options, **options}
        if not args:
            return BatchDecorator(merged)
        func = args[0]
        if not callable(func):
            raise TypeError(
                f"batch() takes the function to decorate, or keyword settings only; got {func!r}"
                " (write @batch(max_batch_size=...))"
            )
        key = merged.pop("key", None)
        weight = merged.pop("weight", None)
        continuous = _check_flag("continuous", merged.pop("continuous", False))
        merged.setdefault("name", _qualname(func))
        cls = _batcher_class(func, key, weight, continuous=continuous)
        # Build a batcher now even for a method, so that bad settings fail at the decorator, not at first call.
        probe = cls(func, None, **merged)
        required = _required_positionals(func)
        if required == 1:
            return BatchedFunction(probe, func)
        if required == 2:
            return BatchedMethod(func, merged, cls)
        raise TypeError(
            f"@batch needs a function of one argument, the list of items (or a method of self and the list); "
            f"{_qualname(func)!r} has {required} required positional parameters"
        )

    def __repr__(self) -> str:
        return f"<async_batcher.batch {self._options!r}>" if self._options else "<async_batcher.batch>"


#: Decorator: ``@batch`` or ``@batch(max_batch_size=..., max_queue_time=..., key=..., weight=...)``.
batch = BatchDecorator()
