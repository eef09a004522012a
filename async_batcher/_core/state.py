"""Where a run is in its life (:class:`State`), and "no limit" as a count (:data:`UNLIMITED`) (private; the bottom of
the core)."""

from __future__ import annotations

import enum
import sys
from typing import Final

__all__: list[str] = []

#: "No limit" as a count (items, batches, slots), the one spelling inside the package: a number the hot path
#: compares without a branch. (As a weight or a time, "no limit" is ``math.inf``.) Public as
#: ``async_batcher.policies.UNLIMITED``; the settings say ``None``, converted where they are read
#: (:class:`~async_batcher._core.settings.Settings`).
UNLIMITED: Final = sys.maxsize


class State(enum.Enum):
    """Where a run is in its life. A batcher's state is its current run's."""

    NEW = "new"  # not bound to a loop: the first process() or start() in a loop starts it
    RUNNING = "running"
    STOPPING = "stopping"  # refuses new items; drains what it holds (or a forced stop fails it), then on_stop()
    STOPPED = "stopped"  # on_stop() has run: start() or the first process() starts a new run


#: The states in which a run dispatches batches.
DISPATCHING = (State.RUNNING, State.STOPPING)
