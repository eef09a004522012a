"""OpenTelemetry traces of a batcher: each batch a span linked to the spans of the callers it served.

::

    from async_batcher.opentelemetry import instrument

    instrument(scorer)  # spans from the global tracer provider, once the application sets one

A batch serves many requests at once, each in a trace of its own: its span cannot be a child of all of them, so it
is the root of a trace of its own, **linked** to each caller's span (the OpenTelemetry specification's way to
represent one operation done on behalf of many). Its name is ``"<batcher name> batch"``; its attributes:

- ``async_batcher.batcher``: the batcher's name;
- ``async_batcher.batch.size``: its items (for a stream, as it started; ``async_batcher.batch.joined``: the items
  that joined it while it ran); with ``dedup_key``, its rows: the callers that share a row are each linked, those
  that joined it before the batch went (a caller that joins a row in flight has its own events only);
- ``async_batcher.batch.key``: its ``batch_key``, when the batcher has keys;
- ``async_batcher.batch.queue_wait``: seconds its oldest item waited in the queue;
- ``async_batcher.batch.outcome``: ``ok``, ``partial`` (some items got an ``Exception``:
  ``async_batcher.batch.failed`` says how many), ``error`` (``process_batch`` raised, or returned results that do
  not fit, a stream a step that does not: the exception is recorded on the span and its status is ``ERROR``), or
  ``cancelled`` (a stop cut it off, a plain ``def`` still running in its thread too);
- ``async_batcher.batch.departed``: items whose callers had left (cancelled, timed out; a stream's consumer
  dropped as stalled too) by its end; items that failed did not leave;
- with the failure handling (:mod:`async_batcher.failures`): ``async_batcher.batch.retry``, the items answered with
  ``Retry``; ``async_batcher.batch.part`` on the call of a part of a failed batch (``bisect``, ``split``, or
  ``retry`` for the whole batch called again), each such call a span of its own; ``async_batcher.batch.ceiling``,
  the ceiling out-of-memory splits have set on its key, while one is set.

While ``process_batch`` runs, the batch's span is the current span: what it traces (a database call, a model step)
is a child of it. A direct call of ``process_batch`` (the warm-up from ``on_start``, a test, a health check) serves
no caller: it is the plain call, without a span. Each caller's own span gets events: ``async_batcher.queued`` when
it submits its item, ``async_batcher.sent`` when its batch starts (with the batch's trace and span ids, and how many
of its items are in the batch), then ``async_batcher.answered`` (``async_batcher.outcome``: ``ok`` or ``error``,
with ``exception.type``) or ``async_batcher.cancelled``. Events rather than a child span per item: the caller's span
already exists and bounds the wait, so two instants on it say how long the request waited for its batch, without
doubling the spans exported per request; the work is the batch's span, one link away.

A :class:`~async_batcher.shared.SharedBatcher` is instrumented in every process that shares it: the owner traces its
batches (its batcher, followed from owner to owner), the caller's span context crosses with its item (the batch's
span links to it), and a caller in a client gets its events but ``async_batcher.sent`` (its item goes out in another
process, which tells no one as it goes).

Spans are made only while a tracer provider is set (``tracer_provider=``, or the global one, looked up at each
batch); with the API's no-op provider, a batch costs one check, and a call one more function call and a test. Needs
the ``[opentelemetry]`` extra (``opentelemetry-api``; the SDK, which records and exports, is the application's
choice).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "async_batcher.opentelemetry needs the OpenTelemetry API: pip install 'async-batcher[opentelemetry]'"
    ) from exc

from async_batcher._core.batch import current_batch as _running_batch
from async_batcher._tracing import (
    _BATCHER,
    _OUTCOME,
    EVENT_ANSWERED,
    EVENT_CANCELLED,
    EVENT_QUEUED,
    EVENT_SENT,
    _BatchSpan,
    _event,
    _StreamSpan,
    _type_name,
)
from async_batcher._version import __version__
from async_batcher.batcher import AsyncBatcher
from async_batcher.decorator import BatchedFunction, BatchedMethod
from async_batcher.shared import SharedBatcher
from async_batcher.shared._follow import Follower

if TYPE_CHECKING:
    from async_batcher._core.batch import Batch

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
Instrumentable = AsyncBatcher[Any, Any] | SharedBatcher[Any, Any] | BatchedFunction[Any, Any]

# What instrument() puts on a batcher, by attribute: the wrappers shadow the class's methods on the instance.
_WRAPPED = ("process_batch", "process", "process_many", "stream")
_STATE: Final = "_async_batcher_opentelemetry"
_ABSENT: Final[Any] = object()
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def instrument(batcher: Instrumentable, tracer_provider: Any = None) -> None:
    """Trace ``batcher``'s batches and its callers' waits (a ``@batch`` function: its batcher's).

    Args:
        batcher: An :class:`~async_batcher.AsyncBatcher`, or a ``@batch`` function (for a ``@batch`` method, one
            instance's: ``instrument(model.predict)``), or a :class:`~async_batcher.shared.SharedBatcher` (or a
            ``@batch(shared=...)`` function), in every process that shares it: the process that owns it traces its
            batches (its batcher is instrumented while it owns it, from owner to owner), and each process's callers
            get their events, but ``async_batcher.sent``: in a client, an item goes out in another process, which
            tells no one (the batch's span links to the caller's span all the same).
        tracer_provider: The ``TracerProvider`` to make spans with; the global one if ``None`` (looked up at each
            batch, so that a provider set after this call is used).

    Instrumenting again replaces the provider; :func:`uninstrument` undoes it. Works on a running batcher too.
    """
    b = _batcher_of(batcher)
    uninstrument(b)
    if isinstance(b, SharedBatcher):
        _instrument_shared(b, tracer_provider)
        return
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


def uninstrument(batcher: Instrumentable) -> None:
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
    if state.follower is not None and (owned := state.follower.stop()) is not None:
        uninstrument(owned)


def is_instrumented(batcher: Instrumentable) -> bool:
    """Whether :func:`instrument` was called on ``batcher`` (and not undone)."""
    return _STATE in vars(_batcher_of(batcher))


def _batcher_of(batcher: object) -> AsyncBatcher[Any, Any] | SharedBatcher[Any, Any]:
    if isinstance(batcher, AsyncBatcher | SharedBatcher):
        return batcher
    if isinstance(batcher, BatchedFunction):
        return batcher.batcher
    if isinstance(batcher, BatchedMethod):
        raise TypeError(
            f"{batcher!r} has a batcher per instance: instrument one instance's, "
            f"instrument(instance.{batcher.__name__})"
        )
    raise TypeError(f"instrument() takes an AsyncBatcher, a SharedBatcher or a @batch function, got {batcher!r}")


class _Instrumentation:
    """What :func:`instrument` keeps on a batcher: its tracer, and the attributes it shadowed."""

    __slots__ = ("batcher", "follower", "on", "previous", "provider", "tracer")

    def __init__(self, batcher: AsyncBatcher[Any, Any] | SharedBatcher[Any, Any], provider: Any) -> None:
        self.batcher = batcher
        self.follower: Follower | None = None  # a shared batcher's: instruments its batcher where it is owned
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


def _own_batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Batch | None:
    """The batch this ``process_batch`` call is the batcher's own call for (it is handed that batch's list); ``None``
    for a direct call: a warm-up from ``on_start`` (contract point 4), a test, a health check, or a call from another
    batch's ``process_batch``. A direct call is the plain call: it serves no caller, so it has no batch span."""
    batch = _running_batch.get()
    if batch is None:
        return None
    items = args[0] if args else kwargs.get("batch")
    return batch if items is batch.items else None


S = TypeVar("S", bound=_BatchSpan)


def _start(kind: type[S], state: _Instrumentation, args: tuple[Any, ...], kwargs: dict[str, Any]) -> S | None:
    """The span of the batch this ``process_batch`` call is for; ``None`` (the plain call) without a tracer provider,
    or for a direct call (see :func:`_own_batch`)."""
    tracer = state.active_tracer()
    if tracer is None:
        return None
    batch = _own_batch(args, kwargs)
    return None if batch is None else kind(state, tracer, batch)


def _async_wrapper(state: _Instrumentation, original: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    async def process_batch(*args: Any, **kwargs: Any) -> Any:
        batch = _start(_BatchSpan, state, args, kwargs)
        if batch is None:
            return await original(*args, **kwargs)
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
    batch = _start(_BatchSpan, state, args, kwargs)
    if batch is None:
        return original(*args, **kwargs)
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
    batch = _start(_StreamSpan, state, args, kwargs)
    closed = False
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
            if batch is not None:
                batch.handing_out(parts)
            yield parts
            if batch is not None:
                batch.step()
    except GeneratorExit:  # closed between two steps: the batcher tells why (see _StreamSpan.closed)
        closed = True
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
                batch.closed() if closed else batch.returned(None)


# ---------------------------------------------------------------------- the callers' side


def _instrument_shared(shared: SharedBatcher[Any, Any], provider: Any) -> None:
    """The callers' events in this process, and its batcher's spans while this process owns it."""
    state = _Instrumentation(shared, provider)
    own = vars(shared)
    own[_STATE] = state
    for name in _WRAPPED[1:]:
        state.previous[name] = own.get(name, _ABSENT)
    own["process"] = _client_wrapper(state, shared, shared.process, _traced_call)
    own["process_many"] = _client_wrapper(state, shared, shared.process_many, _traced_call)
    own["stream"] = _client_wrapper(state, shared, shared.stream, _traced_stream)
    state.follower = Follower(functools.partial(instrument, tracer_provider=provider), uninstrument)
    state.follower.follow(shared)


def _client_wrapper(
    state: _Instrumentation, shared: SharedBatcher[Any, Any], original: Callable[..., Any], traced: Callable[..., Any]
) -> Any:
    """A shared batcher's ``process``, ``process_many`` or ``stream``: events on the caller's span where this process
    is a client (where it owns the batcher, its batcher's own wrappers add them). Each call looks for a provider, as
    no batch runs here to look."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if shared.batcher is not None or state.active_tracer() is None:
            return original(*args, **kwargs)
        span = trace.get_current_span()
        if not span.is_recording():
            return original(*args, **kwargs)
        return traced(shared.name, span, original(*args, **kwargs))

    return call


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
