"""OpenTelemetry traces of a batcher: each batch a span linked to the spans of the callers it served.

::

    from async_batcher.opentelemetry import instrument

    instrument(scorer)  # spans from the global tracer provider, once the application sets one

A batch serves many requests at once, each in a trace of its own: its span cannot be a child of all of them, so it
is the root of a trace of its own, **linked** to each caller's span (the OpenTelemetry specification's way to
represent one operation done on behalf of many). Its name is ``"<batcher name> batch"``; its attributes:

- ``async_batcher.batcher``: the batcher's name;
- ``async_batcher.batch.size``: its items (for a stream, as it started; ``async_batcher.batch.joined``: the items
  that joined it while it ran);
- ``async_batcher.batch.key``: its ``batch_key``, when the batcher has keys;
- ``async_batcher.batch.queue_wait``: seconds its oldest item waited in the queue;
- ``async_batcher.batch.outcome``: ``ok``, ``partial`` (some items got an ``Exception``:
  ``async_batcher.batch.failed`` says how many), ``error`` (``process_batch`` raised, or returned results that do
  not fit: the exception is recorded on the span and its status is ``ERROR``), or ``cancelled`` (a stop cut it off);
- ``async_batcher.batch.departed``: items whose callers had left (cancelled, timed out) by its end.

While ``process_batch`` runs, the batch's span is the current span: what it traces (a database call, a model
step) is a child of it. Each caller's own span gets events: ``async_batcher.queued`` when it submits its item,
``async_batcher.sent`` when its batch starts (with the batch's trace and span ids, and how many of its items are in
the batch), then ``async_batcher.answered`` (``async_batcher.outcome``: ``ok`` or ``error``, with
``exception.type``) or ``async_batcher.cancelled``. Events rather than a child span per item: the caller's span
already exists and bounds the wait, so two instants on it say how long the request waited for its batch, without
doubling the spans exported per request; the work is the batch's span, one link away.

Spans are made only while a tracer provider is set (``tracer_provider=``, or the global one, looked up at each
batch); with the API's no-op provider, a batch costs one check, and a call one more function call and a test. Needs
the ``[opentelemetry]`` extra (``opentelemetry-api``; the SDK, which records and exports, is the application's
choice).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping, Set, Sized
from typing import Any, Final, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "async_batcher.opentelemetry needs the OpenTelemetry API: pip install 'async-batcher[opentelemetry]'"
    ) from exc

from async_batcher._core.current import CurrentBatch, current_batch
from async_batcher._version import __version__
from async_batcher.batcher import AsyncBatcher
from async_batcher.decorator import BatchedFunction, BatchedMethod

__all__ = [
    "EVENT_ANSWERED",
    "EVENT_CANCELLED",
    "EVENT_QUEUED",
    "EVENT_SENT",
    "instrument",
    "is_instrumented",
    "uninstrument",
]

R = TypeVar("R")

EVENT_QUEUED: Final = "async_batcher.queued"
EVENT_SENT: Final = "async_batcher.sent"
EVENT_ANSWERED: Final = "async_batcher.answered"
EVENT_CANCELLED: Final = "async_batcher.cancelled"

_BATCHER: Final = "async_batcher.batcher"
_OUTCOME: Final = "async_batcher.outcome"
# What instrument() puts on a batcher, by attribute: the wrappers shadow the class's methods on the instance.
_WRAPPED = ("process_batch", "process", "process_many", "stream")
_STATE: Final = "_async_batcher_opentelemetry"
_ABSENT: Final[Any] = object()
# The parent of every batch span: none (a batch is the root of a trace of its own, linked to its callers).
_ROOT: Final = otel_context.Context()
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def instrument(batcher: AsyncBatcher[Any, Any] | BatchedFunction[Any, Any], tracer_provider: Any = None) -> None:
    """Trace ``batcher``'s batches and its callers' waits (a ``@batch`` function: its batcher's).

    Args:
        batcher: An :class:`~async_batcher.AsyncBatcher`, or a ``@batch`` function (for a ``@batch`` method, one
            instance's: ``instrument(model.predict)``).
        tracer_provider: The ``TracerProvider`` to make spans with; the global one if ``None`` (looked up at each
            batch, so that a provider set after this call is used).

    Instrumenting again replaces the provider; :func:`uninstrument` undoes it. Works on a running batcher too.
    """
    b = _batcher_of(batcher)
    uninstrument(b)
    state = _Instrumentation(b, tracer_provider)
    own = vars(b)
    own[_STATE] = state
    for name in _WRAPPED:
        state.previous[name] = own.get(name, _ABSENT)
    original = b.process_batch
    if inspect.isasyncgenfunction(original):
        own["process_batch"] = functools.wraps(original)(functools.partial(_traced_stream_batch, state, original))
    elif inspect.iscoroutinefunction(original):
        own["process_batch"] = functools.wraps(original)(_async_wrapper(state, original))
    else:
        own["process_batch"] = functools.wraps(original)(functools.partial(_traced_sync_batch, state, original))
    own["process"] = _caller_wrapper(state, b.process)
    own["process_many"] = _caller_wrapper(state, b.process_many)
    own["stream"] = _stream_wrapper(state, b.stream)


def uninstrument(batcher: AsyncBatcher[Any, Any] | BatchedFunction[Any, Any]) -> None:
    """Undo :func:`instrument` (a no-op on a batcher that is not instrumented). Batches already running finish as
    they started."""
    b = _batcher_of(batcher)
    own = vars(b)
    state = own.pop(_STATE, None)
    if state is None:
        return
    for name, previous in state.previous.items():
        if previous is _ABSENT:
            own.pop(name, None)
        else:
            own[name] = previous


def is_instrumented(batcher: AsyncBatcher[Any, Any] | BatchedFunction[Any, Any]) -> bool:
    """Whether :func:`instrument` was called on ``batcher`` (and not undone)."""
    return _STATE in vars(_batcher_of(batcher))


def _batcher_of(batcher: object) -> AsyncBatcher[Any, Any]:
    if isinstance(batcher, AsyncBatcher):
        return batcher
    if isinstance(batcher, BatchedFunction):
        return batcher.batcher
    if isinstance(batcher, BatchedMethod):
        raise TypeError(
            f"{batcher!r} has a batcher per instance: instrument one instance's, "
            f"instrument(instance.{batcher.__name__})"
        )
    raise TypeError(f"instrument() takes an AsyncBatcher or a @batch function, got {batcher!r}")


class _Instrumentation:
    """What :func:`instrument` keeps on a batcher: its tracer, and the attributes it shadowed."""

    __slots__ = ("batcher", "on", "previous", "provider", "tracer")

    def __init__(self, batcher: AsyncBatcher[Any, Any], provider: Any) -> None:
        self.batcher = batcher
        self.provider = provider
        # Without a provider, the API's proxy tracer: it makes real spans once the application sets one.
        self.tracer = trace.get_tracer("async_batcher", __version__, tracer_provider=provider)
        self.previous: dict[str, Any] = {}
        self.on = False  # whether the last look found a provider: what a caller checks first, for nothing
        self.active_tracer()

    def active_tracer(self) -> trace.Tracer | None:
        """The tracer, if a tracer provider is set; ``None`` with the API's no-op one (no span, no work). Each batch
        looks (a provider set later is used from the next batch on)."""
        provider = self.provider if self.provider is not None else trace.get_tracer_provider()
        self.on = not isinstance(provider, _NO_PROVIDER)
        return self.tracer if self.on else None


# ---------------------------------------------------------------------- the batch's side


class _BatchSpan:
    """One batch's span: its links to its callers' spans, the events it adds to them, and how it ended."""

    __slots__ = ("batch", "joined", "name", "seen", "span")

    def __init__(self, state: _Instrumentation, tracer: trace.Tracer) -> None:
        self.name = state.batcher.name
        self.batch: CurrentBatch = current_batch()
        contexts = self.batch.contexts
        self.seen = {id(context): context for context in contexts}
        self.joined = 0
        callers = _caller_spans(contexts)
        attributes: dict[str, Any] = {
            _BATCHER: self.name,
            "async_batcher.batch.size": len(contexts),
            "async_batcher.batch.queue_wait": self.batch.waited,
        }
        key = self.batch.key
        if key is not None:
            attributes["async_batcher.batch.key"] = key if isinstance(key, str | int | float | bool) else repr(key)
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

    def step(self) -> None:
        """A streaming batch between two steps: link the callers whose items joined it (continuous batching)."""
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

    def returned(self, results: Any) -> None:
        """``process_batch`` returned ``results`` (a stream: ended). Results that do not fit the batch are an error,
        as the batcher will tell its callers (a generator is not read here: the batcher reads it)."""
        size = self.batch.size
        failed = 0
        if isinstance(results, str | bytes | bytearray | Mapping | Set):
            self._error(f"process_batch returned {type(results).__name__}")
            return
        if isinstance(results, Sized) and len(results) != size:
            self._error(f"process_batch returned {len(results)} results for a batch of {size} items")
            return
        if isinstance(results, list | tuple) and any(issubclass(kind, Exception) for kind in set(map(type, results))):
            failed = sum(1 for result in results if isinstance(result, Exception))
        if failed:
            self.span.set_attribute("async_batcher.batch.failed", failed)
        self._end("partial" if failed else "ok")

    def raised(self, error: BaseException) -> None:
        """``process_batch`` raised ``error`` (a ``CancelledError``: a stop cut the batch off)."""
        if isinstance(error, asyncio.CancelledError | GeneratorExit):
            self.span.set_status(trace.StatusCode.ERROR, "cancelled")
            self._end("cancelled")
            return
        self.span.record_exception(error)
        self._error(type(error).__name__)

    def _error(self, description: str) -> None:
        self.span.set_status(trace.StatusCode.ERROR, description)
        self._end("error")

    def _end(self, outcome: str) -> None:
        span = self.span
        if span.is_recording():
            span.set_attribute("async_batcher.batch.outcome", outcome)
            span.set_attribute("async_batcher.batch.departed", len(self.batch.departed))
            if self.joined:
                span.set_attribute("async_batcher.batch.joined", self.joined)
        span.end()


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


def _async_wrapper(state: _Instrumentation, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    async def process_batch(*args: Any, **kwargs: Any) -> Any:
        tracer = state.active_tracer()
        if tracer is None:
            return await original(*args, **kwargs)
        batch = _BatchSpan(state, tracer)
        try:
            with trace.use_span(batch.span, record_exception=False, set_status_on_exception=False):
                results = await original(*args, **kwargs)
        except BaseException as error:
            batch.raised(error)
            raise
        batch.returned(results)
        return results

    return process_batch


def _traced_sync_batch(state: _Instrumentation, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A plain ``process_batch``, in its thread (in the batch's context there)."""
    tracer = state.active_tracer()
    if tracer is None:
        return original(*args, **kwargs)
    batch = _BatchSpan(state, tracer)
    try:
        with trace.use_span(batch.span, record_exception=False, set_status_on_exception=False):
            results = original(*args, **kwargs)
    except BaseException as error:
        batch.raised(error)
        raise
    if inspect.isawaitable(results):  # it runs on the event loop, and ends the batch there
        return _awaited(batch, results)
    batch.returned(results)
    return results


async def _awaited(batch: _BatchSpan, awaitable: Awaitable[Any]) -> Any:
    try:
        with trace.use_span(batch.span, record_exception=False, set_status_on_exception=False):
            results = await awaitable
    except BaseException as error:
        batch.raised(error)
        raise
    batch.returned(results)
    return results


async def _traced_stream_batch(
    state: _Instrumentation, original: Callable[..., AsyncIterator[Any]], *args: Any, **kwargs: Any
) -> AsyncIterator[Any]:
    """A streaming ``process_batch``: the span is current while each step runs, not while the step is handed out
    (between steps the batcher, not the generator, runs)."""
    steps = original(*args, **kwargs)
    tracer = state.active_tracer()
    batch = None if tracer is None else _BatchSpan(state, tracer)
    try:
        while True:
            if batch is None:
                parts = await anext(steps, _ABSENT)
            else:
                token = otel_context.attach(trace.set_span_in_context(batch.span))
                try:
                    parts = await anext(steps, _ABSENT)
                finally:
                    otel_context.detach(token)
            if parts is _ABSENT:
                break
            yield parts
            if batch is not None:
                batch.step()
    except GeneratorExit:  # closed between two steps: every stream ended or left, or a stop cut the batch off
        raise
    except BaseException as error:
        if batch is not None:
            batch.raised(error)
            batch = None
        raise
    finally:
        try:
            await steps.aclose()  # type: ignore[attr-defined]
        finally:
            if batch is not None:
                batch.returned(None)


# ---------------------------------------------------------------------- the callers' side


def _caller_wrapper(state: _Instrumentation, original: Callable[..., Coroutine[Any, Any, R]]) -> Callable[..., Any]:
    """``process`` / ``process_many``: events on the caller's span, when it has one that records."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Coroutine[Any, Any, R]:
        if not state.on:
            return original(*args, **kwargs)  # (no coroutine of its own: without a provider, one call and a test)
        span = trace.get_current_span()
        if not span.is_recording():
            return original(*args, **kwargs)
        return _traced_call(state.batcher.name, span, original(*args, **kwargs))

    return call


async def _traced_call(name: str, span: trace.Span, call: Coroutine[Any, Any, R]) -> R:
    _event(span, EVENT_QUEUED, {_BATCHER: name})
    try:
        result = await call
    except asyncio.CancelledError:
        _event(span, EVENT_CANCELLED, {_BATCHER: name})
        raise
    except Exception as error:
        _event(span, EVENT_ANSWERED, {_BATCHER: name, _OUTCOME: "error", "exception.type": _type_name(error)})
        raise
    _event(span, EVENT_ANSWERED, {_BATCHER: name, _OUTCOME: "ok"})
    return result


def _stream_wrapper(state: _Instrumentation, original: Callable[..., AsyncIterator[R]]) -> Callable[..., Any]:
    @functools.wraps(original)
    def stream(*args: Any, **kwargs: Any) -> AsyncIterator[R]:
        span = trace.get_current_span() if state.on else trace.INVALID_SPAN
        if not span.is_recording():
            return original(*args, **kwargs)
        return _traced_stream(state.batcher.name, span, original(*args, **kwargs))

    return stream


async def _traced_stream(name: str, span: trace.Span, parts: AsyncIterator[R]) -> AsyncIterator[R]:
    _event(span, EVENT_QUEUED, {_BATCHER: name})
    try:
        async for part in parts:
            yield part
    except (asyncio.CancelledError, GeneratorExit):  # its consumer left: cancelled, or stopped iterating
        _event(span, EVENT_CANCELLED, {_BATCHER: name})
        raise
    except Exception as error:
        _event(span, EVENT_ANSWERED, {_BATCHER: name, _OUTCOME: "error", "exception.type": _type_name(error)})
        raise
    finally:
        await parts.aclose()  # type: ignore[attr-defined]
    _event(span, EVENT_ANSWERED, {_BATCHER: name, _OUTCOME: "ok"})


def _event(span: trace.Span, name: str, attributes: dict[str, Any]) -> None:
    if span.is_recording():  # (a caller's span may have ended before its call did)
        span.add_event(name, attributes)


def _type_name(error: BaseException) -> str:
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
