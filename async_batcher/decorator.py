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
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from async_batcher._checks import unexpected_keywords
from async_batcher._core.options import OPTIONS, BatcherOptions
from async_batcher._functions import _batcher_class, _FunctionBatcher, _qualname
from async_batcher.batcher import AsyncBatcher
from async_batcher.stats import BatcherStats

if TYPE_CHECKING:
    from typing import Unpack

    from async_batcher.shared import SharedBatcher, Sharing

__all__ = ["BatchDecorator", "BatchedFunction", "BatchedMethod", "batch"]

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")


@functools.cache
def _options() -> frozenset[str]:
    """The options ``@batch(...)`` takes: the keywords of ``AsyncBatcher()`` (:class:`BatcherOptions`, the one
    definition both share), and its own ``key``, ``weight``, ``dedup``, ``copy_result``, ``continuous`` and
    ``shared``."""
    return OPTIONS | _OWN_OPTIONS


_OWN_OPTIONS = frozenset({"key", "weight", "dedup", "copy_result", "continuous", "shared"})


def _check_flag(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, got {value!r}")
    return value


def _required_positionals(func: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: assume it takes the batch
        return 1
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional and p.default is p.empty)


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


def _shared(
    func: Callable[..., Any], cls: type[_FunctionBatcher], options: dict[str, Any], shared: object
) -> SharedBatcher[Any, Any]:
    """The shared batcher of ``@batch(shared=...)``: its factory makes the function's batcher, in the owner."""
    from async_batcher.shared import SharedBatcher, Sharing

    if shared is True:
        sharing = Sharing()
    elif isinstance(shared, Sharing):
        sharing = shared
    else:
        raise TypeError(f"shared must be True, False or an async_batcher.shared.Sharing, got {shared!r}")

    def factory() -> _FunctionBatcher:
        return cls(func, None, **options)

    # (Named as the function: the default address is named after it, the same in every process.)
    factory.__module__ = getattr(func, "__module__", None) or factory.__module__
    factory.__qualname__ = _qualname(func)
    return SharedBatcher(
        factory,
        name=options["name"],
        address=sharing.address,
        role=sharing.role,
        authkey=sharing.authkey,
        max_message_size=sharing.max_message_size,
        owner_wait=sharing.owner_wait,
    )


class BatchedFunction(Generic[T, R]):
    """A function of one item whose calls are batched: ``await f(item)`` gives that item's result.

    Made by :func:`batch`. Its :class:`~async_batcher.AsyncBatcher` is :attr:`batcher`; :attr:`stats`,
    :meth:`process_many` and :meth:`stop` are shortcuts to it.
    """

    __wrapped__: Callable[..., Any]

    def __init__(
        self, batcher: AsyncBatcher[T, R] | SharedBatcher[T, R], func: Callable[..., Any], instance: object = None
    ) -> None:
        #: The batcher behind the function: its settings can be changed live (``f.batcher.max_batch_size = 8``). With
        #: ``shared=``, a :class:`~async_batcher.shared.SharedBatcher` (the same calls; the batcher itself is its
        #: ``batcher``, in the process that owns it), typed as the common case.
        self.batcher: AsyncBatcher[T, R] = cast("AsyncBatcher[T, R]", batcher)
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
        key: Callable[[Any], Hashable] | None = ...,
        weight: Callable[[Any], float] | None = ...,
        dedup: Callable[[Any], Hashable | None] | None = ...,
        copy_result: Callable[[Any], Any] | None = ...,
        continuous: bool = ...,
        shared: bool | Sharing = ...,
        **options: Unpack[BatcherOptions],
    ) -> BatchDecorator: ...

    def __call__(self, *args: Any, **options: Any) -> Any:
        """Decorate ``func``, or, given only settings, return a decorator that uses them.

        Args:
            func: An ``async def`` or plain ``def`` taking a list of items and returning one result per item
                (a plain ``def`` runs in ``executor``), or an async generator function yielding one part per item
                at each step (called with ``f.stream(item)``); or a method taking ``self`` and the list.
            **options: The keyword arguments of :class:`~async_batcher.AsyncBatcher`
                (:class:`~async_batcher.BatcherOptions`: ``limits``, ``policy``, ``max_batch_size``,
                ``max_queue_time``, ...; ``name``: the function's qualified name by default),
                ``key`` / ``weight``: callables of one item that become the batcher's ``batch_key`` (items with
                different keys never share a batch) and ``item_weight`` hooks; ``dedup``: a callable of one item
                that becomes its ``dedup_key`` (identical items waiting or in flight share one row and one result),
                and ``copy_result``: its ``copy_result`` (each sharing caller's copy of the result; ``copy.copy`` by
                default); ``continuous``: for an async generator function, let waiting items join a running
                batch between its steps; and ``shared``: ``True`` (or a :class:`~async_batcher.shared.Sharing` of
                settings) to share the batcher among the processes of the machine (a function at module level,
                not a method): the process that owns it calls the function, the others send it their items
                (:class:`~async_batcher.shared.SharedBatcher`).
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
        dedup = merged.pop("dedup", None)
        copy_result = merged.pop("copy_result", None)
        continuous = _check_flag("continuous", merged.pop("continuous", False))
        shared = merged.pop("shared", False)
        merged.setdefault("name", _qualname(func))
        cls = _batcher_class(func, key, weight, continuous=continuous, dedup=dedup, copy_result=copy_result)
        # Build a batcher now even for a method, so that bad settings fail at the decorator, not at first call.
        probe = cls(func, None, **merged)
        required = _required_positionals(func)
        if shared is not False:
            if required != 1:
                raise TypeError(
                    f"@batch(shared=...) shares a function of the module among processes; {_qualname(func)!r} is not "
                    "one (a method's batcher belongs to its instance, which other processes do not have)"
                )
            return BatchedFunction(_shared(func, cls, merged, shared), func)
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
