"""async_batcher.opentelemetry against the real SDK: spans recorded by a TracerProvider into its in-memory exporter.

Each test makes its own provider (the SDK's global provider can be set once per process): the callers' spans come
from it, and the batcher is instrumented with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from async_batcher import END, AsyncBatcher, BatcherStoppedError, BatchSizeMismatchError, batch
from async_batcher.opentelemetry import (
    EVENT_ANSWERED,
    EVENT_CANCELLED,
    EVENT_QUEUED,
    EVENT_SENT,
    instrument,
    is_instrumented,
    uninstrument,
)
from tests.batchers import until


class Traced:
    """A tracer provider recording into memory, and what it recorded."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    @property
    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def batches(self, batcher: str) -> list[ReadableSpan]:
        return self.named(f"{batcher} batch")

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.named(name)
        return span


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.provider.shutdown()


def events(span: ReadableSpan) -> list[tuple[str, dict[str, Any]]]:
    """Its events from this package, with their attributes."""
    return [(e.name, dict(e.attributes or {})) for e in span.events if e.name.startswith("async_batcher.")]


def event_names(span: ReadableSpan) -> list[str]:
    return [name for name, _ in events(span)]


def linked(span: ReadableSpan) -> set[int]:
    return {link.context.span_id for link in span.links}


class Doubling(AsyncBatcher[int, int]):
    """Doubles; a negative item gets a ValueError; 99 fails the whole batch; can be held at a gate."""

    def __init__(self, traced: Traced, gate: asyncio.Event | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.traced = traced
        self.gate = gate

    async def process_batch(self, batch: list[int]) -> list[int | Exception]:
        with self.traced.tracer.start_as_current_span("model step"):  # (a child of the batch's span)
            if self.gate is not None:
                await self.gate.wait()
            if 99 in batch:
                raise RuntimeError("the model fell over")
            return [ValueError(f"negative: {x}") if x < 0 else x * 2 for x in batch]


async def call(traced: Traced, b: Any, x: int, **kwargs: Any) -> Any:
    """A request: a span of its own, in which it calls the batcher."""
    with traced.tracer.start_as_current_span(f"request {x}"):
        return await b.process(x, **kwargs)


async def test_a_batch_is_a_root_span_linked_to_each_callers_span_which_sees_it_sent_and_answered(
    traced: Traced,
) -> None:
    b = Doubling(traced, name="doubler", max_batch_size=8, max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    assert await asyncio.gather(*(call(traced, b, x) for x in range(5))) == [0, 2, 4, 6, 8]
    await b.stop()

    (span,) = traced.batches("doubler")
    requests = [traced.one(f"request {x}") for x in range(5)]
    assert span.parent is None  # the root of a trace of its own
    assert linked(span) == {r.context.span_id for r in requests}
    assert {link.context.trace_id for link in span.links} == {r.context.trace_id for r in requests}
    attributes = dict(span.attributes or {})
    assert attributes["async_batcher.batcher"] == "doubler"
    assert attributes["async_batcher.batch.size"] == 5
    assert attributes["async_batcher.batch.outcome"] == "ok"
    assert attributes["async_batcher.batch.departed"] == 0
    assert 0 <= attributes["async_batcher.batch.queue_wait"] < 30  # type: ignore[operator]
    assert "async_batcher.batch.key" not in attributes  # (no keys)
    assert span.status.status_code is trace.StatusCode.UNSET

    (model,) = traced.named("model step")  # what process_batch traced is the batch's
    assert model.parent is not None and model.parent.span_id == span.context.span_id
    batch_ids = {
        "async_batcher.batcher": "doubler",
        "async_batcher.batch.trace_id": trace.format_trace_id(span.context.trace_id),
        "async_batcher.batch.span_id": trace.format_span_id(span.context.span_id),
    }
    for request in requests:
        assert events(request) == [
            (EVENT_QUEUED, {"async_batcher.batcher": "doubler"}),
            (EVENT_SENT, {**batch_ids, "async_batcher.items": 1}),
            (EVENT_ANSWERED, {"async_batcher.batcher": "doubler", "async_batcher.outcome": "ok"}),
        ]
        queued, sent, answered = (e.timestamp for e in request.events)
        assert queued <= sent <= answered  # type: ignore[operator]
        assert span.start_time <= sent and answered >= span.end_time  # type: ignore[operator]


async def test_errors_are_recorded_on_the_spans_they_belong_to(traced: Traced) -> None:
    b = Doubling(traced, name="doubler", max_batch_size=2, max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    results = await asyncio.gather(*(call(traced, b, x) for x in (1, -1, 99, 2)), return_exceptions=True)
    await b.stop()
    assert [type(r).__name__ for r in results] == ["int", "ValueError", "RuntimeError", "RuntimeError"]

    (partial,) = [s for s in traced.batches("doubler") if traced.one("request -1").context.span_id in linked(s)]
    (raised,) = [s for s in traced.batches("doubler") if traced.one("request 99").context.span_id in linked(s)]
    assert linked(partial) == {traced.one(f"request {x}").context.span_id for x in (1, -1)}
    # One item failed: the batch did its work, its one caller was told.
    assert dict(partial.attributes or {})["async_batcher.batch.outcome"] == "partial"
    assert dict(partial.attributes or {})["async_batcher.batch.failed"] == 1
    assert partial.status.status_code is trace.StatusCode.UNSET
    # process_batch raised: the batch span has the exception and the error status; its callers were told.
    assert dict(raised.attributes or {})["async_batcher.batch.outcome"] == "error"
    assert raised.status.status_code is trace.StatusCode.ERROR and raised.status.description == "RuntimeError"
    assert [e.name for e in raised.events] == ["exception"]
    assert dict(raised.events[0].attributes or {})["exception.type"] == "RuntimeError"

    def answer(x: int) -> dict[str, Any]:
        return events(traced.one(f"request {x}"))[-1][1]

    assert answer(1) == {"async_batcher.batcher": "doubler", "async_batcher.outcome": "ok"}
    assert answer(-1)["async_batcher.outcome"] == "error" and answer(-1)["exception.type"] == "ValueError"
    assert answer(99)["exception.type"] == answer(2)["exception.type"] == "RuntimeError"
    # Nothing was recorded as an exception on a caller's span by the batcher: that is the caller's to do (here,
    # start_as_current_span records what escapes it).
    assert [e.name for e in traced.one("request 1").events if not e.name.startswith("async_batcher.")] == []


async def test_results_that_do_not_fit_are_an_error_of_the_batch(traced: Traced) -> None:
    class Short(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return batch[1:]

    b = Short(name="short", max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    results = await asyncio.gather(*(call(traced, b, x) for x in range(3)), return_exceptions=True)
    await b.stop()
    assert {type(r).__name__ for r in results} == {"BatchSizeMismatchError"}
    (span,) = traced.batches("short")
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.status.description == "process_batch returned 2 results for a batch of 3 items"


@pytest.mark.virtual_time
async def test_cancelled_and_timed_out_callers(traced: Traced) -> None:
    gate = asyncio.Event()
    b = Doubling(traced, gate=gate, name="doubler", max_batch_size=8, max_queue_time=0.1)
    instrument(b, tracer_provider=traced.provider)
    staying = asyncio.ensure_future(call(traced, b, 1))
    cancelled = asyncio.ensure_future(call(traced, b, 2))
    timed_out = asyncio.ensure_future(call(traced, b, 3, timeout=1.0))
    early = asyncio.ensure_future(call(traced, b, 4, timeout=0.05))  # leaves before its item is sent
    await asyncio.sleep(0.5)  # (virtual clock) the batch of three went at 0.1: held at the gate
    cancelled.cancel()
    await asyncio.sleep(2)  # 3's timeout expires
    gate.set()
    results = await asyncio.gather(staying, cancelled, timed_out, early, return_exceptions=True)
    await b.stop()
    assert [type(r).__name__ for r in results] == ["int", "CancelledError", "TimeoutError", "TimeoutError"]

    (span,) = traced.batches("doubler")
    assert dict(span.attributes or {})["async_batcher.batch.size"] == 3
    assert dict(span.attributes or {})["async_batcher.batch.departed"] == 2
    assert linked(span) == {traced.one(f"request {x}").context.span_id for x in (1, 2, 3)}
    assert event_names(traced.one("request 1")) == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]
    assert event_names(traced.one("request 2")) == [EVENT_QUEUED, EVENT_SENT, EVENT_CANCELLED]
    assert event_names(traced.one("request 3")) == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]
    assert events(traced.one("request 3"))[-1][1]["exception.type"] == "TimeoutError"
    assert event_names(traced.one("request 4")) == [EVENT_QUEUED, EVENT_ANSWERED]  # never sent


async def test_streaming_batches_link_the_items_that_join_them(traced: Traced) -> None:
    release = asyncio.Event()

    class Streaming(AsyncBatcher[int, int]):
        continuous_batching = True

        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:
            steps: dict[int, int] = {}  # (by item: the batcher edits the list between steps)
            while batch:
                with traced.tracer.start_as_current_span("model step"):
                    await asyncio.sleep(0)
                parts: list[Any] = []
                for x in batch:  # an item's stream: two parts, then its end
                    steps[x] = n = steps.get(x, -1) + 1
                    parts.append(x * 10 + n if n < 2 else END)
                yield parts
                if steps.get(0) == 0:
                    await release.wait()  # the first item waits for the others to queue

    b = Streaming(name="streamer", max_batch_size=4, max_queue_time=0)
    instrument(b, tracer_provider=traced.provider)

    async def read(x: int) -> list[int]:
        with traced.tracer.start_as_current_span(f"request {x}"):
            return [part async for part in b.stream(x)]

    first = asyncio.create_task(read(0))
    await until(lambda: len(traced.named("model step")) == 1)
    joiners = [asyncio.create_task(read(x)) for x in (1, 2)]
    await until(lambda: b.stats.queued == 2)
    release.set()
    assert await first == [0, 1] and await asyncio.gather(*joiners) == [[10, 11], [20, 21]]
    await b.stop()

    spans = traced.batches("streamer")
    first_batch = next(s for s in spans if traced.one("request 0").context.span_id in linked(s))
    attributes = dict(first_batch.attributes or {})
    assert attributes["async_batcher.batch.size"] == 1 and attributes["async_batcher.batch.outcome"] == "ok"
    assert attributes["async_batcher.batch.joined"] == 2  # they joined the running batch (continuous batching)
    assert linked(first_batch) == {traced.one(f"request {x}").context.span_id for x in range(3)}
    for x in range(3):
        request = traced.one(f"request {x}")
        assert event_names(request) == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]
        sent = events(request)[1][1]["async_batcher.batch.span_id"]
        assert sent in {trace.format_span_id(s.context.span_id) for s in spans}
    steps = traced.named("model step")
    assert {s.parent.span_id for s in steps if s.parent} <= {s.context.span_id for s in spans}


async def test_a_stream_left_early_is_cancelled_on_its_callers_span(traced: Traced) -> None:
    class Endless(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> AsyncIterator[list[int]]:
            while batch:
                yield list(batch)

    b = Endless(name="endless", max_queue_time=0)
    instrument(b, tracer_provider=traced.provider)
    with traced.tracer.start_as_current_span("request 0"):
        async with contextlib.aclosing(b.stream(0)) as parts:  # (a break alone does not close a generator)
            async for _ in parts:
                break
    await b.stop()
    assert event_names(traced.one("request 0")) == [EVENT_QUEUED, EVENT_SENT, EVENT_CANCELLED]
    (span,) = traced.batches("endless")
    assert dict(span.attributes or {})["async_batcher.batch.outcome"] == "ok"


async def test_a_plain_def_in_its_thread_and_callers_from_threads(traced: Traced) -> None:
    threads: list[int] = []

    class Threaded(AsyncBatcher[int, int]):
        def process_batch(self, batch: list[int]) -> list[int]:
            threads.append(threading.get_ident())
            with traced.tracer.start_as_current_span("model step"):
                return [x * 2 for x in batch]

    b = Threaded(name="threaded", max_queue_time=0.01, max_batch_size=8)
    instrument(b, tracer_provider=traced.provider)
    b.start()
    loop = asyncio.get_running_loop()

    def from_thread(x: int) -> int:
        with traced.tracer.start_as_current_span(f"request {x}"):
            return b.process_sync(x, timeout=30)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = await asyncio.gather(*(loop.run_in_executor(pool, from_thread, x) for x in range(3)))
    await b.stop()
    assert results == [0, 2, 4] and threads and threading.get_ident() not in threads
    spans = traced.batches("threaded")
    assert set().union(*(linked(s) for s in spans)) == {traced.one(f"request {x}").context.span_id for x in range(3)}
    assert all(dict(s.attributes or {})["async_batcher.batch.outcome"] == "ok" for s in spans)
    for step in traced.named("model step"):
        assert step.parent is not None and step.parent.span_id in {s.context.span_id for s in spans}
    for x in range(3):
        assert event_names(traced.one(f"request {x}")) == [EVENT_QUEUED, EVENT_SENT, EVENT_ANSWERED]


async def test_a_process_many_call_is_one_link_and_one_event_per_batch(traced: Traced) -> None:
    class Keyed(Doubling):
        def batch_key(self, item: int) -> str:
            return "even" if item % 2 == 0 else "odd"

    b = Keyed(traced, name="keyed", max_batch_size=8, max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    with traced.tracer.start_as_current_span("request many"):
        assert await b.process_many([1, 2, 3, 4, 6]) == [2, 4, 6, 8, 12]
    await b.stop()
    request = traced.one("request many")
    spans = {dict(s.attributes or {})["async_batcher.batch.key"]: s for s in traced.batches("keyed")}
    assert sorted(spans) == ["even", "odd"]
    assert all(linked(s) == {request.context.span_id} for s in spans.values())
    sent = sorted(attrs["async_batcher.items"] for name, attrs in events(request) if name == EVENT_SENT)
    assert sent == [2, 3] and event_names(request).count(EVENT_ANSWERED) == 1


async def test_batch_functions_are_instrumented_through_their_batcher(traced: Traced) -> None:
    @batch(max_queue_time=0.01, name="embed")
    async def embed(texts: list[str]) -> list[int]:
        return [len(t) for t in texts]

    class Model:
        @batch(max_queue_time=0.01)
        async def predict(self, rows: list[int]) -> list[int]:
            return rows

    instrument(embed, tracer_provider=traced.provider)
    assert is_instrumented(embed) and is_instrumented(embed.batcher)
    with pytest.raises(TypeError, match=r"instrument\(instance\.predict\)"):
        instrument(Model.predict, tracer_provider=traced.provider)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"an AsyncBatcher, a SharedBatcher or a @batch function"):
        instrument(object(), tracer_provider=traced.provider)  # type: ignore[arg-type]
    with traced.tracer.start_as_current_span("request"):
        assert await embed("four") == 4
    await embed.stop()
    (span,) = traced.batches("embed")
    assert linked(span) == {traced.one("request").context.span_id}


async def test_no_span_without_a_tracer_provider_and_uninstrument_undoes_it(traced: Traced) -> None:
    b = Doubling(traced, name="doubler", max_queue_time=0)
    own = dict(vars(b))
    instrument(b, tracer_provider=trace.NoOpTracerProvider())
    assert await call(traced, b, 1) == 2
    instrument(b)  # the global provider: none is set in the tests (the API's proxy)
    assert trace.get_tracer_provider().__class__ is trace.ProxyTracerProvider
    assert await call(traced, b, 2) == 4
    assert traced.batches("doubler") == [] and traced.named("model step") != []
    assert all(event_names(traced.one(f"request {x}")) == [] for x in (1, 2))
    instrument(b, tracer_provider=traced.provider)  # again: replaces the provider
    assert await call(traced, b, 3) == 6 and len(traced.batches("doubler")) == 1
    uninstrument(b)
    uninstrument(b)  # (a no-op)
    assert not is_instrumented(b) and vars(b).keys() == own.keys()
    assert await call(traced, b, 4) == 8 and len(traced.batches("doubler")) == 1
    await b.stop()


async def test_a_caller_without_a_span_pays_no_coroutine_of_its_own(traced: Traced) -> None:
    b = Doubling(traced, name="doubler", max_queue_time=0)
    instrument(b, tracer_provider=traced.provider)
    coroutine = b.process(1)
    assert coroutine.cr_code is AsyncBatcher.process.__code__  # type: ignore[attr-defined]
    assert await coroutine == 2
    (span,) = traced.batches("doubler")
    assert not span.links
    await b.stop()


async def test_a_batcher_started_inside_a_span_still_makes_each_batch_the_root_of_its_trace(traced: Traced) -> None:
    # start() gives the batches its context, the current span included: a batch must not become a child of it (a
    # lifespan's span would grow a trace for as long as the application runs).
    b = Doubling(traced, name="doubler", max_queue_time=0)
    instrument(b, tracer_provider=traced.provider)
    with traced.tracer.start_as_current_span("startup"):
        b.start()
    assert await call(traced, b, 1) == 2
    await b.stop()
    (span,) = traced.batches("doubler")
    assert span.parent is None and span.context.trace_id != traced.one("startup").context.trace_id


async def test_a_batch_larger_than_the_sdks_link_limit_still_names_itself_to_every_caller(traced: Traced) -> None:
    b = Doubling(traced, name="doubler", max_batch_size=256, max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    callers = range(100, 300)  # (99 would fail the batch)
    assert await asyncio.gather(*(call(traced, b, x) for x in callers)) == [x * 2 for x in callers]
    await b.stop()
    (span,) = traced.batches("doubler")
    assert (len(span.links), span.dropped_links) == (128, 72)  # the SDK's default limit
    sent = {trace.format_span_id(span.context.span_id)}
    for x in callers:
        request = traced.one(f"request {x}")
        assert {a["async_batcher.batch.span_id"] for name, a in events(request) if name == EVENT_SENT} == sent


# ---------------------------------------------------------------------- calls outside a batch, and every outcome


@pytest.mark.parametrize("kind", ["async def", "def", "async generator"])
async def test_a_direct_call_outside_a_batch_is_the_plain_call(traced: Traced, kind: str) -> None:
    # Contract point 4's warm-up (process_batch called from on_start), a test or a health check: no batch is
    # running, so there is nothing to trace; the instrumented call must still be the plain one.
    async def direct(b: Any, batch: list[int]) -> list[int]:
        if kind == "async def":
            return list(await b.process_batch(batch))
        if kind == "def":
            return list(b.process_batch(batch))
        return [part async for parts in b.process_batch(batch) for part in parts]

    warmed: list[list[int]] = []

    class Warm(AsyncBatcher[int, int]):
        async def on_start(self) -> None:
            warmed.append(await direct(self, [0] * 4))

        if kind == "async def":

            async def process_batch(self, batch: list[int]) -> list[int]:
                return [x + 1 for x in batch]

        elif kind == "def":

            def process_batch(self, rows: list[int]) -> list[int]:  # (called by position: not named batch)
                return [x + 1 for x in rows]

        else:

            async def process_batch(self, batch: list[int]) -> AsyncIterator[list[Any]]:  # type: ignore[override]
                yield [x + 1 for x in batch]

    w = Warm(name="warm", max_queue_time=0)
    instrument(w, tracer_provider=traced.provider)
    if kind == "async generator":
        assert [part async for part in w.stream(1)] == [2]
    else:
        assert await call(traced, w, 1) == 2
    assert warmed == [[1, 1, 1, 1]]
    assert await direct(w, [5, 6]) == [6, 7]  # a test or a health check, from outside any batch
    await w.stop()
    (span,) = traced.batches("warm")  # the batch's, not the warm-up's
    assert dict(span.attributes or {})["async_batcher.batch.size"] == 1


async def test_process_batch_called_from_another_batch_is_the_plain_call_too(traced: Traced) -> None:
    inner = Doubling(traced, name="inner", max_queue_time=0)

    class Outer(AsyncBatcher[int, int]):
        async def process_batch(self, batch: list[int]) -> list[int]:
            return await inner.process_batch([x + 1 for x in batch])  # (a direct call, in outer's batch)

    outer = Outer(name="outer", max_queue_time=0)
    instrument(inner, tracer_provider=traced.provider)
    instrument(outer, tracer_provider=traced.provider)
    assert await call(traced, outer, 1) == 4
    await outer.stop()
    assert traced.batches("inner") == [] and len(traced.batches("outer")) == 1


def outcome(span: ReadableSpan) -> tuple[Any, ...]:
    attributes = dict(span.attributes or {})
    return (
        attributes["async_batcher.batch.outcome"],
        span.status.status_code,
        attributes.get("async_batcher.batch.failed", 0),
        attributes["async_batcher.batch.departed"],
    )


class Steps(AsyncBatcher[int, int]):
    """A streaming batch whose steps the test writes: ``step(batch, n)`` makes step ``n``'s parts (the batch as it
    is then); ``None`` ends the generator."""

    def __init__(self, step: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = step
        self.closed = 0

    async def process_batch(self, batch: list[int]) -> AsyncIterator[Any]:
        try:
            n = 0
            while (parts := self.step(batch, n)) is not None:
                yield parts
                n += 1
        finally:
            self.closed += 1


async def read(traced: Traced, b: Any, x: int, parts: int | None = None) -> list[Any]:
    """A consumer: its own span; reads ``parts`` parts then leaves (all of them: ``None``)."""
    with traced.tracer.start_as_current_span(f"request {x}"):
        async with contextlib.aclosing(b.stream(x)) as stream:
            got = []
            async for part in stream:
                got.append(part)
                if len(got) == parts:
                    break
            return got


async def test_a_stream_step_of_the_wrong_width_is_an_error_of_the_batch(traced: Traced) -> None:
    b = Steps(lambda batch, n: [x * 10 + n for x in batch][: 1 if n == 1 else None], name="s", max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    results = await asyncio.gather(*(read(traced, b, x) for x in (1, 2)), return_exceptions=True)
    await b.stop()
    assert all(isinstance(r, BatchSizeMismatchError) for r in results), results
    (span,) = traced.batches("s")
    assert outcome(span) == ("error", trace.StatusCode.ERROR, 0, 0)  # they failed; they did not leave
    assert span.status.description == "BatchSizeMismatchError"
    assert [dict(e.attributes or {})["exception.type"] for e in span.events if e.name == "exception"] == [
        "async_batcher.exceptions.BatchSizeMismatchError"
    ]
    assert b.closed == 1


async def test_a_stream_step_failing_one_item_is_partial(traced: Traced) -> None:
    def step(batch: list[int], n: int) -> list[Any] | None:
        if n == 2:
            return None
        return [ValueError(x) if x == 2 and n == 1 else x * 10 + n for x in batch]

    b = Steps(step, name="s", max_queue_time=0.01)
    instrument(b, tracer_provider=traced.provider)
    results = await asyncio.gather(*(read(traced, b, x) for x in (1, 2, 3)), return_exceptions=True)
    await b.stop()
    assert results[0] == [10, 11] and isinstance(results[1], ValueError) and results[2] == [30, 31]
    (span,) = traced.batches("s")
    assert outcome(span) == ("partial", trace.StatusCode.UNSET, 1, 0)


async def test_a_consumer_leaving_mid_stream_departed(traced: Traced) -> None:
    b = Steps(lambda batch, n: None if n == 4 else list(batch), name="s", max_queue_time=0.01, stream_buffer=1)
    instrument(b, tracer_provider=traced.provider)
    results = await asyncio.gather(read(traced, b, 1), read(traced, b, 2, parts=1))
    await b.stop()
    assert results == [[1, 1, 1, 1], [2]]
    (span,) = traced.batches("s")
    assert outcome(span) == ("ok", trace.StatusCode.UNSET, 0, 1)


@pytest.mark.virtual_time
async def test_a_stalled_or_timed_out_consumer_departed_and_did_not_fail(traced: Traced) -> None:
    b = Steps(
        lambda batch, n: None if n == 8 else list(batch),
        name="s",
        max_queue_time=0.01,
        stream_buffer=1,
        stream_stall_timeout=1.0,
    )
    instrument(b, tracer_provider=traced.provider)

    async def stall() -> None:
        async with contextlib.aclosing(b.stream(3)) as stream:
            assert await anext(stream) == 3
            await asyncio.sleep(5)  # reads no more meanwhile: dropped from its batch after the stall timeout
            with pytest.raises(TimeoutError):  # (after the part it had buffered)
                async for _ in stream:
                    pass

    async def time_out() -> None:
        async with contextlib.aclosing(b.stream(4, timeout=0.2)) as stream:
            assert await anext(stream) == 4
            await asyncio.sleep(0.5)
            with pytest.raises(TimeoutError):  # (after the part it had buffered)
                async for _ in stream:
                    pass

    results = await asyncio.gather(read(traced, b, 1), stall(), time_out())
    await b.stop()
    assert results[0] == [1] * 8
    (span,) = traced.batches("s")
    assert dict(span.attributes or {})["async_batcher.batch.size"] == 3
    assert outcome(span) == ("ok", trace.StatusCode.UNSET, 0, 2)


@pytest.mark.virtual_time
async def test_a_forced_stop_between_two_steps_cancels_a_stream_batch(traced: Traced) -> None:
    b = Steps(lambda batch, n: list(batch), name="s", max_queue_time=0.01, stream_buffer=1)
    instrument(b, tracer_provider=traced.provider)
    slow = b.stream(1)
    assert await anext(slow) == 1  # then it reads no more: the batch waits for it between two steps
    await until(lambda: b.stats.in_flight == 1)
    await asyncio.sleep(1)
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError):
        async for _ in slow:
            pass
    (span,) = traced.batches("s")
    assert outcome(span)[:2] == ("cancelled", trace.StatusCode.ERROR)
    assert b.closed == 1


async def test_a_plain_def_batch_cut_off_by_a_forced_stop_is_cancelled(traced: Traced) -> None:
    entered, release = threading.Event(), threading.Event()

    class Blocking(AsyncBatcher[int, int]):
        def process_batch(self, batch: list[int]) -> list[int]:
            entered.set()
            release.wait(30)
            return batch

    b = Blocking(name="blocking", max_queue_time=0)
    instrument(b, tracer_provider=traced.provider)
    waiting = asyncio.ensure_future(call(traced, b, 1))
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
    await b.stop(force=True)
    with pytest.raises(BatcherStoppedError):
        await waiting
    release.set()  # the thread runs on to its end, unheard
    await until(lambda: traced.batches("blocking"))
    (span,) = traced.batches("blocking")
    assert outcome(span)[:2] == ("cancelled", trace.StatusCode.ERROR)


async def test_a_batch_key_whose_repr_raises_still_serves(traced: Traced) -> None:
    class Odd:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Odd)

        def __hash__(self) -> int:
            return 1

        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    class Keyed(Doubling):
        def batch_key(self, item: int) -> Odd:
            return Odd()

    b = Keyed(traced, name="keyed", max_queue_time=0)
    instrument(b, tracer_provider=traced.provider)
    assert await call(traced, b, 1) == 2
    await b.stop()
    (span,) = traced.batches("keyed")
    assert dict(span.attributes or {})["async_batcher.batch.key"] == "Odd"
