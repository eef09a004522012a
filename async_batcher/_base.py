"""What the core's layers know of a batcher: :class:`Base`, the one base of :class:`~async_batcher.AsyncBatcher`
(private).

The layers below the public class (policy, execution, dispatch, lifecycle, admission) take a batcher as a
:class:`Base`: its live settings (:class:`~async_batcher._settings.Settings`), its name, its counters, its
current run, the gate its blocking calls share, and the hooks they call. They never import the public class;
:class:`~async_batcher.AsyncBatcher` implements the hooks.
"""

from __future__ import annotations

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

    if TYPE_CHECKING:  # implemented by AsyncBatcher

        def process_batch(self, batch: list[Any]) -> Any: ...

        def batch_key(self, item: Any) -> Hashable: ...

        def item_weight(self, item: Any) -> float: ...

        async def on_start(self) -> None: ...

        async def on_stop(self) -> None: ...

        def abandoned_error(self, batch: list[Any], error: BaseException) -> BaseException: ...
