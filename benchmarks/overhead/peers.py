"""Where each implementation runs: ours, the floor and the direct call in this interpreter; each published
peer in a virtual environment of its own under ``.cache/peers/<name>/``, installed from PyPI at a pinned
version.

A peer's environment is built once and reused; a stamp file records what was installed, so changing a pin
rebuilds it. uvloop and pyperf go into every environment at the versions this interpreter has, so that every
implementation runs on the same event loop build and is measured by the same pyperf.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["LOCAL_IMPLS", "PEERS", "Peer", "interpreters"]

logger = logging.getLogger("async_batcher.bench.overhead")

# What runs in this interpreter: ours, the direct call and the floors (benchmarks/overhead/floors.py).
LOCAL_IMPLS = ("direct", "floor", "ours", "floor-async", "floor-task")


@dataclass(frozen=True)
class Peer:
    name: str  # the implementation name the worker knows
    requirement: str  # what pip installs, pinned
    note: str  # how it is wired, for the report


PEERS = (
    Peer(
        "async-batcher-0.2.2",
        "async-batcher==0.2.2",
        "`AsyncBatcher` subclass (its README), max_batch_size=256, max_queue_time=0.001, started by its first "
        "`process()`; no bulk path",
    ),
    Peer(
        "batched",
        "batched==0.1.5",
        "`@batched.aio.dynamically(batch_size=256, timeout_ms=1.0)`; bulk: `await fn(list)`",
    ),
    Peer(
        "aiodataloader",
        "aiodataloader==0.4.3",
        "`DataLoader` subclass with `batch_load_fn` (its README), max_batch_size=256, cache=False; it batches "
        "what arrives in one loop iteration (no timer); bulk: `load_many`",
    ),
)


def _python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _ensure_env(root: Path, peer: Peer) -> Path:
    """Create or reuse the peer's environment; raises CalledProcessError when pip fails (no network)."""
    env = root / peer.name
    wanted = [peer.requirement, f"pyperf=={metadata.version('pyperf')}"]
    try:
        wanted.append(f"uvloop=={metadata.version('uvloop')}")
    except metadata.PackageNotFoundError:
        pass  # no uvloop here: the harness will not run the uvloop column either
    stamp = env / ".installed"
    if stamp.is_file() and stamp.read_text() == "\n".join(wanted) and _python(env).is_file():
        return _python(env)
    if env.exists():
        shutil.rmtree(env)
    logger.info("creating %s with %s", env, " ".join(wanted))
    venv.create(env, with_pip=True, clear=True)
    cmd = [str(_python(env)), "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    stamp.write_text("\n".join(wanted))
    return _python(env)


def interpreters(impls: list[str], root: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The interpreter for each implementation that can run, and why each other one cannot."""
    found: dict[str, Path] = {}
    missing: dict[str, str] = {}
    by_name = {p.name: p for p in PEERS}
    for name in impls:
        if name in LOCAL_IMPLS:
            found[name] = Path(sys.executable)
            continue
        if name not in by_name:
            missing[name] = "unknown implementation"
            continue
        try:
            found[name] = _ensure_env(root, by_name[name])
        except (OSError, subprocess.CalledProcessError) as exc:
            missing[name] = f"could not install {by_name[name].requirement}: {exc}"
    return found, missing
