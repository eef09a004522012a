"""What was queued at a moment, and how much of it still is: the testing kit's ``flush()`` sends what waited when it
was called, and no later item (private; below the :class:`~async_batcher._core.queue.Queue` it reads).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from async_batcher._core.lane import Column, Lane
from async_batcher._core.sinks import Bulk

__all__: list[str] = []


def waiting_now(lanes: Iterable[Lane]) -> list[Any]:
    """The entries queued now in ``lanes`` (a plain ``process_many`` call's one entry; a column's, with the index it
    reaches now): what a flush sends (:func:`still_queued`)."""
    return [
        (entry, entry.base + len(entry.items)) if entry.__class__ is Column else entry
        for lane in lanes
        for entry in lane.entries()
        if entry.lane is not None
    ]


def still_queued(entries: list[Any]) -> dict[Lane, int]:
    """Of ``entries`` (:func:`waiting_now`), the items still queued whose callers wait, by lane."""
    found: dict[Lane, int] = {}
    for entry in entries:
        if entry.__class__ is tuple:  # a column's items up to an index then
            col, end = entry
            lane = col.lane
            if lane is not None:
                gone = col.gone or ()
                n = sum(
                    1
                    for i, sink in enumerate(col.sinks[col.start : end - col.base], col.base + col.start)
                    if i not in gone and not sink.done()
                )
                if n:
                    found[lane] = found.get(lane, 0) + n
            continue
        lane = entry.lane
        if lane is None:
            continue
        if entry.__class__ is Bulk:
            n = 0 if entry.future.done() else len(entry.items) - entry.pos
        else:
            n = 0 if entry.sink.done() else 1
        if n > 0:
            found[lane] = found.get(lane, 0) + n
    return found
