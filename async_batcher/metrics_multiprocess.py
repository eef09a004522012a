"""Prometheus metrics of batchers across the worker processes of one server (extra ``[metrics]``).

uvicorn ``--workers N`` (or gunicorn) runs N processes, each with its own batcher; a scrape of ``/metrics``
reaches one of them. prometheus_client's multiprocess mode makes every process write its metrics to files in
one directory, ``PROMETHEUS_MULTIPROC_DIR``, and the process that answers the scrape reads them all:

.. code-block:: python

    from async_batcher.metrics_multiprocess import MultiprocessExporter, make_metrics_app

    app.mount("/metrics", make_metrics_app())      # every worker's metrics, added up

    async with MultiprocessExporter(batcher):      # in each worker's lifespan, around the batcher's life
        yield

What goes where:

- **Before the workers start** (the command that launches the server, the container's entrypoint), set
  ``PROMETHEUS_MULTIPROC_DIR`` to a directory of this server alone and empty it
  (:func:`prepare_directory`): files of an earlier run would be added to this one's. The variable must be set
  before ``prometheus_client`` is imported, which is why it is the launcher's job.
- **In each worker**, :class:`MultiprocessExporter` writes the batcher's metrics under the same names as the
  single-process :func:`~async_batcher.metrics.register_batcher`: the counters
  ``async_batcher_batches_total``, ``async_batcher_items_total{outcome}`` and
  ``async_batcher_rejected_items_total{reason}``, copied from ``batcher.stats``
  every ``interval`` seconds and once more at the end; the gauges ``async_batcher_queued_items`` and
  ``async_batcher_in_flight_batches`` with ``multiprocess_mode="livesum"`` (the sum over the workers alive);
  and the histograms of :class:`~async_batcher.metrics.BatcherHistograms`, observed as each batch ends. The
  summaries are left out: quantiles of different processes cannot be added up; the histograms can.
- **The scrape**: :func:`make_metrics_app` answers with a ``MultiProcessCollector`` over the directory:
  counters and histogram buckets summed over every process that ever wrote (a worker that died still
  counts: its batches happened), live gauges over the workers alive only.
- **A shared batcher** (:class:`~async_batcher.shared.SharedBatcher`, one batcher for every worker): pass it to
  the exporter in every worker; the worker that owns it writes it, the others nothing, so the scrape shows one
  batcher with every worker's items, whichever worker answers it; after a hand-over the next owner's counts add on.
- **Dead workers**: a worker that stops cleanly removes its live gauges (``mark_process_dead``) when the
  exporter exits; one that was killed cannot, so every scrape first removes the live gauges of processes that
  no longer exist (:func:`mark_dead_workers`; a recycled process id can hide a dead worker until that
  process ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import math
import os
import re
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, make_asgi_app
    from prometheus_client import multiprocess as _multiprocess
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "async_batcher.metrics_multiprocess needs prometheus-client: pip install 'async-batcher[metrics]'"
    ) from exc

from async_batcher.batcher import AsyncBatcher
from async_batcher.metrics import (
    ACTIONS,
    ACTIONS_HELP,
    CEILING_HELP,
    HELD_HELP,
    OUTCOMES,
    PROBES_HELP,
    REJECTED_HELP,
    BatcherHistograms,
    key_label,
)
from async_batcher.shared import SharedBatcher
from async_batcher.shared._follow import Follower, Source, source_of

__all__ = [
    "ENV",
    "MultiprocessExporter",
    "make_metrics_app",
    "mark_dead_workers",
    "multiprocess_dir",
    "prepare_directory",
]

logger = logging.getLogger("async_batcher.metrics_multiprocess")

#: The variable prometheus_client reads, once, when it is imported.
ENV = "PROMETHEUS_MULTIPROC_DIR"

_LIVE_GAUGE = re.compile(r"gauge_live[a-z]+_(\d+)\.db\Z")

# prometheus_client.multiprocess is untyped: its two functions used here, typed.
_mark_process_dead: Callable[[int, str], None] = _multiprocess.mark_process_dead
_merge: Callable[..., Iterable[Metric]] = _multiprocess.MultiProcessCollector.merge


def multiprocess_dir() -> str | None:
    """The directory of multiprocess mode, or ``None`` when it is off."""
    return os.environ.get(ENV) or None


def prepare_directory(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` if needed and delete the metric files of an earlier run; call it before the workers start."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
    return directory


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:  # a zombie (dead, not yet reaped by its parent) answers the signal too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc here, or it just went away
        return os.path.exists(f"/proc/{pid}") or not os.path.isdir("/proc")


def mark_dead_workers(path: str | os.PathLike[str] | None = None) -> list[int]:
    """Remove the live gauges of the processes that no longer exist; return their ids.

    ``path``: the multiprocess directory (``PROMETHEUS_MULTIPROC_DIR`` if ``None``).
    """
    directory = os.fspath(path) if path is not None else multiprocess_dir()
    if directory is None:
        raise ValueError(f"no multiprocess directory: set {ENV} or pass path")
    dead = set()
    for name in os.listdir(directory):
        match = _LIVE_GAUGE.match(name)
        if match and not _pid_alive(pid := int(match.group(1))):
            dead.add(pid)
    for pid in sorted(dead):
        _mark_process_dead(pid, directory)
        logger.info("removed the live gauges of dead worker %d", pid)
    return sorted(dead)


class _LiveCollector(Collector):
    """prometheus_client's ``MultiProcessCollector``, forgetting the live gauges of dead workers first."""

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self) -> Iterable[Metric]:
        mark_dead_workers(self._path)
        return _merge(glob.glob(os.path.join(self._path, "*.db")), accumulate=True)


def make_metrics_app(path: str | os.PathLike[str] | None = None) -> Callable[..., Any]:
    """An ASGI app (mount it at ``/metrics``) answering with every worker's metrics, added up.

    ``path``: the multiprocess directory (``PROMETHEUS_MULTIPROC_DIR`` if ``None``); it must exist.
    """
    directory = os.fspath(path) if path is not None else multiprocess_dir()
    if directory is None or not os.path.isdir(directory):
        raise ValueError(f"{ENV} is not set to an existing directory (got {directory!r})")
    registry = CollectorRegistry()  # this registry only: each process's own registries would count it twice
    registry.register(_LiveCollector(directory))
    return make_asgi_app(registry)


class _Metrics:
    """The counters and gauges every exporter of a process writes to (prometheus_client's objects, once each)."""

    def __init__(self, namespace: str) -> None:
        self.batches = Counter(
            f"{namespace}_batches",
            "Batches sent to process_batch, by why each went (reason).",
            ["batcher", "reason"],
            registry=None,
        )
        self.items = Counter(
            f"{namespace}_items",
            "Items by outcome (submitted is every accepted item).",
            ["batcher", "outcome"],
            registry=None,
        )
        self.queued = Gauge(
            f"{namespace}_queued_items",
            "Items waiting in the queue.",
            ["batcher"],
            registry=None,
            multiprocess_mode="livesum",
        )
        self.in_flight = Gauge(
            f"{namespace}_in_flight_batches",
            "Batches being processed.",
            ["batcher"],
            registry=None,
            multiprocess_mode="livesum",
        )
        self.rejected = Counter(f"{namespace}_rejected_items", REJECTED_HELP, ["batcher", "reason"], registry=None)
        self.held = Counter(f"{namespace}_held_batches", HELD_HELP, ["batcher"], registry=None)
        self.probes = Counter(f"{namespace}_hold_probes", PROBES_HELP, ["batcher"], registry=None)
        self.actions = Counter(f"{namespace}_failure_handling", ACTIONS_HELP, ["batcher", "action"], registry=None)
        self.ceiling = Gauge(
            f"{namespace}_batch_ceiling", CEILING_HELP, ["batcher", "key"], registry=None, multiprocess_mode="livemin"
        )
        self.histograms = BatcherHistograms(None, namespace=namespace)


_metrics: dict[str, _Metrics] = {}


def _metrics_for(namespace: str) -> _Metrics:
    if namespace not in _metrics:
        _metrics[namespace] = _Metrics(namespace)
    return _metrics[namespace]


class _Slot:
    """One batcher an exporter writes, and what of it it has written: the counts copied, the keys whose ceiling is
    exported. A shared batcher's slot holds its batcher while this process owns it (its follower's), else none."""

    __slots__ = ("batcher", "ceilings", "copied", "follower", "source")

    def __init__(self, source: Source) -> None:
        self.source = source
        self.batcher = source if isinstance(source, AsyncBatcher) else None
        self.follower: Follower | None = None
        self.copied: dict[str, int] = {}  # the counts already copied: the counters grow by the difference
        self.ceilings: set[str] = set()


class MultiprocessExporter:
    """Write the metrics of ``batchers`` to the multiprocess directory while it is entered (``async with``).

    Enter it in each worker once its batchers exist (the app's lifespan) and leave it after they stopped:
    leaving copies the final counts and removes this worker's live gauges. ``interval``: seconds between two
    copies of the counters and gauges (histograms are written as each batch ends). ``histograms``: your own
    :class:`~async_batcher.metrics.BatcherHistograms` (made with ``registry=None``, your buckets) instead of the
    default one. Needs ``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` was imported.

    A :class:`~async_batcher.shared.SharedBatcher` (or a ``@batch(shared=...)`` function) is written by the worker
    that owns it, from the moment it does (before its first batch) until it stops (its final counts, then its live
    gauges back to zero); its clients write nothing for it. Pass it in every worker: the scrape, whichever worker
    answers it, shows the one batcher once, with every worker's items, and across a hand-over its counts go on.
    """

    def __init__(
        self,
        *batchers: object,
        interval: float = 1.0,
        histograms: BatcherHistograms | None = None,
        namespace: str = "async_batcher",
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self._slots = [_Slot(source_of(b, "MultiprocessExporter()")) for b in batchers]
        names = [slot.source.name for slot in self._slots]
        if len(set(names)) != len(names):
            raise ValueError(f"the batchers' names must differ, got {names}: give each batcher its own name=")
        self.interval = interval
        self._metrics = _metrics_for(namespace)
        self._histograms = histograms or self._metrics.histograms
        self._task: asyncio.Task[None] | None = None

    @property
    def batchers(self) -> list[AsyncBatcher[Any, Any]]:
        """The batchers this worker writes now (a shared batcher's while this worker owns it)."""
        return [slot.batcher for slot in self._slots if slot.batcher is not None]

    async def __aenter__(self) -> MultiprocessExporter:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """What entering does: observe the batches, copy the counts, and keep copying them on the running loop."""
        if self._task is not None:
            raise RuntimeError("this exporter is running already")
        directory = multiprocess_dir()
        if directory is None or not os.path.isdir(directory):
            raise RuntimeError(f"multiprocess metrics need {ENV} set to an existing directory, got {directory!r}")
        from prometheus_client import values

        if not getattr(values.ValueClass, "_multiprocess", False):
            raise RuntimeError(f"prometheus_client was imported before {ENV} was set: its metrics stay in memory")
        mark_dead_workers(directory)
        for slot in self._slots:
            if isinstance(slot.source, SharedBatcher):
                slot.follower = Follower(partial(self._adopt, slot), partial(self._drop, slot))
                slot.follower.follow(slot.source)
            elif slot.batcher is not None:
                self._histograms.observe(slot.batcher)
        self.sync()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="async-batcher-metrics-sync")

    async def stop(self) -> None:
        """What leaving does: stop copying, copy the final counts, remove this worker's live gauges."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for slot in self._slots:
            if slot.follower is not None:
                slot.follower.stop()
                slot.follower = None
        self.sync()
        for batcher in self.batchers:
            self._histograms.unobserve(batcher, drop_series=False)  # the files keep their counts anyway
        directory = multiprocess_dir()
        if directory is not None:
            _mark_process_dead(os.getpid(), directory)  # this worker's live gauges; its counts stay

    def _adopt(self, slot: _Slot, batcher: AsyncBatcher[Any, Any]) -> None:
        """This worker owns the shared batcher now: write its batcher, whose counts start from zero."""
        slot.batcher, slot.copied, slot.ceilings = batcher, {}, set()
        self._histograms.observe(batcher)
        self._copy(slot, batcher)

    def _drop(self, slot: _Slot, batcher: AsyncBatcher[Any, Any]) -> None:
        """This worker no longer owns the shared batcher: its final counts, then its live gauges back to nothing."""
        self._copy(slot, batcher)
        self._histograms.unobserve(batcher, drop_series=False)
        m, name = self._metrics, batcher.name
        for label in slot.ceilings:
            m.ceiling.labels(name, label).set(math.inf)
        m.queued.labels(name).set(0)
        m.in_flight.labels(name).set(0)
        slot.batcher, slot.copied, slot.ceilings = None, {}, set()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.sync()
            except Exception:
                logger.exception("copying the batchers' metrics failed; trying again in %s s", self.interval)

    def sync(self) -> None:
        """Copy the batchers' counters and gauges to the files now (also done every ``interval`` seconds)."""
        for slot in self._slots:
            if slot.batcher is not None:
                self._copy(slot, slot.batcher)

    def _copy(self, slot: _Slot, batcher: AsyncBatcher[Any, Any]) -> None:
        m, copied = self._metrics, slot.copied
        stats = batcher.stats
        name = stats.name
        for counter, count, key in ((m.held, stats.held, "held"), (m.probes, stats.probes, "probes")):
            counter.labels(name).inc(count - copied.get(key, 0))
            copied[key] = count
        for reason, count in stats.reasons.items():
            key = f"reason:{reason}"
            m.batches.labels(name, reason).inc(count - copied.get(key, 0))
            copied[key] = count
        for reason, count in stats.rejected_reasons.items():
            key = f"rejected:{reason}"
            m.rejected.labels(name, reason).inc(count - copied.get(key, 0))
            copied[key] = count
        for outcome in OUTCOMES:
            now = getattr(stats, outcome)
            m.items.labels(name, outcome).inc(now - copied.get(outcome, 0))
            copied[outcome] = now
        for action, field in ACTIONS:
            key = f"action:{action}"
            now = getattr(stats, field)
            m.actions.labels(name, action).inc(now - copied.get(key, 0))
            copied[key] = now
        ceilings = {key_label(key): value for key, value in stats.ceilings.items()}
        for label in slot.ceilings - ceilings.keys():  # lifted since (the files keep a series: no limit)
            m.ceiling.labels(name, label).set(math.inf)
        for label, value in ceilings.items():
            m.ceiling.labels(name, label).set(value)
        slot.ceilings = set(ceilings)
        m.queued.labels(name).set(stats.queued)
        m.in_flight.labels(name).set(stats.in_flight)
