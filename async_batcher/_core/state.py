"""Where a run is in its life (:class:`State`) (private)."""

from __future__ import annotations

import enum

__all__: list[str] = []


class State(enum.Enum):
    """Where a run is in its life. A batcher's state is its current run's."""

    NEW = "new"  # not bound to a loop: the first process() or start() in a loop starts it
    RUNNING = "running"
    STOPPING = "stopping"  # refuses new items; drains what it holds (or a forced stop fails it), then on_stop()
    STOPPED = "stopped"  # on_stop() has run: start() or the first process() starts a new run


#: The states in which a run dispatches batches.
DISPATCHING = (State.RUNNING, State.STOPPING)
