"""Is the machine quiet enough to time? Every other process's CPU over a short window, before a timing run.

A figure measured while other work shares the machine is that work's as much as the server's: the cost constants
measured on a loaded machine put the simulated server's capacity at half the real one's. :func:`require_quiet` reads
``/proc`` twice, ``window`` seconds apart, and refuses (``SystemExit``, saying what it saw) where the other processes
(every process but this one and its children) used more than ``limit`` % of one core together, or the hypervisor
gave this machine's cores to others (steal) more than ``steal_limit`` % of the time. Only where ``/proc`` exists
(Linux); elsewhere it says it cannot tell, and refuses unless told to go on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LIMIT", "STEAL_LIMIT", "WINDOW", "Quiet", "Snapshot", "check", "judge", "require_quiet", "snapshot"]

#: Seconds between the two readings.
WINDOW = 3.0
#: The other processes' CPU, all together, in % of one core, above which the machine is busy. The kernel's own
#: threads count (the writeback of another process's files takes CPU from the server as much as that process): on
#: the 2-core VM the limit was chosen on, they alone took 10-25 % of a core while other work was light, and a test
#: suite or another benchmark takes 50 % and more.
LIMIT = 25.0
#: The hypervisor's steal, in % of the machine's CPU time, above which the machine is busy.
STEAL_LIMIT = 5.0
PROC = Path("/proc")


@dataclass(frozen=True)
class Snapshot:
    """One reading of ``/proc``: each process's name and CPU ticks (user + system, all its threads), the parent of
    each process, and the machine's ``(busy, total)`` and ``(steal, total)`` ticks, all CPUs together."""

    at: float  # time.monotonic()
    ticks: dict[int, tuple[str, int]]
    parents: dict[int, int]
    machine: tuple[int, int] | None
    steal: tuple[int, int] | None


@dataclass(frozen=True)
class Quiet:
    """What a check saw: the other processes' CPU (% of one core), the busiest of them, the steal (% of the
    machine's CPU time), and whether that is quiet enough."""

    ok: bool
    others: float
    top: list[tuple[int, str, float]]  # (pid, name, % of one core), the busiest first
    steal: float | None
    window: float
    limit: float
    steal_limit: float

    def describe(self) -> str:
        top = ", ".join(f"{name} (pid {pid}) {pct:.1f} %" for pid, name, pct in self.top) or "none"
        steal = "n/a" if self.steal is None else f"{self.steal:.1f} %"
        return (
            f"over {self.window:.1f} s, the other processes used {self.others:.1f} % of one core (limit "
            f"{self.limit:g} %; the busiest: {top}); hypervisor steal {steal} (limit {self.steal_limit:g} %)"
        )

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "others_pct_of_core": round(self.others, 2), "steal_pct": self.steal,
                "window_s": self.window, "top": [list(t) for t in self.top]}  # fmt: skip


def _stat(path: Path) -> tuple[str, int, int] | None:
    """(name, parent pid, utime + stime ticks) of one ``/proc/PID/stat``; None if the process is gone."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The name is in parentheses and may hold spaces or parentheses: the fields after it follow the last ')'.
    head, _, rest = text.rpartition(")")
    name = head.partition("(")[2]
    fields = rest.split()
    try:
        return name, int(fields[1]), int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def snapshot(proc: Path = PROC) -> Snapshot:
    ticks: dict[int, tuple[str, int]] = {}
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(entry / "stat")
        if stat is not None:
            name, parent, cpu = stat
            ticks[int(entry.name)] = (name, cpu)
            parents[int(entry.name)] = parent
    machine = steal = None
    try:
        first = (proc / "stat").read_text(encoding="ascii").splitlines()[0].split()[1:]
        values = [int(v) for v in first]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        machine = (sum(values) - idle, sum(values))
        if len(values) > 7:
            steal = (values[7], sum(values))
    except (OSError, IndexError, ValueError):
        pass
    return Snapshot(time.monotonic(), ticks, parents, machine, steal)


def _descendants(root: int, parents: dict[int, int]) -> set[int]:
    out = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in out and pid not in out:
                out.add(pid)
                grew = True
    return out


def judge(
    before: Snapshot,
    after: Snapshot,
    *,
    me: int,
    hz: float,
    cpus: int,
    limit: float = LIMIT,
    steal_limit: float = STEAL_LIMIT,
    top: int = 5,
) -> Quiet:
    """The verdict on two readings: every process but ``me`` and its descendants (in either reading), the CPU it
    took between them (a process that began meanwhile: all its CPU), in % of one core at ``hz`` ticks a second; or,
    if more, the machine's busy time on its ``cpus`` less this process tree's (which counts the processes that came
    and went between the readings, and the kernel's own work)."""
    elapsed = after.at - before.at
    if elapsed <= 0:
        raise ValueError(f"the second reading must come after the first, {elapsed!r} s apart")
    mine = _descendants(me, before.parents) | _descendants(me, after.parents)
    used: list[tuple[int, str, float]] = []
    for pid, (name, cpu) in after.ticks.items():
        if pid in mine:
            continue
        old = before.ticks.get(pid)
        delta = cpu - (old[1] if old is not None and old[0] == name else 0)
        if delta > 0:
            used.append((pid, name, 100.0 * delta / hz / elapsed))
    used.sort(key=lambda t: -t[2])
    others = sum(t[2] for t in used)
    if before.machine is not None and after.machine is not None and after.machine[1] > before.machine[1]:
        busy = cpus * 100.0 * (after.machine[0] - before.machine[0]) / (after.machine[1] - before.machine[1])
        ours = sum(
            cpu - before.ticks.get(pid, ("", 0))[1] for pid, (_, cpu) in after.ticks.items() if pid in mine
        )  # fmt: skip
        others = max(others, busy - 100.0 * ours / hz / elapsed)
    steal = None
    if before.steal is not None and after.steal is not None and after.steal[1] > before.steal[1]:
        steal = 100.0 * (after.steal[0] - before.steal[0]) / (after.steal[1] - before.steal[1])
    ok = others <= limit and (steal is None or steal <= steal_limit)
    return Quiet(ok, others, [(p, n, round(v, 1)) for p, n, v in used[:top]], steal, elapsed, limit, steal_limit)


def check(window: float = WINDOW, limit: float = LIMIT, steal_limit: float = STEAL_LIMIT) -> Quiet | None:
    """Read ``/proc``, wait ``window`` seconds, read again, judge; None where there is no ``/proc``."""
    if not (PROC / "stat").exists():
        return None
    hz = float(os.sysconf("SC_CLK_TCK"))
    before = snapshot()
    time.sleep(window)
    cpus = os.cpu_count() or 1
    return judge(before, snapshot(), me=os.getpid(), hz=hz, cpus=cpus, limit=limit, steal_limit=steal_limit)


def require_quiet(what: str, *, allow_busy: bool, window: float = WINDOW, limit: float = LIMIT) -> Quiet | None:
    """Check the machine before ``what``; refuse a busy one (``SystemExit`` with what the check saw) unless
    ``allow_busy``, in which case say so and go on. Returns what it saw (None: no ``/proc``)."""
    seen = check(window, limit)
    if seen is None:
        message = f"{what}: cannot tell whether the machine is quiet (no /proc)"
        if not allow_busy:
            raise SystemExit(f"{message}; pass --allow-busy to go on anyway")
        print(f"{message}; going on (--allow-busy)", flush=True)
        return None
    if seen.ok:
        print(f"{what}: the machine is quiet: {seen.describe()}", flush=True)
        return seen
    message = f"{what}: the machine is busy: {seen.describe()}"
    if not allow_busy:
        raise SystemExit(
            f"{message}. Timings taken now would be the other work's as much as the server's: run this on a quiet "
            "machine (stop the other work), or pass --allow-busy to measure anyway (the figures then say so)."
        )
    print(f"{message}; measuring anyway (--allow-busy): the figures are a loaded machine's", flush=True)
    return seen
