"""The head-to-head's server for this package, instrumented: ``python -I probe.py --repo ROOT --port PORT``.

The app of ``make bench-peers`` (``benchmarks/peers/apps``: ``app_shape`` with ``app_ours`` at the README's
settings, uvicorn with uvloop and httptools, one worker), with clocks around the parts the simulator charges:

* the event loop's thread CPU (``time.thread_time``) inside uvicorn's ``data_received`` (**read**), from there to
  the handler's ``await`` of the batcher (**pre**), and from the result to the response's last ``send`` (**post**);
  these are per request only while one request is in flight at a time (one connection);
* the loop's CPU while a request waits for its batch (one connection: the batcher's own work and the hand-over of
  the batch to the model's thread and back: **submit**), and the wall time of that wait;
* the wall time of each ``process_batch`` in the model's thread, with its size (the model's **a + b·n**), and that
  thread's CPU time meanwhile (TensorFlow's own threads not counted);
* the wall time from ``data_received`` to the response, and the loop thread's CPU in all;
* ``GET /probe/model``: the model alone, before any load: ``process_batch`` (the batcher's, as its executor runs
  it) timed at batch sizes 1 to 256, interleaved, in a thread of its own while the loop idles.

* ``GET /probe/turns?n=N``: the cost of one iteration of an event loop (a **turn**, what a policy's ``turns`` cost
  after a batch's end): ``N`` zero-delay timers in a chain (``loop.call_at(loop.time(), ...)``, as the dispatcher
  schedules its turns), each the only callback of its iteration, on this server's own loop (uvloop, its listening
  socket registered) and on a fresh asyncio loop in a thread of its own (the loop's thread CPU per link: the server's
  loop idles meanwhile);
* ``GET /probe/gil?seconds=S&size=N``: the model's hold on the interpreter's lock (**gil**): a pure-Python counter
  spins on the loop's thread for ``S`` seconds alone, then ``S`` seconds while the model's thread runs
  ``process_batch`` on batches of ``N`` back to back; the share of the counter's progress lost is the share of the
  time the model held the lock (the server must have two cores for it: on one, the cores are shared as well).

``GET /probe`` answers the sums since the last ``GET /probe`` (and starts them afresh).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

cpu = time.thread_time_ns
wall = time.perf_counter_ns


class Probe:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.read = self.pre = self.post = self.wait_cpu = self.wait_wall = self.server_wall = 0
        self.batches: list[tuple[int, int]] = []
        self.batch_cpus: list[int] = []  # the model's thread's CPU during each of ``batches`` (ns)
        self.waits: list[int] = []  # each request's wait for its batch (wall ns)
        self.servers: list[int] = []  # each request's time in the server (wall ns)
        self.loop_cpu0 = cpu()
        self.wall0 = wall()
        self.read_exit = self.read_entry_wall = self.result_cpu = 0

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            batches, self.batches = self.batches, []
            batch_cpus, self.batch_cpus = self.batch_cpus, []
        out = {
            "requests": self.requests,
            "read_cpu_ns": self.read,
            "pre_cpu_ns": self.pre,
            "post_cpu_ns": self.post,
            "wait_cpu_ns": self.wait_cpu,
            "wait_wall_ns": self.wait_wall,
            "server_wall_ns": self.server_wall,
            "loop_cpu_ns": cpu() - self.loop_cpu0,
            "wall_ns": wall() - self.wall0,
            "batches": batches,
            "batch_cpus": batch_cpus,
            "waits": self.waits,
            "servers": self.servers,
        }
        self.reset()
        return out


PROBE = Probe()
UNTIMED: dict[str, Any] = {}
BATCHER: dict[str, Any] = {}
MODEL_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def time_model(repeats: int) -> list[tuple[int, int]]:
    """``process_batch`` at each of :data:`MODEL_SIZES`, ``repeats`` rounds of them all: (size, wall ns) each."""
    batcher = BATCHER["batcher"]
    process_batch = UNTIMED["process_batch"]
    rows = [[0.1 * (i % 10)] * 10 for i in range(max(MODEL_SIZES))]
    out = []
    for _ in range(repeats):
        for n in MODEL_SIZES:
            start = wall()
            process_batch(batcher, rows[:n])
            out.append((n, wall() - start))
    return out


async def _chain(n: int) -> float:
    """Thread CPU seconds per link of a chain of ``n`` zero-delay timers on the running loop: each the only callback
    of its iteration, scheduled as the dispatcher schedules its turns."""
    import asyncio

    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    left = [n]

    def link() -> None:
        left[0] -= 1
        if left[0] > 0:
            loop.call_at(loop.time(), link)
        else:
            done.set_result(None)

    start = cpu()
    loop.call_at(loop.time(), link)
    await done
    return (cpu() - start) / 1e9 / n


async def time_turns(n: int) -> dict[str, Any]:
    """One iteration's cost on this server's loop, then on a fresh asyncio loop in a thread (module docstring)."""
    import asyncio
    import threading

    served = await _chain(n)
    out: dict[str, float] = {}

    def plain() -> None:
        # asyncio's own selector loop, whatever loop policy uvicorn set (its self-pipe registered, as on a server)
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            out["asyncio"] = runner.run(_chain(n))

    thread = threading.Thread(target=plain)
    thread.start()
    await asyncio.to_thread(thread.join)
    return {"uvloop": served, "asyncio": out["asyncio"], "loop": type(asyncio.get_running_loop()).__module__}


def _spin(seconds: float) -> float:
    """A pure-Python counter for ``seconds`` of wall time: its count a second."""
    count = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        count += 1
    return count / seconds


def time_gil(seconds: float, size: int) -> dict[str, float]:
    """The counter's rate alone, then beside the model's thread running batches of ``size`` back to back; the
    share lost is the model's hold on the lock. Blocks the loop on purpose (nothing else is served meanwhile)."""
    import threading

    batcher = BATCHER["batcher"]
    process_batch = UNTIMED["process_batch"]
    rows = [[0.1 * (i % 10)] * 10 for i in range(size)]
    stop = threading.Event()
    calls = [0]

    def model() -> None:
        while not stop.is_set():
            process_batch(batcher, rows)
            calls[0] += 1

    alone = _spin(seconds)
    thread = threading.Thread(target=model)
    thread.start()
    try:
        beside = _spin(seconds)
    finally:
        stop.set()
        thread.join()
    return {"alone": alone, "beside": beside, "gil": max(0.0, min(1.0, 1.0 - beside / alone)),
            "model_calls": calls[0], "seconds": seconds, "size": size}  # fmt: skip


def instrument(ours_module: Any) -> None:
    from uvicorn.protocols.http import httptools_impl

    from async_batcher.ml.keras import KerasAsyncBatcher

    data_received = httptools_impl.HttpToolsProtocol.data_received

    def timed_data_received(self: Any, data: bytes) -> None:
        entry, entry_wall = cpu(), wall()
        data_received(self, data)
        PROBE.read_exit = done = cpu()
        PROBE.read += done - entry
        PROBE.read_entry_wall = entry_wall

    httptools_impl.HttpToolsProtocol.data_received = timed_data_received  # type: ignore[method-assign]

    send = httptools_impl.RequestResponseCycle.send

    async def timed_send(self: Any, message: Any) -> None:
        await send(self, message)
        last = message["type"] == "http.response.body" and not message.get("more_body", False)
        if last and self.scope["path"] == "/predict":
            PROBE.post += cpu() - PROBE.result_cpu
            took = wall() - PROBE.read_entry_wall
            PROBE.server_wall += took
            PROBE.servers.append(took)
            PROBE.requests += 1

    httptools_impl.RequestResponseCycle.send = timed_send  # type: ignore[method-assign]

    predict = ours_module.Ours.predict

    async def timed_predict(self: Any, features: list[float]) -> float:
        entry, entry_wall = cpu(), wall()
        PROBE.pre += entry - PROBE.read_exit
        result: float = await predict(self, features)
        PROBE.result_cpu = back = cpu()
        PROBE.wait_cpu += back - entry
        waited = wall() - entry_wall
        PROBE.wait_wall += waited
        PROBE.waits.append(waited)
        return result

    ours_module.Ours.predict = timed_predict

    process_batch = KerasAsyncBatcher.process_batch
    UNTIMED["process_batch"] = process_batch

    def timed_process_batch(self: Any, batch: list[Any]) -> Any:
        start, start_cpu = wall(), cpu()
        out = process_batch(self, batch)
        took, took_cpu = wall() - start, cpu() - start_cpu
        with PROBE.lock:
            PROBE.batches.append((len(batch), took))
            PROBE.batch_cpus.append(took_cpu)
        return out

    KerasAsyncBatcher.process_batch = timed_process_batch  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.repo))
    sys.path.append(str(args.repo / "benchmarks" / "peers" / "apps"))
    import app_ours  # type: ignore[import-not-found]
    from app_shape import create_app  # type: ignore[import-not-found]

    instrument(app_ours)

    def make_predictor(model: Any) -> Any:
        predictor = app_ours.make_predictor(model, settings={})
        BATCHER["batcher"] = predictor.batcher
        return predictor

    app = create_app(make_predictor, {"variant": "ours", "probe": True})

    @app.get("/probe")
    async def probe() -> dict[str, Any]:
        return PROBE.snapshot()

    @app.get("/probe/turns")
    async def turns(n: int = 20000) -> dict[str, Any]:
        return await time_turns(n)

    @app.get("/probe/gil")
    async def gil(seconds: float = 2.0, size: int = 64) -> dict[str, float]:
        return time_gil(seconds, size)

    @app.get("/probe/model")
    async def model(repeats: int = 100) -> list[tuple[int, int]]:
        import asyncio

        return await asyncio.to_thread(time_model, repeats)

    from benchmarks.peers.serve import serve

    serve(app, args.port)  # as the head-to-head serves every variant


if __name__ == "__main__":
    main()
