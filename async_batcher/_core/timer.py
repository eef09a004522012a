"""The dispatcher's one timer: armed for the earliest time a lane's batch is due, and nothing else (private; the
dispatch layer, below the :class:`~async_batcher._core.dispatcher.Dispatcher` that owns it).

The dispatcher arms it (:meth:`Timer.arm`) when a pass leaves lanes waiting for a deadline with a slot free, and
cancels it (:meth:`Timer.cancel`) when nothing waits: an idle batcher schedules no wake-up. When it fires it calls
the callback it was given (the dispatcher's pump), having kept the deadline it fired for (``fired_for``): a timer may
fire a hair before its time by the loop's clock resolution, and the pump takes that deadline as due.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

__all__: list[str] = []


class Timer:
    """One loop timer, for the earliest deadline it was armed for (see the module's docstring).

    Invariant: ``handle`` is the timer to come (``None``: none), armed for ``at``. The deadline is kept here: for a
    time already past, uvloop's ``call_at`` gives a plain ``Handle``, which has no ``when()``.
    """

    __slots__ = ("at", "fired_for", "handle", "loop", "on_fire")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_fire: Callable[[], None]) -> None:
        self.loop = loop
        self.on_fire = on_fire
        self.handle: asyncio.Handle | None = None
        self.at = 0.0
        self.fired_for = 0.0  # the deadline of the last timer that fired

    def arm(self, deadline: float) -> None:
        """Make sure ``on_fire`` is called at ``deadline``: one timer, for the earliest deadline."""
        if self.handle is not None:
            if self.at <= deadline:
                return  # it fires first and will look again
            self.handle.cancel()
        self.handle = self.loop.call_at(deadline, self._fire, deadline)
        self.at = deadline

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self, when: float) -> None:
        self.handle = None
        self.fired_for = when
        self.on_fire()
