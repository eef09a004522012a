"""The simulator's event loop on virtual time, and its executor: no thread, no socket, no wall clock.

:class:`SimLoop` is asyncio's own ``BaseEventLoop`` (the same ``_run_once``: timers due, then the callbacks that were
ready at the start of the iteration) with a clock that only moves in two ways:

* **It jumps** to the next timer when nothing is ready (an idle loop waits for nothing; there is no I/O to poll).
* **It is spent**: :meth:`SimLoop.spend` moves it forward *synchronously* inside a callback, for the CPU time the
  server's own code takes (parsing a request, running a handler). Nothing else runs meanwhile: timers that come due
  fire late, after the callback, and arrivals that came meanwhile are read together in the next iteration, as a
  busy server reads the requests that queued on its sockets while it worked.

:class:`SimExecutor` stands for the model's thread: ``submit(fn, *args)`` runs ``fn`` at once (its result is known),
but the future it returns resolves only when the virtual time the work costs has passed (what
:class:`~.server.Model` charged while ``fn`` ran), one job at a time per worker; its done-callbacks then reach the
loop through ``call_soon_threadsafe``, as a real thread's do. A batcher with a plain ``def process_batch`` thus runs
the code path it runs in a server, deterministically.

**Cores.** The loop and the model's jobs share ``cores`` processors (:class:`SimLoop`'s ``cores``): while ``k``
threads have work (the loop, during :meth:`SimLoop.spend`, and each job running), each gets ``min(1, cores / k)`` of
a processor (processor sharing, as the OS scheduler shares a core between runnable threads). With ``cores=2`` (one
job at a time) nothing ever waits: the model runs beside the loop, as on a machine with a core for each. With
``cores=1`` they take turns on one core: a job's CPU time spent while the loop works stretches the loop's callback,
and the loop's CPU spent while a job runs delays the job's end (each by the CPU the other got meanwhile: a job of
``c`` seconds that starts as the loop begins ``s`` seconds of work ends ``c + min(c, s)`` later). A fractional
``cores`` between 1 and 2 stands for partial contention (another process on the machine, the model's own threads):
the calibration fits it (:mod:`benchmarks.policy.fit`).

**The interpreter's lock.** A model job holds the GIL for a share ``gil`` of its time (its Python; the rest, the
compiled kernels, let the loop run), and the loop holds it whenever it runs: while the loop works beside ``k`` jobs,
the lock allows each of them at most ``1 / (1 + gil * k)`` of the time, whatever the cores. ``gil=0``: the lock
never binds; ``gil=1``: the loop and the model take turns even on two cores. Each runnable thread's rate is thus
``min(1, cores / threads, 1 / (loop + gil * jobs))`` (:meth:`SimExecutor.rate`).

**Turns.** Every iteration of the loop that runs a callback costs it ``turn`` seconds of CPU first (the poll of the
selector and the iteration's own work, measured: :mod:`benchmarks.policy.measure`): a policy's turns after a batch's
end cost that much each, as on a real loop, where a loop with nothing to do between turns still polls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
from collections import deque
from collections.abc import Callable
from heapq import heappop
from typing import Any

__all__ = ["CLOCKS", "SimExecutor", "SimLoop"]


CLOCKS = ("uvloop", "asyncio")
#: CPU seconds left below which a job has ended (its end computed through other times than it started by).
EPSILON = 1e-12


class SimLoop(asyncio.BaseEventLoop):
    """An event loop on virtual time (module docstring). ``busy`` sums the CPU time :meth:`spend` took.

    ``clock="uvloop"`` gives the batchers uvloop's clock, as the HTTP benchmark's server runs (libuv's): ``time()``
    in whole milliseconds, and a timer's delay rounded to the nearest millisecond (``round``: 0.5 ms and less run
    at the next iteration, 0.6 to 1.5 ms after 1 ms, counted from the millisecond ``time()`` shows). ``"asyncio"``:
    the exact clock of asyncio's own loops. The simulation's own events (arrivals, the model's end) are exact either
    way (:meth:`at`); :attr:`now` is the exact time.
    """

    def __init__(self, clock: str = "uvloop", cores: float = 2.0, *, turn: float = 0.0, gil: float = 0.0) -> None:
        super().__init__()
        problem = None
        if clock not in CLOCKS:
            problem = f"clock {clock!r} is not one of {CLOCKS}"
        elif not cores >= 1:
            problem = f"cores must be 1 or more, got {cores!r}"
        elif not 0 <= turn < 1:
            problem = f"turn must be 0 or more seconds (and under one), got {turn!r}"
        elif not 0 <= gil <= 1:
            problem = f"gil must be a share between 0 and 1, got {gil!r}"
        if problem is not None:
            self.close()
            raise ValueError(problem)
        self._now = 0.0
        self._ms = clock == "uvloop"
        self.busy = 0.0
        self.iterations = 0  # those that ran a callback (each cost ``turn``)
        self.cores = float(cores)
        self.turn = float(turn)
        self.gil = float(gil)
        self.default_executor = SimExecutor(self, workers=1)

    @property
    def now(self) -> float:
        return self._now

    def time(self) -> float:
        return int(self._now * 1000 + 1e-6) / 1000 if self._ms else self._now  # (+1e-6: 0.003 is 0.00299...)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any, context: Any = None) -> Any:
        if not self._ms:
            return super().call_at(when, callback, *args, context=context)
        ms = round((when - self.time()) * 1000)
        if ms <= 0:
            return self.call_soon(callback, *args, context=context)
        return super().call_at(self._now + ms / 1000, callback, *args, context=context)

    def at(self, when: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        """Schedule one of the simulation's own events at the exact time ``when`` (never rounded)."""
        return asyncio.BaseEventLoop.call_at(self, when, callback, *args)

    def spend(self, seconds: float) -> None:
        """The running callback takes ``seconds`` of the loop's CPU: the clock moves, nothing else runs on the loop
        (the model's jobs share the cores with it: the module's docstring)."""
        if seconds > 0:
            self.busy += seconds
            executor = self.default_executor
            if executor.running and executor.contended:
                self._now = executor.share(self._now, seconds)
            else:
                self._now += seconds

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _run_once(self) -> None:
        """One iteration, as ``BaseEventLoop._run_once`` runs it (the timers due join the callbacks ready, then those
        run, not the ones they schedule), without the I/O poll: the clock jumps to the next timer when nothing is
        ready. (Lean on purpose: the simulation's speed is this loop's.)"""
        scheduled: list[Any] = self._scheduled  # type: ignore[attr-defined]
        ready: deque[Any] = self._ready  # type: ignore[attr-defined]
        if len(scheduled) > 100 and self._timer_cancelled_count * 2 > len(scheduled):  # type: ignore[attr-defined]
            # Many cancelled timers (the base loop's rule): drop them all at once.
            kept = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    kept.append(handle)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                heappop(scheduled)._scheduled = False
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            if not scheduled:
                raise RuntimeError("simulation deadlock: nothing is ready and no timer is pending")
            when = scheduled[0]._when
            if when > self._now:
                self._now = when
        end = self._now + 1e-9
        while scheduled and scheduled[0]._when < end:
            handle = heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        if ready:
            self.iterations += 1
            self.spend(self.turn)  # (the timers that come due meanwhile wait for the next iteration, as they would)
        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if not handle._cancelled:
                handle._run()

    def _write_to_self(self) -> None:
        pass  # call_soon_threadsafe's wake-up: there is no other thread, and the loop never sleeps for real

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        if executor is None:
            executor = self.default_executor
        if not isinstance(executor, SimExecutor):
            raise RuntimeError(f"the simulation runs no threads: {executor!r} is not a SimExecutor")
        return asyncio.wrap_future(executor.submit(func, *args), loop=self)

    def set_default_executor(self, executor: Any) -> None:
        raise RuntimeError("the simulation runs no threads")

    async def shutdown_default_executor(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Job:
    """A job on a model thread: its outcome (known at once), its CPU time ``left`` to run, and the timer of its end."""

    __slots__ = ("error", "fut", "handle", "left", "result")

    def __init__(self, fut: concurrent.futures.Future[Any], result: Any, error: BaseException | None, left: float):
        self.fut, self.result, self.error, self.left = fut, result, error, left
        self.handle: asyncio.TimerHandle | None = None


class SimExecutor(concurrent.futures.Executor):
    """``workers`` model threads on the loop's virtual clock (module docstring). ``cost()`` is asked, right after
    each job ran, for the CPU seconds it takes; ``on_submit`` is called on every submission (the loop's own CPU for
    handing a job over, say). The jobs running share the loop's ``cores`` with it (the module's docstring)."""

    def __init__(self, loop: SimLoop, workers: int = 1) -> None:
        self._loop = loop
        self._idle = workers
        self._queue: deque[tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self.running: list[_Job] = []  # the jobs with CPU time left, in the order they started
        self._last = 0.0  # when the jobs' ``left`` was last brought up to date
        self.cost: Callable[[], float] = lambda: 0.0
        self.on_submit: Callable[[], None] = lambda: None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        call = (lambda: fn(*args, **kwargs)) if kwargs else fn
        self._queue.append((fut, call, () if kwargs else args))
        self.on_submit()
        self._start()
        return fut

    @property
    def contended(self) -> bool:
        """The loop at work would slow the jobs running, and they the loop: more threads than cores, or the lock."""
        return bool(self.running) and self.rate(len(self.running), loop=True) < 1.0

    def _start(self) -> None:
        loop = self._loop
        while self._idle and self._queue:
            fut, fn, args = self._queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            self._idle -= 1
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # the job's outcome, delivered when its time is up
                result, error = None, exc
            self._sync(loop.now)
            self.running.append(_Job(fut, result, error, self.cost()))
            self._project(loop.now)

    def rate(self, jobs: int, loop: bool) -> float:
        """The share of a processor each runnable thread gets while ``jobs`` jobs run, and the loop works or not:
        the cores shared alike, and the interpreter's lock, which the loop holds whenever it runs and each job for
        the share ``gil`` of its time (the module's docstring)."""
        locked = loop + self._loop.gil * jobs
        return min(1.0, self._loop.cores / (jobs + loop), 1.0 / locked if locked > 0 else 1.0)

    def _sync(self, now: float) -> None:
        """Bring the jobs' CPU left up to ``now``, the loop idle since the last time (the loop's work brings them up
        to date as it goes, :meth:`share`)."""
        elapsed, self._last = now - self._last, now
        running = self.running
        while elapsed > 0 and running:
            rate = self.rate(len(running), loop=False)
            least = min(job.left for job in running)
            if least > elapsed * rate + EPSILON:
                for job in running:
                    job.left -= elapsed * rate
                return
            elapsed -= least / rate
            self._advance(least)
            running = self.running

    def _advance(self, cpu: float) -> None:
        """Every running job got ``cpu`` seconds of a processor: those done leave the running ones."""
        for job in self.running:
            job.left -= cpu
        if any(job.left <= EPSILON for job in self.running):
            self.running = [job for job in self.running if job.left > EPSILON]

    def share(self, now: float, seconds: float) -> float:
        """The loop begins ``seconds`` of CPU at ``now`` beside the jobs running: when it is done (it and they get
        an equal share, :meth:`rate`). The jobs' ends move by the CPU the loop took meanwhile: their
        timers, set for the earliest they could end (:meth:`_project`), find them running and are set again."""
        self._sync(now)
        running = self.running
        while seconds > 0 and running:
            rate = self.rate(len(running), loop=True)
            least = min(job.left for job in running)
            if seconds <= least:
                now += seconds / rate
                for job in running:
                    job.left -= seconds
                seconds = 0.0
                break
            now += least / rate
            seconds -= least
            self._advance(least)  # (a job that ended: its timer, due by now, fires once the loop is done)
            running = self.running
        now += seconds  # (alone once every job has ended)
        self._last = now
        return now

    def _project(self, now: float) -> None:
        """Set each running job's timer for its end if the loop stays idle from ``now`` (the jobs sharing the cores
        among themselves): the earliest it can end, since more work (the loop's, another job's) only delays it."""
        t, done = now, 0.0
        running = sorted(self.running, key=lambda job: job.left) if len(self.running) > 1 else self.running
        for i, job in enumerate(running):
            t += (job.left - done) / self.rate(len(running) - i, loop=False)
            done = job.left
            self._at(job, t)

    def _at(self, job: _Job, when: float) -> None:
        handle = job.handle
        if handle is not None:
            if handle.when() == when or not handle._scheduled:  # type: ignore[attr-defined]
                return  # (not scheduled: its time came, it is among the callbacks ready to run)
            handle.cancel()
        job.handle = self._loop.at(when, self._finish, job)

    def _finish(self, job: _Job) -> None:
        now = self._loop.now
        self._sync(now)
        if job in self.running:  # the loop's work delayed it: its end is later
            job.handle = None
            self._project(now)
            return
        self._idle += 1
        if job.error is None:
            job.fut.set_result(job.result)
        else:
            job.fut.set_exception(job.error)
        self._start()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            while self._queue:
                self._queue.popleft()[0].cancel()
