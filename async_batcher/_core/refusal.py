"""``refuse_late`` for one batcher (private; the admission layer's): what is measured of its batches to predict when
an item arriving now would be answered (:class:`~async_batcher._core.late.Lateness`, from the first time the setting
is on), and the refusal, at admission, of an item predicted to be answered after its deadline
(:class:`~async_batcher.LateRefusalError`, with when to try again).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from async_batcher import _checks
from async_batcher._core.late import Lateness
from async_batcher._core.settings import find
from async_batcher._core.waits import LatencyBudget
from async_batcher.exceptions import LateRefusalError
from async_batcher.stats import FAILED

if TYPE_CHECKING:
    from async_batcher._core.dispatcher import Dispatcher
    from async_batcher._core.settings import Settings
    from async_batcher.stats import _Recorder

__all__ = ["LateRefusal"]


class LateRefusal:
    """The refusal of the late for one batcher, under its settings as they are now."""

    __slots__ = ("lateness", "name", "recorder", "settings")

    def __init__(self, name: str, settings: Settings, recorder: _Recorder) -> None:
        self.name = name
        self.settings = settings
        self.recorder = recorder
        self.lateness: Lateness | None = None  # what is measured, from the first time refuse_late is on
        self.measure_lateness()

    def measure_lateness(self) -> Lateness | None:
        """With ``refuse_late`` on: what is measured of the batches to predict an item's answer, from now on, under
        the setting's constants as they are now."""
        rule = self.settings.late
        if rule is not None:
            if self.lateness is None:
                self.lateness = Lateness(rule)
                self.recorder.add_observer(self.lateness.observe)
            else:
                self.lateness.use(rule)
        return self.lateness

    def latency(self) -> float:
        """The latency budget each item has from its arrival (``max_latency``; ``inf``: none)."""
        policy = find(self.settings.policy, LatencyBudget)
        return math.inf if policy is None else float(policy.max_latency)

    def refuse_without_deadline(self) -> None:
        """A call with no ``timeout=`` on a batcher with no ``default_timeout``: with no ``max_latency`` either, its
        items have no deadline, and ``refuse_late`` could never judge them: a ``ValueError`` rather than a setting
        that silently does nothing."""
        if self.latency() == math.inf:
            raise ValueError(
                f"{self.name}: refuse_late=True, but this call has no deadline to be judged by: pass timeout=, or set "
                "default_timeout= or max_latency= on the batcher (a generous timeout for the calls that may wait)"
            )

    def refuse_if_late(
        self, dispatcher: Dispatcher, n: int, deadline: float | None, *, waited: bool = False
    ) -> float | None:
        """With ``refuse_late``: refuse ``n`` items (a call's) predicted to be answered after their deadline, or to
        make the items ahead of them in their batch late (:class:`LateRefusalError`, with when to try again); else
        return their deadline (``inf``: none), to note once they are admitted. ``waited``: they waited in line for
        room, and count as submitted (then failed), not as rejected."""
        if not self.settings.refuse_late:
            return None
        lateness = self.measure_lateness()
        assert lateness is not None
        now = dispatcher.loop.time()
        latency = self.latency()
        due = min(math.inf if deadline is None else deadline, now + latency)
        prediction = None if due == math.inf else lateness.predict(dispatcher, now, n, latency)
        if prediction is None or prediction.late_by(now, due) <= 0:
            return due
        if waited:
            self.recorder.left(n)
            self.recorder.resolved(n, FAILED)
        else:
            self.recorder.rejected(n, "late")
        late = prediction.late_by(now, due)
        held = due > prediction.tail
        whose = "the deadline of the items ahead of it in its batch" if held else "its deadline"
        budget = min(due, prediction.tail) - now
        retry = prediction.retry(due - now, held=held)
        raise LateRefusalError(
            f"{self.name}: refused: predicted to be answered in {prediction.seconds * 1e3:.1f} ms (margin "
            f"{prediction.margin * 1e3:.1f} ms; {_checks.plural(dispatcher.queue.waiting, 'item')} queued ahead), "
            f"{late * 1e3:.1f} ms past {whose}; retry after {retry:.3f} s",
            predicted=prediction.seconds,
            margin=prediction.margin,
            budget=budget,
            retry_after=retry,
        )

    def admitted(self, dispatcher: Dispatcher, n: int, due: float) -> None:
        """``n`` items due by ``due`` were admitted now: the tail they join is held to their deadline."""
        if self.lateness is not None:
            self.lateness.admitted(dispatcher, n, due)
