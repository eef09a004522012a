"""Finding and ending the processes a test started, and only those: by process group, read from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time


def group_members(pgid: int) -> list[int]:
    """The ids of the live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    members.append(int(entry))
    return members


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    return found


def wait_group_gone(pgid: int, timeout: float) -> list[int]:
    """Wait (bounded) until group ``pgid`` has no live process; return those still there at the deadline."""
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_group(process: subprocess.Popen[bytes], *, grace: float = 30.0) -> list[int]:
    """End the process group that ``process`` leads (started with ``start_new_session=True``).

    SIGINT first (a graceful stop), then SIGKILL to whatever is left after ``grace`` seconds. Returns the
    processes that had to be killed: a graceful stop leaves none.
    """
    pgid = process.pid
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    left = wait_group_gone(pgid, 5.0 if process.poll() is not None else 0.0)
    if left or process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        process.wait(30)
        wait_group_gone(pgid, 30.0)
    return left


def descendants(pid: int) -> set[int]:
    """``pid``'s children, their children, and so on."""
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children(pending.pop()):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def with_environment(name: str, value: str) -> set[int]:
    """The live processes whose environment has ``name=value`` (inherited by every process they start)."""
    wanted = f"{name}={value}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if wanted in f.read().split(b"\0"):
                        found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
