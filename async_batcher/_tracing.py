"""The spans of :mod:`async_batcher.opentelemetry` (private): a batch's span, linked to its callers' spans, the
events it adds to them, and how it ends (a streaming batch's over its steps); the event names callers' spans get.
Imported by :mod:`async_batcher.opentelemetry` once it has checked that the OpenTelemetry API is installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Set, Sized
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace

from async_batcher._checks import plural
from async_batcher._core.ceiling import ceiling_of
from async_batcher._core.current import CurrentBatch
from async_batcher._core.dedup import Shared
from async_batcher._core.failures import Retry

if TYPE_CHECKING:
    from async_batcher._core.batch import Batch
    from async_batcher._core.streaming import StreamSink
    from async_batcher.opentelemetry import _Instrumentation

__all__ = ["EVENT_ANSWERED", "EVENT_CANCELLED", "EVENT_QUEUED", "EVENT_SENT"]

#: The event on a caller's span when the call submits its items.
EVENT_QUEUED: Final = "async_batcher.queued"
#: The event on a caller's span when a batch with its items starts: the batch's trace and span ids, and how many of
#: its items the batch holds.
EVENT_SENT: Final = "async_batcher.sent"
#: The event on a caller's span when the call returns or raises: ``async_batcher.outcome`` (``ok`` or ``error``,
#: with ``exception.type``).
EVENT_ANSWERED: Final = "async_batcher.answered"
#: The event on a caller's span when the caller was cancelled, or left its stream.
EVENT_CANCELLED: Final = "async_batcher.cancelled"

_BATCHER: Final = "async_batcher.batcher"
_OUTCOME: Final = "async_batcher.outcome"
# The parent of every batch span: none (a batch is the root of a trace of its own, linked to its callers).
_ROOT: Final = otel_context.Context()


def _key_attribute(key: object) -> str | int | float | bool:
    """The batch key as a span attribute: itself if the SDK takes it, else its ``repr``, else (a ``repr`` that
    raises) its type's name: an attribute never fails a batch."""
    if isinstance(key, str | int | float | bool):
        return key
    try:
        return repr(key)
    except Exception:
        return type(key).__name__


def _failure_attributes(batch: Batch) -> dict[str, Any]:
    """What the failure handling adds to a batch's span: the part of a failed batch this call is on
    (``async_batcher.batch.part``: ``bisect``, ``split``, or ``retry`` for the whole batch again), and the ceiling
    out-of-memory splits set on its key (``async_batcher.batch.ceiling``)."""
    attributes: dict[str, Any] = {}
    tree = batch.tree
    if tree is not None:
        part = tree.part
        attributes["async_batcher.batch.part"] = "retry" if part.whole else "bisect" if part.isolating else "split"
    lane = batch.lane
    if lane.capacity is not None:
        at = ceiling_of(lane, weighted=batch.weights is not None)
        if at is not None:
            attributes["async_batcher.batch.ceiling"] = at
    return attributes


class _BatchSpan:
    """One batch's span: its links to its callers' spans, the events it adds to them, and how it ended."""

    __slots__ = ("batch", "current", "name", "span")

    def __init__(self, state: _Instrumentation, tracer: trace.Tracer, batch: Batch) -> None:
        self.name = state.batcher.name
        self.batch = batch  # the core's (abandoned: a forced stop cut it off and answered its callers)
        self.current = CurrentBatch(batch)
        contexts = self.current.contexts
        # The callers that share a row of the batch with its first (dedup_key): each links, as its own.
        joined = [context for sink in batch.sinks if sink.__class__ is Shared for context in sink.contexts[1:]]
        callers = _caller_spans([*contexts, *joined])
        attributes: dict[str, Any] = {
            _BATCHER: self.name,
            "async_batcher.batch.size": len(contexts),
            "async_batcher.batch.queue_wait": self.current.waited,
        }
        key = self.current.key
        if key is not None:
            attributes["async_batcher.batch.key"] = _key_attribute(key)
        attributes.update(_failure_attributes(batch))
        self.span = tracer.start_span(
            f"{self.name} batch",
            context=_ROOT,
            attributes=attributes,
            links=[trace.Link(span.get_span_context()) for span in callers if span.get_span_context().is_valid],
        )
        self._sent(callers)

    def _sent(self, callers: dict[trace.Span, int]) -> None:
        """Tell each caller's span that its items went out in this batch."""
        if not self.span.is_recording():
            return
        ids = self.span.get_span_context()
        sent = {
            _BATCHER: self.name,
            "async_batcher.batch.trace_id": trace.format_trace_id(ids.trace_id),
            "async_batcher.batch.span_id": trace.format_span_id(ids.span_id),
        }
        for span, items in callers.items():
            if span.is_recording():
                span.add_event(EVENT_SENT, {**sent, "async_batcher.items": items})

    def returned(self, results: Any) -> None:
        """``process_batch`` returned ``results``. Results that do not fit the batch are an error, as the batcher will
        tell its callers (a generator is not read here: the batcher reads it); a batch a forced stop cut off while
        it ran in its thread is cancelled, as the coroutine path reports it."""
        if self.batch.abandoned:
            self._cancelled()
            return
        size = self.current.size
        failed = 0
        if isinstance(results, str | bytes | bytearray | Mapping | Set):
            self._error(f"process_batch returned {type(results).__name__}")
            return
        if isinstance(results, Sized) and len(results) != size:
            self._error(
                f"process_batch returned {plural(len(results), 'result')} for a batch of {plural(size, 'item')}"
            )
            return
        if isinstance(results, list | tuple):
            kinds = set(map(type, results))
            if any(issubclass(kind, Exception) for kind in kinds):
                failed = sum(1 for result in results if isinstance(result, Exception))
            if Retry in kinds and self.span.is_recording():
                retried = sum(1 for result in results if result.__class__ is Retry)
                self.span.set_attribute("async_batcher.batch.retry", retried)
        self._done(failed)

    def raised(self, error: BaseException) -> None:
        """``process_batch`` raised ``error`` (a ``CancelledError``, or anything once a forced stop cut the batch off:
        cancelled)."""
        if self.batch.abandoned or isinstance(error, asyncio.CancelledError | GeneratorExit):
            self._cancelled()
            return
        self._raised(error)

    def _done(self, failed: int) -> None:
        if failed:
            self.span.set_attribute("async_batcher.batch.failed", failed)
        self._end("partial" if failed else "ok")

    def _raised(self, error: BaseException) -> None:
        self.span.record_exception(error)
        self._error(type(error).__name__)

    def _cancelled(self) -> None:
        self.span.set_status(trace.StatusCode.ERROR, "cancelled")
        self._end("cancelled")

    def _error(self, description: str) -> None:
        self.span.set_status(trace.StatusCode.ERROR, description)
        self._end("error")

    def departed(self) -> int:
        """The items whose callers had left by the batch's end."""
        return len(self.current.departed)

    def _end(self, outcome: str) -> None:
        span = self.span
        if span.is_recording():
            span.set_attribute("async_batcher.batch.outcome", outcome)
            span.set_attribute("async_batcher.batch.departed", self.departed())
        span.end()


class _StreamSpan(_BatchSpan):
    """A streaming batch's span. Its items join it and leave it as it runs (the batcher compacts its list between
    two steps), so each stream is accounted for as it ends: one whose consumer left (cancelled, timed out, or
    dropped as stalled) departed; one that got an ``Exception`` its generator yielded failed. And its end is the
    batcher's to tell: the generator is closed between two steps when every stream has ended, when a step does not
    fit the batch (the batcher's error, which its streams got), or when a stop cuts the batch off."""

    __slots__ = ("failed", "gone", "joined", "open", "seen", "yielded")

    def __init__(self, state: _Instrumentation, tracer: trace.Tracer, batch: Batch) -> None:
        super().__init__(state, tracer, batch)
        self.seen = {id(context): context for context in batch.contexts}
        self.open: dict[int, StreamSink] = {}  # the streams not accounted for yet
        self.yielded: set[int] = set()  # the exceptions of the step handed out last (a list or a tuple)
        self.joined = self.failed = self.gone = 0

    def handing_out(self, parts: Any) -> None:
        """The generator yielded ``parts`` for the batch as it is now."""
        for sink in self.batch.sinks:
            self.open.setdefault(id(sink), sink)
        self.yielded = (
            {id(part) for part in parts if isinstance(part, Exception)} if type(parts) in (list, tuple) else set()
        )

    def step(self) -> None:
        """The batcher asks for the next step: the last one was handed out. Account for the streams that ended, and
        link the callers whose items joined the batch (continuous batching)."""
        unknown = self._settle()  # (an element of a step that was not a list: its item failed)
        self.failed += len(unknown)
        contexts = self.batch.contexts
        new = [context for context in contexts if id(context) not in self.seen]
        self.seen = {id(context): context for context in contexts}  # (holds them: no id is reused meanwhile)
        if not new:
            return
        self.joined += len(new)
        callers = _caller_spans(new)
        for span in callers:
            if span.get_span_context().is_valid:
                self.span.add_link(span.get_span_context())
        self._sent(callers)

    def _settle(self) -> list[BaseException]:
        """Account for the streams that ended since the last look; return the errors that are neither a consumer's
        leaving nor an element of the last step (another step's element, or the batcher's error)."""
        unknown: list[BaseException] = []
        for key, sink in list(self.open.items()):
            if not sink.done():
                continue
            del self.open[key]
            error = None if sink.cancelled() else sink.exception()
            if sink.cancelled() or (isinstance(error, TimeoutError) and id(error) not in self.yielded):
                self.gone += 1
            elif error is not None and id(error) in self.yielded:
                self.failed += 1
            elif error is not None:
                unknown.append(error)
        return unknown

    def returned(self, results: Any) -> None:
        """The generator returned: the batcher ends the streams still open."""
        unknown = self._settle()
        self.failed += len(unknown)
        self._done(self.failed)

    def closed(self) -> None:
        """The batcher closed the generator between two steps."""
        unknown = self._settle()
        task = asyncio.current_task()
        if self.batch.abandoned or (task is not None and task.cancelling()):  # a forced stop, or the loop closing
            self._cancelled()
        elif not self.batch.sinks:  # every stream had ended, or its consumer left
            self.failed += len(unknown)
            self._done(self.failed)
        elif unknown:  # the batcher failed the batch (a step that did not fit it): its streams got the error
            self._raised(unknown[0])
        else:  # closed with streams still open, or none left to tell the batcher's error
            self._cancelled()

    def departed(self) -> int:
        return self.gone

    def _end(self, outcome: str) -> None:
        if self.joined and self.span.is_recording():
            self.span.set_attribute("async_batcher.batch.joined", self.joined)
        super()._end(outcome)


def _caller_spans(contexts: Iterable[Any]) -> dict[trace.Span, int]:
    """The distinct spans current in ``contexts`` (the callers' contexts), each with how many of the items it
    submitted; the callers without a span are left out."""
    spans: dict[trace.Span, int] = {}
    by_context: dict[int, trace.Span] = {}
    for context in contexts:
        span = by_context.get(id(context))
        if span is None:
            span = by_context[id(context)] = context.run(trace.get_current_span)
        if span is not trace.INVALID_SPAN:
            spans[span] = spans.get(span, 0) + 1
    return spans


def _event(span: trace.Span, name: str, attributes: dict[str, Any]) -> None:
    if span.is_recording():  # (a caller's span may have ended before its call did)
        span.add_event(name, attributes)


def _type_name(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
