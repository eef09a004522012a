"""Prometheus metrics of batchers, read from ``batcher.stats`` at scrape time (extra ``[metrics]``).

.. code-block:: python

    from async_batcher.metrics import register_batcher

    register_batcher(batcher)          # into prometheus_client's default REGISTRY

Nothing is recorded on the hot path: every scrape takes one :class:`~async_batcher.BatcherStats` snapshot per
batcher and turns it into metric families, all labelled ``batcher="<name>"``:

- ``async_batcher_batches_total{reason}``: batches sent to ``process_batch``, by why each went;
- ``async_batcher_items_total{outcome=...}``: items ``submitted``, ``processed``, ``failed``, ``cancelled``,
  ``timed_out``, ``rejected``;
- ``async_batcher_rejected_items_total{reason=...}``: the rejected items by why (``stats.rejected_reasons``:
  ``queue_full``, ``queue_weight``, ``oversized``, ``late``, ``stopped``, ``reentrant``);
- ``async_batcher_batch_size_mean``: items per batch, over the batcher's life;
- ``async_batcher_queue_wait_seconds`` and ``async_batcher_process_time_seconds``: summaries with the 0.5, 0.95
  and 0.99 quantiles over the recent batches (``NaN`` before the first) and ``_count``, the batches so far (no
  ``_sum``: the statistics keep no running total of the times);
- ``async_batcher_queued_items`` and ``async_batcher_in_flight_batches``: gauges of the moment.

Batchers are held weakly: a batcher that is garbage-collected drops out of the metrics.

The summaries' quantiles describe one process and cannot be combined across processes or pods. For a fleet,
:func:`register_batcher` also adds histograms (:class:`BatcherHistograms`, buckets configurable), fed once per
batch as it ends, whose buckets add up across processes:

- ``async_batcher_batch_queue_wait_seconds``: per batch, how long its oldest item waited;
- ``async_batcher_batch_process_seconds``: how long ``process_batch`` took;
- ``async_batcher_batch_size``: items per batch.

A :class:`~async_batcher.shared.SharedBatcher` is exported by the process that owns it, under its batcher's name;
a client exports nothing for it. Several worker processes behind one ``/metrics`` (uvicorn ``--workers``,
gunicorn): see :mod:`async_batcher.metrics_multiprocess`.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector
    from prometheus_client.samples import Sample
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("async_batcher.metrics needs prometheus-client: pip install 'async-batcher[metrics]'") from exc

from async_batcher.batcher import AsyncBatcher
from async_batcher.shared import SharedBatcher
from async_batcher.shared._follow import Follower, Source, exported, source_of
from async_batcher.stats import BatcherStats, BatchObserver, LatencySummary

__all__ = [
    "DEFAULT_SIZE_BUCKETS",
    "DEFAULT_TIME_BUCKETS",
    "BatcherCollector",
    "BatcherHistograms",
    "register_batcher",
    "unregister_batcher",
]

logger = logging.getLogger("async_batcher.metrics")

OUTCOMES = ("submitted", "processed", "failed", "cancelled", "timed_out", "rejected")
QUANTILES = (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))
HELD_HELP = "Batches a hold (max_hold_time) kept back for the callers their lane's last batch answered."
PROBES_HELP = "Of the held batches, the probes: holds tried while the hold is off."
#: The failure handling's counts (async_batcher.failures), by action: the stats field of each.
ACTIONS = (("retried", "retried"), ("retry_refused", "retries_refused"), ("isolated", "isolated"),
           ("split", "splits"), ("extra_call", "extra_calls"))  # fmt: skip
ACTIONS_HELP = (
    "The failure handling: items tried again (retried) or refused by the retry budget (retry_refused), items found "
    "at fault alone (isolated), calls split on out-of-memory (split), calls on parts of failed batches (extra_call)."
)
CEILING_HELP = "The most items (weight, with item_weight) a batch key's batches take after out-of-memory splits."
REJECTED_HELP = "Items refused at once, never submitted, by why (reason)."

#: Seconds, for the queue wait and the processing time: 0.1 ms to 10 s.
DEFAULT_TIME_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Items per batch: powers of two up to 4096.
DEFAULT_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(13))


def _batcher_of(obj: object) -> AsyncBatcher[Any, Any]:
    """A batcher, or the batcher of a ``@batch`` function."""
    batcher = getattr(obj, "batcher", obj)
    if not isinstance(batcher, AsyncBatcher):
        raise TypeError(f"expected an AsyncBatcher or a @batch function, got {obj!r}")
    return batcher


class BatcherCollector(Collector):
    """A Prometheus collector of the statistics of any number of batchers, each labelled by its name.

    Register one per registry (``registry.register(BatcherCollector(b1, b2))``), or let
    :func:`register_batcher` do it. The names of the batchers it holds must differ.

    A :class:`~async_batcher.shared.SharedBatcher` is exported by the process that owns it (its batcher's statistics,
    under its batcher's name), and by no other: a client exports nothing for it, rather than an empty copy.
    """

    def __init__(self, *batchers: object, namespace: str = "async_batcher") -> None:
        self.namespace = namespace
        self._lock = threading.Lock()
        self._batchers: list[weakref.ref[Source]] = []
        for batcher in batchers:
            self.add(batcher)

    def add(self, batcher: object) -> None:
        """Export ``batcher`` (or a ``@batch`` function's, or a shared batcher's where it is owned) too; idempotent."""
        source = source_of(batcher, "BatcherCollector.add()")
        with self._lock:
            live = self._live()
            if any(b is source for b in live):
                return
            if any(b.name == source.name for b in live):
                raise ValueError(
                    f"another batcher named {source.name!r} is already exported: give each batcher its own name="
                )
            self._batchers = [weakref.ref(b) for b in live] + [weakref.ref(source)]

    def remove(self, batcher: object) -> None:
        """Stop exporting ``batcher``; a no-op if it is not exported."""
        source = source_of(batcher, "BatcherCollector.remove()")
        with self._lock:
            self._batchers = [weakref.ref(b) for b in self._live() if b is not source]

    @property
    def batchers(self) -> list[AsyncBatcher[Any, Any]]:
        """The batchers exported now (of a shared batcher, its batcher while this process owns it)."""
        with self._lock:
            live = self._live()
        batchers: list[AsyncBatcher[Any, Any]] = []
        for source in live:
            batcher = exported(source)
            if batcher is not None and all(batcher is not b for b in batchers):  # (also added as itself)
                batchers.append(batcher)
        return batchers

    def _live(self) -> list[Source]:
        return [b for b in (ref() for ref in self._batchers) if b is not None]

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples: lets a registry check the names once, at registration."""
        return self._families([])

    def collect(self) -> Iterable[Metric]:
        seen: set[str] = set()
        snapshots: list[BatcherStats] = []
        for batcher in self.batchers:
            stats = batcher.stats
            if stats.name in seen:  # renamed after it was added: one series per name, or the scrape is invalid
                logger.warning("two exported batchers are named %r: exporting the first only", stats.name)
                continue
            seen.add(stats.name)
            snapshots.append(stats)
        return self._families(snapshots)

    def _families(self, snapshots: list[BatcherStats]) -> Iterator[Metric]:
        ns = self.namespace
        batches = CounterMetricFamily(
            f"{ns}_batches", "Batches sent to process_batch, by why each went (reason).", labels=["batcher", "reason"]
        )
        items = CounterMetricFamily(
            f"{ns}_items", "Items by outcome (submitted is every accepted item).", labels=["batcher", "outcome"]
        )
        size = GaugeMetricFamily(f"{ns}_batch_size_mean", "Mean items per batch.", labels=["batcher"])
        wait = SummaryMetricFamily(
            f"{ns}_queue_wait_seconds",
            "Per batch, how long its oldest item waited before the batch went out (recent batches).",
            labels=["batcher"],
        )
        process = SummaryMetricFamily(
            f"{ns}_process_time_seconds", "How long process_batch took (recent batches).", labels=["batcher"]
        )
        queued = GaugeMetricFamily(f"{ns}_queued_items", "Items waiting in the queue.", labels=["batcher"])
        in_flight = GaugeMetricFamily(f"{ns}_in_flight_batches", "Batches being processed.", labels=["batcher"])
        held = CounterMetricFamily(f"{ns}_held_batches", HELD_HELP, labels=["batcher"])
        probes = CounterMetricFamily(f"{ns}_hold_probes", PROBES_HELP, labels=["batcher"])
        actions = CounterMetricFamily(f"{ns}_failure_handling", ACTIONS_HELP, labels=["batcher", "action"])
        ceiling = GaugeMetricFamily(f"{ns}_batch_ceiling", CEILING_HELP, labels=["batcher", "key"])
        rejected = CounterMetricFamily(f"{ns}_rejected_items", REJECTED_HELP, labels=["batcher", "reason"])
        for s in snapshots:
            for action, field in ACTIONS:
                actions.add_metric([s.name, action], getattr(s, field))
            for key, value in s.ceilings.items():
                ceiling.add_metric([s.name, key_label(key)], value)
            for reason, count in s.rejected_reasons.items():
                rejected.add_metric([s.name, reason], count)
            for reason, count in s.reasons.items():
                batches.add_metric([s.name, reason], count)
            for outcome in OUTCOMES:
                items.add_metric([s.name, outcome], getattr(s, outcome))
            size.add_metric([s.name], s.mean_batch_size)
            _add_summary(wait, s.name, s.queue_wait, s.batches)
            _add_summary(process, s.name, s.process_time, s.batches)
            queued.add_metric([s.name], s.queued)
            in_flight.add_metric([s.name], s.in_flight)
            held.add_metric([s.name], s.held)
            probes.add_metric([s.name], s.probes)
        yield from (batches, items, size, wait, process, queued, in_flight, held, probes, actions, ceiling, rejected)


def key_label(key: object) -> str:
    """A batch key as a label: ``""`` for a batcher without keys, else its ``str``."""
    return "" if key is None else str(key)


def _add_summary(family: SummaryMetricFamily, name: str, summary: LatencySummary, count: int) -> None:
    # SummaryMetricFamily.add_metric takes a count and a sum, no quantiles; the statistics have quantiles and a
    # count but no sum. So the samples are written directly, as the exposition format spells them.
    for quantile, attr in QUANTILES:
        family.samples.append(Sample(family.name, {"batcher": name, "quantile": quantile}, getattr(summary, attr)))
    family.samples.append(Sample(f"{family.name}_count", {"batcher": name}, count))


def _check_buckets(name: str, buckets: Sequence[float]) -> tuple[float, ...]:
    try:
        values = tuple(float(b) for b in buckets)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers, got {buckets!r}") from None
    if not values or any(math.isnan(b) for b in values) or any(a >= b for a, b in itertools.pairwise(values)):
        raise ValueError(f"{name} must be non-empty, increasing and without NaN, got {buckets!r}")
    return values


class BatcherHistograms:
    """Histograms of the batches of any number of batchers, each labelled ``batcher="<name>"``.

    Unlike the summaries of :class:`BatcherCollector`, histograms add up across processes and pods: a fleet's
    p95 is ``histogram_quantile(0.95, sum by (le) (rate(async_batcher_batch_queue_wait_seconds_bucket[5m])))``.
    Each batch is observed once, as it ends (a few microseconds per batch, nothing per item).

    Args:
        registry: where the three histograms are registered (prometheus_client's default ``REGISTRY`` unless
            given; ``None``: nowhere, as for multiprocess mode, where the files are the registry).
        namespace: the prefix of the metric names.
        wait_buckets, process_buckets: upper bounds in seconds of the queue wait and ``process_batch`` buckets.
        size_buckets: upper bounds of the batch size buckets, in items.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        namespace: str = "async_batcher",
        wait_buckets: Sequence[float] = DEFAULT_TIME_BUCKETS,
        process_buckets: Sequence[float] = DEFAULT_TIME_BUCKETS,
        size_buckets: Sequence[float] = DEFAULT_SIZE_BUCKETS,
    ) -> None:
        labels = ["batcher"]
        self.queue_wait = Histogram(
            f"{namespace}_batch_queue_wait_seconds",
            "Per batch, how long its oldest item waited before the batch went out.",
            labels,
            registry=registry,
            buckets=_check_buckets("wait_buckets", wait_buckets),
        )
        self.process_time = Histogram(
            f"{namespace}_batch_process_seconds",
            "How long process_batch took, per batch.",
            labels,
            registry=registry,
            buckets=_check_buckets("process_buckets", process_buckets),
        )
        self.batch_size = Histogram(
            f"{namespace}_batch_size",
            "Items per batch.",
            labels,
            registry=registry,
            buckets=_check_buckets("size_buckets", size_buckets),
        )
        self._lock = threading.Lock()
        self._observed: weakref.WeakKeyDictionary[AsyncBatcher[Any, Any], BatchObserver] = weakref.WeakKeyDictionary()
        self._following: weakref.WeakKeyDictionary[SharedBatcher[Any, Any], Follower] = weakref.WeakKeyDictionary()

    def observe(self, batcher: object) -> None:
        """Observe every batch of ``batcher`` (or a ``@batch`` function's) from now on; idempotent.

        The label is the batcher's name now; another live batcher of that name is refused. A
        :class:`~async_batcher.shared.SharedBatcher`'s batches are observed in the process that owns it, from the
        moment it does (before its first batch) until it stops owning it; a client observes none.
        """
        source = source_of(batcher, "BatcherHistograms.observe()")
        if isinstance(source, SharedBatcher):
            with self._lock:
                if source in self._following:
                    return
                # A process that stops owning it keeps the series of the batches it ran: they happened.
                follower = Follower(self.observe, lambda old: self.unobserve(old, drop_series=False))
                self._following[source] = follower
            follower.follow(source)
            return
        batcher = source
        with self._lock:
            if batcher in self._observed:
                return
            if any(b.name == batcher.name for b in self._observed):
                raise ValueError(
                    f"another batcher named {batcher.name!r} is already observed: give each batcher its own name="
                )
            wait = self.queue_wait.labels(batcher.name)
            process = self.process_time.labels(batcher.name)
            size = self.batch_size.labels(batcher.name)

            def observer(n: int, waited: float, elapsed: float) -> None:
                wait.observe(waited)
                process.observe(elapsed)
                size.observe(n)

            batcher._observe(observer)
            self._observed[batcher] = observer

    def unobserve(self, batcher: object, *, drop_series: bool = True) -> None:
        """Stop observing ``batcher``; a no-op if it is not observed.

        ``drop_series``: also remove its series from the scrape (multiprocess mode cannot: its files keep them).
        """
        source = source_of(batcher, "BatcherHistograms.unobserve()")
        if isinstance(source, SharedBatcher):
            with self._lock:
                follower = self._following.pop(source, None)
            if follower is not None and (last := follower.stop()) is not None:
                self.unobserve(last, drop_series=drop_series)
            return
        batcher = source
        with self._lock:
            observer = self._observed.pop(batcher, None)
            if observer is None:
                return
            batcher._observe(observer, stop=True)
            if drop_series:
                for histogram in (self.queue_wait, self.process_time, self.batch_size):
                    histogram.remove(batcher.name)

    @property
    def batchers(self) -> list[AsyncBatcher[Any, Any]]:
        """The batchers observed now."""
        with self._lock:
            return list(self._observed)


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, BatcherCollector] = weakref.WeakKeyDictionary()
_histograms_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, BatcherHistograms] = weakref.WeakKeyDictionary()
_registering = threading.Lock()


def register_batcher(
    batcher: object, registry: CollectorRegistry | None = None, *, histograms: BatcherHistograms | bool = True
) -> BatcherCollector:
    """Export ``batcher`` (an :class:`~async_batcher.AsyncBatcher` or a ``@batch`` function) to ``registry``.

    A :class:`~async_batcher.shared.SharedBatcher` (or a ``@batch(shared=...)`` function) can be registered in every
    process: its batcher is exported by the process that owns it, from owner to owner, and by no other.

    All the batchers of one registry share one :class:`BatcherCollector` (registered at the first call), which
    is returned. ``registry`` is prometheus_client's default ``REGISTRY`` if ``None``.

    ``histograms``: ``True`` also observes its batches in the registry's :class:`BatcherHistograms`, made with
    the default buckets at the first call unless you passed your own (your buckets, made on the same
    registry) first: the first one passed becomes the registry's. ``False``: no histograms.
    """
    registry = REGISTRY if registry is None else registry
    with _registering:
        collector = _by_registry.get(registry)
        if collector is None:
            collector = BatcherCollector()
            registry.register(collector)
            _by_registry[registry] = collector
        if histograms is True:
            histograms = _histograms_by_registry.get(registry) or BatcherHistograms(registry)
        if isinstance(histograms, BatcherHistograms):
            # The first becomes the registry's: a later call with True, and unregister_batcher, use it.
            _histograms_by_registry.setdefault(registry, histograms)
    collector.add(batcher)
    if isinstance(histograms, BatcherHistograms):
        try:
            histograms.observe(batcher)
        except BaseException:
            collector.remove(batcher)
            raise
    elif histograms is not False:
        raise TypeError(f"histograms must be a bool or a BatcherHistograms, got {histograms!r}")
    return collector


def unregister_batcher(batcher: object, registry: CollectorRegistry | None = None) -> None:
    """Stop exporting ``batcher`` to ``registry``: its summaries, and its series in the registry's
    :class:`BatcherHistograms` (any other: call its ``unobserve``); a no-op if it is not exported there."""
    registry = REGISTRY if registry is None else registry
    with _registering:
        collector = _by_registry.get(registry)
        histograms = _histograms_by_registry.get(registry)
    if collector is not None:
        collector.remove(batcher)
    if histograms is not None:
        histograms.unobserve(batcher)
