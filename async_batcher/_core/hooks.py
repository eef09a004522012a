"""The hooks a batcher's class may override, and the check of their kind as the class is defined (private)."""

from __future__ import annotations

import inspect
from typing import Any

__all__: list[str] = []

#: The hooks a subclass may override; a hook left alone costs nothing: it is never called.
HOOKS = ("batch_key", "item_weight", "dedup_key", "copy_result", "on_start", "on_stop", "abandoned_error")
#: The hooks the batcher awaits (an ``async def``); the others it calls without awaiting (a plain ``def``).
AWAITED = ("on_start", "on_stop")


def overridden(cls: type[Any], base: type[Any]) -> frozenset[str]:
    """The hooks of :data:`HOOKS` that ``cls`` overrides, ``base`` defining them all."""
    return frozenset(name for name in HOOKS if getattr(cls, name) is not getattr(base, name))


def check_hooks(cls: type[Any], names: frozenset[str]) -> None:
    """Refuse, as the class is defined, an overridden hook of the wrong kind: a plain ``def on_start`` (the batcher
    would await its ``None``), an ``async def batch_key`` (its coroutine would be each item's key). A callable that
    is not a plain function is taken as it is: what ``on_start`` and ``on_stop`` return is checked as they run."""
    for name in names:
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
