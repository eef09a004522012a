"""``@batch``: functions and methods, async and sync, bare and with settings; one batcher per instance."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import async_batcher
from async_batcher import AsyncBatcher, BatchedFunction, BatchedMethod, BatcherStats, batch
from tests.batchers import until


@pytest.mark.virtual_time
async def test_a_bare_async_function_batches_concurrent_calls() -> None:
    seen: list[list[int]] = []

    @batch
    async def double(xs: list[int]) -> list[int]:
        """Doubles."""
        seen.append(list(xs))
        return [2 * x for x in xs]

    assert isinstance(double, BatchedFunction)
    assert double.__name__ == "double" and double.__doc__ == "Doubles."
    assert double.__wrapped__.__name__ == "double"
    assert isinstance(double.batcher, AsyncBatcher)
    assert double.batcher.name.endswith("double")

    results = await asyncio.gather(*(double(i) for i in range(5)))
    assert results == [0, 2, 4, 6, 8]
    assert seen == [[0, 1, 2, 3, 4]]
    assert isinstance(double.stats, BatcherStats)
    assert (double.stats.batches, double.stats.processed) == (1, 5)
    await double.stop()
    assert not await double.batcher.is_running()


@pytest.mark.virtual_time
async def test_settings_reach_the_batcher_and_process_many_keeps_the_order() -> None:
    seen: list[list[int]] = []

    @batch(max_batch_size=3, max_queue_time=5, name="tripler", concurrency=2, max_priority_wait=2)
    async def triple(xs: list[int]) -> list[int]:
        seen.append(list(xs))
        return [3 * x for x in xs]

    b = triple.batcher
    assert (b.name, b.max_batch_size, b.max_queue_time, b.concurrency) == ("tripler", 3, 5.0, 2)
    assert (b.max_priority_wait, b.max_latency) == (2.0, None)
    assert batch(max_latency=0.05)(triple.__wrapped__).batcher.max_latency == 0.05
    assert await triple.process_many(range(7)) == [3 * i for i in range(7)]
    assert seen == [[0, 1, 2], [3, 4, 5], [6]]
    assert await triple(10, timeout=60) == 30
    await triple.stop()


async def test_a_plain_def_runs_in_the_executor_off_the_loop_thread() -> None:
    threads: list[int] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-fn") as pool:

        @batch(max_batch_size=4, max_queue_time=60, executor=pool)
        def label(ids: list[int]) -> list[str]:
            threads.append(threading.get_ident())
            return [f"#{i}" for i in ids]

        results = await asyncio.gather(*(label(i) for i in range(8)))
        await label.stop()
    assert results == [f"#{i}" for i in range(8)]
    assert len(threads) == 2
    assert threading.get_ident() not in threads


async def test_an_async_callable_object_is_awaited_on_the_loop() -> None:
    class Doubler:
        async def __call__(self, xs: list[int]) -> list[int]:
            self.loop_thread = threading.get_ident()
            return [2 * x for x in xs]

    doubler = Doubler()
    fn: BatchedFunction[int, int] = batch(max_queue_time=0)(doubler)
    assert await fn(21) == 42
    assert doubler.loop_thread == threading.get_ident()
    await fn.stop()


class Scaler:
    """Each instance multiplies by its own factor: a batch must never mix two instances' items."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self.batches: list[list[int]] = []

    @batch(max_batch_size=10, max_queue_time=5)
    async def scale(self, xs: list[int]) -> list[int]:
        """Scales."""
        self.batches.append(list(xs))
        return [self.factor * x for x in xs]

    @batch
    def offset(self, xs: list[int]) -> list[int]:
        return [self.factor + x for x in xs]


@pytest.mark.virtual_time
async def test_each_instance_gets_its_own_batcher() -> None:
    a, b = Scaler(2), Scaler(3)
    assert isinstance(Scaler.scale, BatchedMethod)
    assert Scaler.scale.__doc__ == "Scales."
    assert isinstance(a.scale, BatchedFunction) and a.scale.__self__ is a
    assert a.scale.batcher is a.scale.batcher
    assert a.scale.batcher is not b.scale.batcher

    results = await asyncio.gather(*(s.scale(i) for i in range(4) for s in (a, b)))
    assert results == [f * i for i in range(4) for f in (2, 3)]
    assert a.batches == [[0, 1, 2, 3]] and b.batches == [[0, 1, 2, 3]]
    assert (a.scale.stats.processed, b.scale.stats.processed) == (4, 4)
    assert await a.scale.process_many([5, 6]) == [10, 12]
    for s in (a, b):
        await s.scale.stop()


async def test_a_sync_method_runs_in_the_executor() -> None:
    s = Scaler(100)
    assert await asyncio.gather(s.offset(1), s.offset(2)) == [101, 102]
    await s.offset.stop()


@pytest.mark.virtual_time
async def test_a_temporary_instance_lives_until_its_caller_has_the_result() -> None:
    # Nothing but the caller refers to the instance: the bound function it called keeps it alive.
    assert await Scaler(5).scale(2, timeout=60) == 10


@pytest.mark.virtual_time
async def test_instances_and_their_batchers_are_freed() -> None:
    s = Scaler(2)
    assert await s.scale(1) == 2
    instance, batcher = weakref.ref(s), weakref.ref(s.scale.batcher)
    await s.scale.stop()
    del s
    gc.collect()
    assert instance() is None
    assert batcher() is None
    assert Scaler.scale._batchers == {}  # the descriptor's table keeps nothing for a dead instance


def test_threads_reaching_a_new_instance_at_once_share_one_batcher() -> None:
    s = Scaler(1)
    barrier = threading.Barrier(8)
    found: list[Any] = []

    def reach() -> None:
        barrier.wait()
        found.append(s.scale.batcher)

    threads = [threading.Thread(target=reach) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 8 and all(b is found[0] for b in found)


def test_bad_settings_fail_at_the_decorator() -> None:
    async def f(xs: list[int]) -> list[int]:
        return xs

    with pytest.raises(ValueError, match="max_batch_size"):
        batch(max_batch_size=0)(f)
    with pytest.raises(ValueError, match="max_queue_time"):
        batch(max_queue_time=-1)(Scaler.scale.__wrapped__)
    with pytest.raises(TypeError, match="bogus"):
        batch(bogus=1)(f)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="key must be callable"):
        batch(key=3)(f)  # type: ignore[arg-type]

    async def awaited(x: int) -> int:
        return x

    for hook in ("key", "weight"):
        with pytest.raises(TypeError, match=f"{hook} must be a plain function"):
            batch(**{hook: awaited})(f)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="got 64"):
        batch(64)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="3 required positional parameters"):
        batch(lambda a, b, c: [])  # type: ignore[call-overload]


def test_a_misspelt_option_names_the_decorator_and_the_closest_option() -> None:
    async def f(xs: list[int]) -> list[int]:
        return xs

    message = r"^@batch\(\) got an unexpected keyword argument 'max_batch_sise'; did you mean 'max_batch_size'\?$"
    with pytest.raises(TypeError, match=message):
        batch(max_batch_sise=8)  # type: ignore[call-overload]  # caught with the settings
    with pytest.raises(TypeError, match=message):
        batch(f, max_batch_sise=8)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"argument 'contineous'; did you mean 'continuous'\?"):
        batch(contineous=True)  # type: ignore[call-overload]  # the decorator's own
    with pytest.raises(TypeError, match=r"argument 'bogus'; valid: .*, max_batch_size, .*, weight$"):
        batch(bogus=1)(f)  # type: ignore[call-overload]  # nothing close: the valid
    # Every keyword of AsyncBatcher() is valid (the lead's constructor included, read from its signature).
    assert batch(max_hold_time=0.0, batch_size=4, key=len)(f).batcher.max_batch_size == 4


def test_unexpected_keywords_says_which_and_what_was_meant() -> None:
    from async_batcher._checks import unexpected_keywords

    error = unexpected_keywords(
        ["name", "max_queue_tme", "conccurency"], ["name", "max_queue_time", "concurrency"], "X()"
    )
    assert isinstance(error, TypeError)
    assert str(error) == (
        "X() got unexpected keyword arguments 'max_queue_tme' (did you mean 'max_queue_time'?), "
        "'conccurency' (did you mean 'concurrency'?)"
    )
    with pytest.raises(ValueError, match="no unexpected keyword"):
        unexpected_keywords(["name"], ["name"], "X()")


def test_a_method_needs_weak_referenceable_instances() -> None:
    class Slotted:
        __slots__ = ()

        @batch
        async def run(self, xs: list[int]) -> list[int]:
            return xs

    with pytest.raises(TypeError, match="__weakref__"):
        Slotted().run  # noqa: B018


def test_repr_names_the_function() -> None:
    @batch
    async def named(xs: list[int]) -> list[int]:
        return xs

    assert "named" in repr(named)
    assert "Scaler.scale" in repr(Scaler.scale)
    assert "max_batch_size" in repr(batch(max_batch_size=3))


@pytest.mark.virtual_time
async def test_key_keeps_items_with_different_keys_apart() -> None:
    seen: list[list[str]] = []

    @batch(max_batch_size=10, max_queue_time=1.0, key=lambda text: text[0])
    async def upper(texts: list[str]) -> list[str]:
        seen.append(list(texts))
        return [t.upper() for t in texts]

    words = ["apple", "bee", "avocado", "berry", "cherry", "apricot"]
    assert await asyncio.gather(*(upper(w) for w in words)) == [w.upper() for w in words]
    assert sorted(seen) == [["apple", "avocado", "apricot"], ["bee", "berry"], ["cherry"]]
    assert type(upper.batcher).batch_key is not AsyncBatcher.batch_key
    assert type(upper.batcher).item_weight is AsyncBatcher.item_weight  # no weight: the hook stays the core's
    await upper.stop()


@pytest.mark.virtual_time
async def test_weight_closes_a_batch_before_it_would_exceed_max_batch_weight() -> None:
    seen: list[list[str]] = []

    @batch(max_queue_time=1.0, max_batch_weight=10, weight=len)
    async def count(texts: list[str]) -> list[int]:
        seen.append(list(texts))
        return [len(t) for t in texts]

    words = ["aaaa", "bbbb", "cc", "dddddd", "eeee"]
    assert await count.process_many(words) == [4, 4, 2, 6, 4]
    assert seen == [["aaaa", "bbbb", "cc"], ["dddddd", "eeee"]]
    with pytest.raises(ValueError, match="never fit"):
        await count("x" * 11)
    await count.stop()


class Tenants:
    def __init__(self) -> None:
        self.seen: list[list[tuple[str, int]]] = []

    @batch(max_batch_size=10, max_queue_time=1.0, key=lambda row: row[0], weight=lambda row: row[1])
    def run(self, rows: list[tuple[str, int]]) -> list[int]:
        self.seen.append(list(rows))
        return [n for _, n in rows]


@pytest.mark.virtual_time
async def test_key_and_weight_on_a_sync_method() -> None:
    t = Tenants()
    rows = [("a", 1), ("b", 2), ("a", 3)]
    assert await asyncio.gather(*(t.run(r) for r in rows)) == [1, 2, 3]
    assert sorted(t.seen) == [[("a", 1), ("a", 3)], [("b", 2)]]
    await t.run.stop()


@pytest.mark.virtual_time
async def test_priority_reaches_the_batcher() -> None:
    gate = asyncio.Event()
    seen: list[list[int]] = []

    @batch(max_batch_size=1, max_queue_time=0)
    async def one(xs: list[int]) -> list[int]:
        seen.append(list(xs))
        await gate.wait()
        return xs

    first = asyncio.ensure_future(one(0))
    await until(lambda: seen == [[0]])  # the first item holds the only slot
    rest = asyncio.gather(one(1), one(2, priority=-1), one.process_many([3], priority=-2))
    await asyncio.sleep(0)
    gate.set()
    assert await first == 0
    assert await rest == [1, 2, [3]]
    assert seen == [[0], [3], [2], [1]]
    await one.stop()


# ---------------------------------------------------------------------- a function written for one item


async def test_a_function_written_for_one_item_gets_an_error_that_names_it_and_says_what_batch_expects() -> None:
    @batch(max_queue_time=0)
    async def double(x: int) -> int:  # wrong: @batch calls it with the list of the items
        return x * 2  # ([7] * 2: two results for a batch of one)

    with pytest.raises(async_batcher.BatchSizeMismatchError) as caught:
        await double(7)
    assert str(caught.value) == (
        "@batch function 'test_a_function_written_for_one_item_gets_an_error_that_names_it_and_says_what_batch_"
        "expects.<locals>.double' returned 2 results for a batch of 1 item: a @batch function is called with the "
        "list of the items in the batch and must return a list with one result per item, in order ('test_a_function_"
        "written_for_one_item_gets_an_error_that_names_it_and_says_what_batch_expects.<locals>.double' takes x: int, "
        "one item: make it take list[int])"
    )
    await double.stop()


@pytest.mark.parametrize("kind", ["async", "sync", "method", "stream"])
async def test_results_that_do_not_fit_name_the_decorated_function(kind: str) -> None:
    async def lengths_async(texts: list[str]) -> dict[str, int]:
        return {t: len(t) for t in texts}  # wrong: a dict

    def lengths_sync(texts: list[str]) -> dict[str, int]:
        return {t: len(t) for t in texts}

    class Model:
        async def lengths(self, texts: list[str]) -> dict[str, int]:
            return {t: len(t) for t in texts}

    async def lengths_stream(texts: list[str]) -> Any:
        yield {t: len(t) for t in texts}

    func: Any = {"async": lengths_async, "sync": lengths_sync, "method": Model.lengths, "stream": lengths_stream}[kind]
    decorated = batch(max_queue_time=0, name="lengths")(func)
    f = decorated.__get__(Model()) if kind == "method" else decorated
    with pytest.raises(TypeError) as caught:
        if kind == "stream":
            [part async for part in f.stream("abc")]
        else:
            await f("abc")
    name = func.__qualname__
    assert str(caught.value).startswith(f"@batch function {name!r} returned dict for a batch of 1 item: a @batch ")
    assert str(caught.value).endswith("must return a list with one result per item, in order")
    await f.stop()


async def test_a_function_for_one_item_that_fails_on_the_list_gets_a_note_saying_why() -> None:
    @batch(max_queue_time=0, name="shout")
    def shout(text: str) -> str:
        return text.upper()  # a list has no upper()

    with pytest.raises(AttributeError) as caught:
        await shout("hi")
    assert caught.value.__notes__ == [
        "@batch calls 'test_a_function_for_one_item_that_fails_on_the_list_gets_a_note_saying_why.<locals>.shout' "
        "with the list of the items in the batch ('test_a_function_for_one_item_that_fails_on_the_list_gets_a_note_"
        "saying_why.<locals>.shout' takes text: str, one item: make it take list[str])"
    ]
    await shout.stop()


async def test_a_generator_of_results_is_read_once_and_results_that_fit_pass_untouched() -> None:
    read: list[int] = []

    @batch(max_queue_time=0.01)
    def squares(xs: list[int]) -> Any:
        for x in xs:
            read.append(x)
            yield x * x

    assert await asyncio.gather(*(squares(x) for x in range(4))) == [0, 1, 4, 9]
    assert sorted(read) == [0, 1, 2, 3]  # each read once, in its thread
    await squares.stop()
