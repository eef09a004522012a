"""The simulated model server: a scenario's requests through a batcher on :class:`~.vloop.SimLoop`, and what they
measured.

A request costs the server's event loop CPU time (:class:`Costs`), as an HTTP request costs a FastAPI server:

1. ``read`` when it arrives: a callback (the server reading and parsing it), which then creates the handler's task;
2. ``pre`` when that task first runs, before ``await submit(item)`` (routing, validation, the handler);
3. ``post`` once its result is back (the response written).

The model call is a plain ``def`` in a one-thread executor (:class:`~.vloop.SimExecutor`), as in the HTTP benchmark:
it costs the loop ``submit`` seconds of CPU when a batch is handed over, and takes ``model_a + model_b * n`` virtual
seconds off the loop (times a seeded lognormal factor of mean 1 and spread ``jitter``, if any) before its callers'
results reach the loop. ``net`` is the time outside the server: half before a request reaches it, half for the
answer to reach its client. Latency is from the client's send (an open loop's intended send time) to its answer.

Besides, each iteration of the loop that runs a callback costs it ``turn`` seconds (``turn_asyncio`` on asyncio's
clock), and the model's job holds the interpreter's lock for the share ``gil`` of its time (:mod:`.vloop`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .traffic import Keys, Scenario, open_arrivals
from .vloop import SimExecutor, SimLoop

__all__ = ["Adapter", "Costs", "Model", "Result", "percentile", "run"]


@dataclass(frozen=True)
class Costs:
    """The cost constants, in seconds (module docstring)."""

    read: float
    pre: float
    post: float
    submit: float
    model_a: float
    model_b: float
    net: float
    jitter: float = 0.0
    turn: float = 0.0  # the loop's CPU per iteration, uvloop (the HTTP benchmark's server)
    turn_asyncio: float = 0.0  # the same on asyncio's own loop
    gil: float = 0.0  # the share of the model's time that it holds the interpreter's lock

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Costs:
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in names})

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def turn_of(self, clock: str) -> float:
        """The cost of one iteration of the loop whose clock the batchers see (``uvloop`` or ``asyncio``)."""
        return self.turn_asyncio if clock == "asyncio" else self.turn

    def scaled(self, name: str, factor: float) -> Costs:
        """These constants with ``name`` times ``factor`` (a share, ``gil``, at most 1)."""
        value = getattr(self, name) * factor
        return replace(self, **{name: min(1.0, value) if name == "gil" else value})

    @property
    def request_cpu(self) -> float:
        return self.read + self.pre + self.post

    def capacity(self, max_batch_size: int, cores: float = 2.0) -> float:
        """Requests a second at saturation, at full batches: the loop's CPU, the model's, or both on ``cores``
        processors, whichever binds first."""
        n = max_batch_size
        loop = self.request_cpu + self.submit / n  # a request's CPU on the loop
        model = (self.model_a + self.model_b * n) / n  # and in the model's thread
        return min(1.0 / loop, 1.0 / model, cores / (loop + model), 1.0 / (loop + self.gil * model))


class Model:
    """The batch function every batcher calls: echoes its items, counts its calls, and charges the executor
    ``model_a + model_b * n`` (jittered) for each. A batch that mixes keys is a batcher's bug: it raises."""

    def __init__(self, costs: Costs, scenario: Scenario) -> None:
        self._a, self._b, self._sigma = costs.model_a, costs.model_b, costs.jitter
        self._rng = scenario.stream("model")
        self._keyed = scenario.keys > 0
        self.calls = 0
        self.items = 0
        self._pending = 0.0

    def __call__(self, batch: list[Any]) -> list[Any]:
        n = len(batch)
        self.calls += 1
        self.items += n
        if self._keyed and n and any(item[0] != batch[0][0] for item in batch):
            raise AssertionError(f"a batch mixes keys: {sorted({item[0] for item in batch})}")
        cost = self._a + self._b * n
        if self._sigma:
            cost *= math.exp(self._rng.gauss(-self._sigma * self._sigma / 2, self._sigma))
        self._pending += cost
        return list(batch)

    def take_cost(self) -> float:
        cost, self._pending = self._pending, 0.0
        return cost


@dataclass
class Adapter:
    """A batcher as the simulated server uses it: ``submit(item)`` gives its result; ``close()`` once all answered."""

    submit: Callable[[Any], Awaitable[Any]]
    close: Callable[[], Awaitable[None]]


#: Builds the batcher under test on the running loop: (model function, the model's executor, keyed or not).
MakeAdapter = Callable[[Callable[[list[Any]], list[Any]], SimExecutor, bool], Adapter]


@dataclass
class Result:
    """What one run measured. Latencies in seconds; ``throughput`` in answers a second."""

    sent: int
    answered: int
    p50: float
    p99: float
    p999: float
    mean: float
    throughput: float
    offered: float  # requests sent within the counted time, a second (a closed loop's: as many as it could)
    calls: int
    items: int
    items_per_call: float
    loop_busy: float
    virtual_s: float
    wall_s: float
    wall_clock_reads: int
    open_p99: float | None = None
    closed_throughput: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of an increasing list; NaN for an empty one."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@contextmanager
def _counting_wall_clock() -> Iterator[list[int]]:
    """Counts reads of the wall clock (``time.time``, ``monotonic``, ``perf_counter``) through the ``time`` module
    while the simulation runs: a batcher that times itself by the wall clock would see no time pass (or the real
    machine's), and must be patched onto the loop's clock."""
    count = [0]
    saved = {name: getattr(time, name) for name in ("time", "monotonic", "perf_counter")}

    def counting(real: Callable[[], float]) -> Callable[[], float]:
        def read() -> float:
            count[0] += 1
            return real()

        return read

    for name, real in saved.items():
        setattr(time, name, counting(real))
    try:
        yield count
    finally:
        for name, real in saved.items():
            setattr(time, name, real)


class _Server:
    def __init__(self, loop: SimLoop, scenario: Scenario, costs: Costs, adapter: Adapter) -> None:
        self.loop, self.scenario, self.costs = loop, scenario, costs
        self.submit = adapter.submit
        self.half_net = costs.net / 2
        self.latencies: list[float] = []
        self.open_latencies: list[float] = []
        self.answered_in_window = 0
        self.closed_in_window = 0
        self.sent_in_window = 0
        self.sent = 0
        self.outstanding = 0
        self.sending = 0  # sources still sending: the open loop, each closed-loop client
        self.done: asyncio.Future[None] = loop.create_future()
        self.seq = 0

    # -- a request's way through the server
    def arrive(self, sent: float, item: Any, client: _Client | None) -> None:
        self.loop.spend(self.costs.read)
        self.loop.create_task(self.handle(sent, item, client))

    async def handle(self, sent: float, item: Any, client: _Client | None) -> None:
        loop = self.loop
        try:
            loop.spend(self.costs.pre)
            result = await self.submit(item)
            if result != item:
                raise AssertionError(f"item {item!r} got the result {result!r}")
            loop.spend(self.costs.post)
        except BaseException as exc:
            if not self.done.done():
                self.done.set_exception(exc)
            raise
        answered = loop.now + self.half_net
        scenario = self.scenario
        if scenario.warmup <= sent < scenario.duration:
            latency = answered - sent
            self.latencies.append(latency)
            if client is None:
                self.open_latencies.append(latency)
        if scenario.warmup <= answered < scenario.duration:
            self.answered_in_window += 1
            if client is not None:
                self.closed_in_window += 1
        self.outstanding -= 1
        if client is not None:
            client.answered(answered)
        self._check_done()

    def send(self, sent: float, item: Any, client: _Client | None) -> None:
        """A request sent at ``sent`` (now or later): it reaches the server half the network's time later."""
        self._sent(sent)
        self.loop.at(sent + self.half_net, self.arrive, sent, item, client)

    def _sent(self, t: float) -> None:
        self.sent += 1
        self.outstanding += 1
        if self.scenario.warmup <= t < self.scenario.duration:
            self.sent_in_window += 1

    def stopped_sending(self) -> None:
        self.sending -= 1
        self._check_done()

    def _check_done(self) -> None:
        if not self.sending and not self.outstanding and not self.done.done():
            self.done.set_result(None)

    def next_item(self, keys: Keys | None) -> Any:
        self.seq += 1
        return self.seq if keys is None else (keys.next(), self.seq)

    # -- the open loop: one timer at a time, for the next send
    def start_open(self) -> None:
        self.sending += 1
        scenario = self.scenario
        keys = Keys(scenario.keys, scenario.zipf, scenario.stream("open-keys")) if scenario.keys else None
        self._open_next(open_arrivals(scenario), keys)

    def _open_next(self, times: Iterator[float], keys: Keys | None, sent: float = -1.0, item: Any = None) -> None:
        """The open loop's one timer: the arrival of the request sent at ``sent``, which schedules the next one's."""
        if sent >= 0:
            self.arrive(sent, item, None)
        t = next(times, None)
        if t is None:
            self.stopped_sending()
            return
        self._sent(t)
        self.loop.at(t + self.half_net, self._open_next, times, keys, t, self.next_item(keys))


class _Client:
    """A closed-loop client: its next request once it has its answer and has thought."""

    def __init__(self, server: _Server, index: int) -> None:
        self.server = server
        scenario = server.scenario
        self.rng = scenario.stream(f"client-{index}")
        self.keys = Keys(scenario.keys, scenario.zipf, self.rng) if scenario.keys else None
        self.think = scenario.think
        self.duration = scenario.duration

    def start(self) -> None:
        self.server.sending += 1
        self.send(0.0)

    def send(self, t: float) -> None:
        """Send the next request at ``t`` (scheduled now, for its arrival), or stop at the end of the scenario."""
        if t >= self.duration:
            self.server.stopped_sending()
            return
        self.server.send(t, self.server.next_item(self.keys), self)

    def answered(self, t: float) -> None:
        self.send(t + self.rng.expovariate(1.0 / self.think) if self.think else t)


async def _main(loop: SimLoop, scenario: Scenario, costs: Costs, make: MakeAdapter, model: Model) -> _Server:
    executor = loop.default_executor
    executor.cost = model.take_cost
    executor.on_submit = lambda: loop.spend(costs.submit)
    adapter = make(model, executor, scenario.keys > 0)
    server = _Server(loop, scenario, costs, adapter)
    if scenario.kind in ("open", "mixed"):
        server.start_open()
    if scenario.kind in ("closed", "mixed"):
        for i in range(scenario.clients):
            _Client(server, i).start()
    await server.done
    await adapter.close()
    return server


def run(scenario: Scenario, costs: Costs, make: MakeAdapter, clock: str = "uvloop", cores: float = 2.0) -> Result:
    """Run ``scenario`` through the batcher ``make`` builds, on a fresh :class:`SimLoop` with ``clock`` and
    ``cores``."""
    loop = SimLoop(clock, cores, turn=costs.turn_of(clock), gil=costs.gil)
    model = Model(costs, scenario)
    wall = time.perf_counter()
    try:
        with _counting_wall_clock() as reads:
            server = loop.run_until_complete(_main(loop, scenario, costs, make, model))
            _cancel_leftovers(loop)
    finally:
        loop.close()
    wall = time.perf_counter() - wall
    latencies = sorted(server.latencies)
    window = scenario.duration - scenario.warmup
    result = Result(
        sent=server.sent,
        answered=len(latencies),
        p50=percentile(latencies, 0.5),
        p99=percentile(latencies, 0.99),
        p999=percentile(latencies, 0.999),
        mean=math.fsum(latencies) / len(latencies) if latencies else math.nan,
        throughput=server.answered_in_window / window,
        offered=server.sent_in_window / window,
        calls=model.calls,
        items=model.items,
        items_per_call=model.items / model.calls if model.calls else math.nan,
        loop_busy=loop.busy / loop.now if loop.now else 0.0,
        virtual_s=loop.now,
        wall_s=wall,
        wall_clock_reads=reads[0],
    )
    if scenario.kind == "mixed":
        result.open_p99 = percentile(sorted(server.open_latencies), 0.99)
        result.closed_throughput = server.closed_in_window / window
    return result


def _cancel_leftovers(loop: SimLoop) -> None:
    """Cancel what a batcher left running (a peer's endless polling task) and let it finish."""
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
