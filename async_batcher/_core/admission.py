"""How items get in: the run they go to, their priority and deadline checked, or their refusal (private).

:meth:`AsyncBatcher.process` takes the short path (:meth:`Engine.put <async_batcher._core.engine.Engine.put>`)
when it can; everything else comes here. :class:`Admission` finds the run the items go to (starting one, or refusing
them: stopped, a call that would wait for itself), then hands them to that run's
:class:`~async_batcher._core.intake.Intake`, which owns the long paths (keys, weights, timeouts, a full queue,
``process_many``, ``stream``, single flight).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from async_batcher import _checks
from async_batcher._core.intake import Intake
from async_batcher._core.refusal import LateRefusal

if TYPE_CHECKING:
    from async_batcher._core.lifecycle import Lifecycle
    from async_batcher._core.settings import Settings

__all__: list[str] = []


class Admission:
    """The long paths in, for one batcher: each run's :class:`Intake` (see the module's docstring)."""

    def __init__(self, life: Lifecycle, settings: Settings) -> None:
        self.life = life
        self.settings = settings
        self.late = LateRefusal(life.name, settings, life.recorder)  # refuse_late: what it measures outlives runs
        self.intake: Intake | None = None  # the current run's

    @property
    def name(self) -> str:
        return self.life.name

    def _admit(self, n: int, timeout: float | None, priority: float) -> tuple[Intake, float, float | None]:
        """The intake of the run ``n`` items go to, their priority and deadline; or refuse them."""
        priority = _checks.priority(priority)
        timeout = self.settings.default_timeout if timeout is None else _checks.timeout(timeout)
        if timeout is None and self.settings.refuse_late:
            self.late.refuse_without_deadline()
        loop = asyncio.get_running_loop()
        engine = self.life.admit(loop, n).engine
        assert engine is not None
        intake = self.intake
        if intake is None or intake.engine is not engine:
            life = self.life
            intake = self.intake = Intake(
                engine,
                name=life.name,
                settings=self.settings,
                hooks=life.hooks,
                recorder=life.recorder,
                late=self.late,
                deduplicated="dedup_key" in life.overridden,
            )
        return intake, priority, None if timeout is None else loop.time() + timeout

    def _not_streaming(self, intake: Intake) -> None:
        if intake.streams:
            raise TypeError(
                f"{self.name} streams its results (process_batch is an async generator): iterate stream(item)"
            )

    async def submit(self, item: Any, *, timeout: float | None, priority: float) -> Any:
        """:meth:`AsyncBatcher.process` with a key, a weight, a priority, a timeout or a full queue; or not running."""
        intake, priority, deadline = self._admit(1, timeout, priority)
        self._not_streaming(intake)
        return await intake.submit(item, deadline, priority)

    async def submit_many(
        self, items: Iterable[Any], *, timeout: float | None, priority: float, return_exceptions: bool
    ) -> list[Any]:
        """:meth:`AsyncBatcher.process_many`: admitted whole or not at all, one future for the whole call."""
        return_exceptions = _checks.flag("return_exceptions", return_exceptions)
        batch = list(items)
        intake, priority, deadline = self._admit(len(batch), timeout, priority)
        self._not_streaming(intake)
        if not batch:
            return []
        return await intake.submit_many(batch, deadline, priority, return_exceptions=return_exceptions)

    async def submit_stream(self, item: Any, *, timeout: float | None, priority: float) -> AsyncIterator[Any]:
        """The body of :meth:`AsyncBatcher.stream`: queue the item, then hand out its parts as they come."""
        intake, priority, deadline = self._admit(1, timeout, priority)
        if not intake.streams:  # one result per item: a stream of one part
            yield await self.submit(item, timeout=timeout, priority=priority)
            return
        parts = intake.stream(item, deadline, priority)
        try:
            async for part in parts:
                yield part
        finally:
            await parts.aclose()  # (at once: a consumer that lets go leaves its batch at the next step)
