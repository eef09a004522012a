"""Past saturation on the simulated server: goodput and late answers with and without ``refuse_late``, and the rows a
model computes with and without ``dedup_key``.

The server is :mod:`benchmarks.policy.sim`'s (an asyncio loop on virtual time whose CPU each request spends, the
model a plain ``def`` in a one-thread executor that takes ``model_a + model_b·n`` virtual seconds, jittered), driven
here by an open loop of Poisson arrivals whose clients give up after ``deadline`` seconds. Each request tells the
server how long it has left (as a gRPC deadline or a header would): the handler calls ``process(item,
timeout=left)``. Every request gets an answer: its result, a ``503`` when the batcher refuses it
(``QueueFullException``, a ``LateRefusalError`` among them) or a ``504`` when its timeout expires; each costs the
loop ``post`` to write.

Measured per run, over the requests sent after the warm-up: goodput (results that reach their client within its
deadline, a second), the share of answers (results, 503s and 504s alike) that reach their client after its
deadline, and the rows the model computed per request.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.policy.sim.server import Costs, Model
from benchmarks.policy.sim.traffic import Scenario, open_arrivals
from benchmarks.policy.sim.vloop import SimLoop

__all__ = ["Outcome", "Traffic", "model_bound", "run"]


@dataclass(frozen=True)
class Traffic:
    """Open-loop traffic: Poisson at ``rate`` a second for ``duration`` virtual seconds (the first ``warmup`` not
    counted); each client gives up ``deadline`` seconds after it sent; ``duplicates``: the share of requests that
    repeat a request the server is still working on (one of those it has read and not yet answered, drawn at random;
    a new request when there is none): identical requests in flight, as a popular prompt or key brings them."""

    rate: float
    duration: float = 10.0
    warmup: float = 2.0
    deadline: float = 0.1
    duplicates: float = 0.0
    seed: int = 1


@dataclass
class Outcome:
    sent: int = 0
    answered: int = 0  # results, in the window
    in_time: int = 0  # results that reached their client within its deadline
    refused: int = 0  # 503s
    timed_out: int = 0  # 504s
    late: int = 0  # answers of any kind after their client's deadline
    rows: int = 0  # the model's rows (all the run)
    requests: int = 0  # requests sent (all the run)
    wrong: int = 0  # results that are not the request's own
    window: float = 0.0
    loop_busy: float = 0.0

    @property
    def goodput(self) -> float:
        return self.in_time / self.window

    @property
    def late_share(self) -> float:
        answers = self.answered + self.refused + self.timed_out
        return self.late / answers if answers else math.nan

    @property
    def rows_per_request(self) -> float:
        return self.rows / self.requests if self.requests else math.nan


def model_bound(costs: Costs) -> Costs:
    """The measured server's loop with a model that binds: 10 ms a batch and 1 ms a row (a batch of 64 in 74 ms, 865
    rows a second), the measured jitter. The measured model (2 ms for 256 rows) never binds: that server's event loop
    does (a request costs it more than the model's row), and no admission rule can shed load the loop has already
    spent on reading the request."""
    return replace(costs, model_a=0.010, model_b=0.001)


def run(costs: Costs, traffic: Traffic, kwargs: dict[str, Any], *, clock: str = "uvloop") -> Outcome:
    """One run of ``traffic`` through a batcher built with ``kwargs`` (``dedup=True``: with a ``dedup_key``)."""
    loop = SimLoop(clock)
    try:
        return loop.run_until_complete(_main(loop, costs, traffic, dict(kwargs)))
    finally:
        loop.close()


async def _main(loop: SimLoop, costs: Costs, traffic: Traffic, kwargs: dict[str, Any]) -> Outcome:
    from async_batcher import AsyncBatcher, QueueFullException

    scenario = Scenario("overload", "open", rate=traffic.rate, duration=traffic.duration, warmup=traffic.warmup,
                        seed=traffic.seed)  # fmt: skip
    model = Model(costs, scenario)
    executor = loop.default_executor
    executor.cost = model.take_cost
    executor.on_submit = lambda: loop.spend(costs.submit)
    dedup = kwargs.pop("dedup", False)
    tell_deadline = kwargs.pop("tell_deadline", True)

    class Simulated(AsyncBatcher[Any, Any]):
        def process_batch(self, batch: list[Any]) -> list[Any]:
            return [("answer", x) for x in model(batch)]

    class Deduplicating(Simulated):
        def dedup_key(self, item: Any) -> Any:
            return item

    batcher = (Deduplicating if dedup else Simulated)(executor=executor, **kwargs)
    batcher.start()
    out = Outcome(window=traffic.duration - traffic.warmup)
    half_net = costs.net / 2
    done = loop.create_future()
    pending = [0]
    rng = random.Random(f"{traffic.seed}/contents")
    working: dict[int, int] = {}  # the requests read and not yet answered: content -> how many
    fresh = iter(range(1, 1 << 62))

    def counted(sent: float) -> bool:
        return traffic.warmup <= sent < traffic.duration

    async def handle(sent: float, item: Any) -> None:
        loop.spend(costs.pre)
        left = sent + traffic.deadline - loop.now
        kind = "result"
        try:
            if left <= 0:
                raise TimeoutError  # (it came too late to be worth starting)
            result = await batcher.process(item, timeout=left if tell_deadline else None)
            if result != ("answer", item):
                out.wrong += 1
        except QueueFullException:
            kind = "refused"
        except TimeoutError:
            kind = "timed_out"
        loop.spend(costs.post)
        answered = loop.now + half_net
        if counted(sent):
            late = answered > sent + traffic.deadline
            out.late += late
            if kind == "result":
                out.answered += 1
                out.in_time += not late
            elif kind == "refused":
                out.refused += 1
            else:
                out.timed_out += 1
        working[item] -= 1
        if not working[item]:
            del working[item]
        pending[0] -= 1
        if not pending[0] and not done.done():
            done.set_result(None)

    def arrive(sent: float) -> None:
        loop.spend(costs.read)
        repeat = working and rng.random() < traffic.duplicates
        item = rng.choice(list(working)) if repeat else next(fresh)
        working[item] = working.get(item, 0) + 1
        loop.create_task(handle(sent, item))

    for sent in open_arrivals(scenario):
        pending[0] += 1
        out.requests += 1
        out.sent += counted(sent)
        loop.at(sent + half_net, arrive, sent)
    await done
    await batcher.stop()
    out.rows = model.items
    out.loop_busy = loop.busy / loop.now if loop.now else 0.0
    return out


Runner = Callable[[Costs, Traffic, dict[str, Any]], Outcome]
