"""The variants' servers: started together, each in its own interpreter on 127.0.0.1, checked healthy, stopped at the
end; and the check, before any load, that they all give the same predictions."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers.load import get_json
from benchmarks.run import _free_port

__all__ = ["ROOT", "Server", "Variant", "agreement", "running", "train_model"]

ROOT = Path(__file__).resolve().parents[2]
SERVE = Path(__file__).with_name("serve.py")
HEALTH_TIMEOUT = 600.0  # several servers importing TensorFlow at once on 2 cores
# Relative difference two variants' predictions may show: float32 round-off of the same model on batches of
# different sizes (the predictions are in the tens to hundreds).
RTOL = 1e-5


@dataclass(frozen=True)
class Variant:
    name: str  # as the report shows it
    kind: str  # its app module (serve.MODULES)
    settings: dict[str, Any]
    python: Path


@dataclass(frozen=True)
class Server:
    url: str
    pid: int  # also its process group's: each server starts a session of its own

    def pause(self) -> None:
        """Stop the server and its child processes (SIGSTOP to its group), so that an idle server's own timers and
        polling threads take no CPU from the one under load (fast-dynamic-batcher polls every millisecond)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGCONT)


def train_model() -> None:
    """Train and cache the example model once, here, before the servers all load it."""
    code = "from benchmarks.keras import model\nmodel.configure_threads(1, 1)\nmodel.load_or_train()"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown: the lifespan stops the batcher
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def running(variants: list[Variant], log_dir: Path, taskset: str | None) -> Iterator[dict[str, Server]]:
    """Start every variant's server, wait until all are healthy; stop them all on the way out."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: dict[str, tuple[subprocess.Popen[bytes], Server]] = {}
    try:
        for v in variants:
            port = _free_port()
            cmd = [str(v.python), "-I", str(SERVE), "--variant", v.kind, "--port", str(port)]
            cmd += ["--settings", json.dumps(v.settings)]
            if taskset:
                cmd = ["taskset", "-c", taskset, *cmd]
            with open(log_dir / f"{v.name}.log", "wb") as log:
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            procs[v.name] = (proc, Server(f"http://127.0.0.1:{port}", proc.pid))
        deadline = time.monotonic() + HEALTH_TIMEOUT
        waiting = set(procs)
        while waiting:
            for name in sorted(waiting):
                proc, server = procs[name]
                if proc.poll() is not None:
                    raise RuntimeError(f"{name}'s server exited with {proc.returncode}; its log: {log_dir / name}.log")
                with contextlib.suppress(OSError, ValueError):
                    if get_json(f"{server.url}/healthz", timeout=2).get("status") == "ok":
                        waiting.discard(name)
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"not healthy after {HEALTH_TIMEOUT:.0f} s: {sorted(waiting)}; logs in {log_dir}")
            time.sleep(0.5)
        yield {name: server for name, (_, server) in procs.items()}
    finally:
        for proc, server in procs.values():
            server.resume()  # a stopped process would not see the SIGINT
            _stop(proc)


def _post(url: str, features: list[float]) -> float:
    request = urllib.request.Request(
        f"{url}/predict", data=json.dumps(features).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return float(json.load(response))


def agreement(servers: dict[str, Server], names: list[str], n: int = 64) -> tuple[list[str], str]:
    """Send the same ``n`` rows of the data set to every server, many at once (so that batches form); raise unless
    all agree with the first variant's answers to ``RTOL``. Returns the report's lines and a body for the load."""
    from benchmarks.keras.model import sample_inputs

    rows = [[float(v) for v in row] for row in sample_inputs(n)]
    answers: dict[str, list[float]] = {}
    with ThreadPoolExecutor(32) as pool:
        for name in names:
            url = servers[name].url
            answers[name] = list(pool.map(lambda row: _post(url, row), rows))  # noqa: B023  # used at once
    ref_name = names[0]
    ref = answers[ref_name]
    lines = [f"{n} rows of the data set, sent 32 at a time to every server; reference: {ref_name}.", ""]
    lines += ["| variant | max abs difference | max relative difference |", "|---|---:|---:|"]
    bad = []
    for name in names:
        diffs = [abs(a - b) for a, b in zip(answers[name], ref, strict=True)]
        rel = max(d / max(abs(b), 1e-12) for d, b in zip(diffs, ref, strict=True))
        lines.append(f"| {name} | {max(diffs):.2e} | {rel:.2e} |")
        if rel > RTOL:
            bad.append(f"{name} (relative difference {rel:.2e})")
    if bad:
        raise RuntimeError(f"predictions differ from {ref_name}'s beyond {RTOL:g}: {', '.join(bad)}")
    lines += ["", f"All agree within a relative {RTOL:g} (float32 round-off)."]
    return lines, json.dumps(rows[0])
