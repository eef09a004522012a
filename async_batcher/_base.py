"""What the core's layers know of a batcher: :class:`Base`, the one base of :class:`~async_batcher.AsyncBatcher`
(private).

The layers below the public class (policy, execution, dispatch, lifecycle, admission) take a batcher as a
:class:`Base`: its live settings (:class:`~async_batcher._settings.Settings`), its name, its counters, its
current run, the gate its blocking calls share, and the hooks they call. They never import the public class;
:class:`~async_batcher.AsyncBatcher` implements the hooks.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

from async_batcher._settings import Settings

if TYPE_CHECKING:
    from collections.abc import Hashable

    from async_batcher._run import Run
    from async_batcher._threads import Gate
    from async_batcher.stats import _Recorder

__all__: list[str] = []

#: The hooks a subclass may override; :attr:`Base._overridden` says which it did.
HOOKS = ("batch_key", "item_weight", "on_start", "on_stop", "abandoned_error")
#: The hooks the batcher awaits (an ``async def``); the others it calls without awaiting (a plain ``def``).
AWAITED = ("on_start", "on_stop")


def check_hooks(cls: type[Base]) -> None:
    """Refuse, as the class is defined, an overridden hook of the wrong kind: a plain ``def on_start`` (the batcher
    would await its ``None``), an ``async def batch_key`` (its coroutine would be each item's key). A callable that
    is not a plain function is taken as it is: what ``on_start`` and ``on_stop`` return is checked as they run."""
    for name in cls._overridden:
        hook = getattr(cls, name)
        if not callable(hook):
            raise TypeError(f"{cls.__name__}.{name} must be a method, got {hook!r}")
        if not inspect.isfunction(inspect.unwrap(hook)):
            continue
        is_async = inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(inspect.unwrap(hook))
        if name in AWAITED and not is_async:
            raise TypeError(f"{cls.__name__}.{name} must be an async def: the batcher awaits it; got {_kind(hook)}")
        if name not in AWAITED and (inspect.iscoroutinefunction(hook) or inspect.isasyncgenfunction(hook)):
            raise TypeError(
                f"{cls.__name__}.{name} must be a plain def: the batcher calls it without awaiting it; got "
                f"{_kind(hook)}"
            )


def _kind(hook: Any) -> str:
    if inspect.isasyncgenfunction(hook):
        return "an async generator function"
    return "an async def" if inspect.iscoroutinefunction(hook) else "a plain def"


class Base(Settings):
    """A batcher as the core's layers see it. Its one subclass is :class:`~async_batcher.AsyncBatcher`."""

    name: str
    _recorder: _Recorder
    _run: Run  # the current run (a new one at each start)
    _sync: Gate  # what blocking calls from threads share
    #: The hooks of :data:`HOOKS` the class overrides (set for each subclass as it is defined): a hook left alone
    #: costs nothing, it is never called.
    _overridden: ClassVar[frozenset[str]] = frozenset()
    continuous_batching: ClassVar[bool] = False
    #: The loop's turns a batch's end lets pass before the next batch forms, while items wait, and the first arrival
    #: after a batch that answered a cohort (:func:`~async_batcher._dispatch.batch_ended`); 0 sends at once (the
    #: benchmarks' plain greedy reference).
    _turns: int = 4
    #: Whether the turns apply to that first arrival (off: the benchmarks' reference of the rule before it).
    _regather: bool = True

    if TYPE_CHECKING:  # implemented by AsyncBatcher

        def process_batch(self, batch: list[Any]) -> Any: ...

        def batch_key(self, item: Any) -> Hashable: ...

        def item_weight(self, item: Any) -> float: ...

        async def on_start(self) -> None: ...

        async def on_stop(self) -> None: ...

        def abandoned_error(self, batch: list[Any], error: BaseException) -> BaseException: ...
