"""Start Ray on this machine, serve the example model with Ray Serve on 127.0.0.1, stop it all on a signal.

``python -m examples.ray_serve --port 8000 --replicas 2 [--batcher serve-batch]`` (``--help`` for the rest):
prints ``ready <url>`` once the app answers, serves until SIGINT or SIGTERM, then shuts Serve and Ray down and
exits. Ray keeps its files in a temporary folder of its own under /tmp (removed at the end), starts no
dashboard, sends no usage statistics and, with ``RAY_AUTH_MODE=disabled``, writes no token into your home: all
set here unless you set them yourself. ``serve run examples.ray_serve.deployment:app`` works too, with Ray's
own defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["RAY_ENV", "local_ray", "main", "replica_stats", "wait_ready"]

ROOT = Path(__file__).resolve().parents[2]

#: Read by Ray when it is imported or started: set before ``import ray``.
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",  # else a local cluster writes a token to ~/.ray/auth_token
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_SERVE_LOG_TO_STDERR": "0",  # the replicas' logs go to Ray's folder, not the terminal
}
READY_TIMEOUT = 300.0  # the replicas import TensorFlow and load the model (may train it first: seconds more)


@contextlib.contextmanager
def local_ray(*, num_cpus: int = 2, port: int = 8000, temp_dir: str | None = None) -> Iterator[str]:
    """A local Ray with Serve's HTTP proxy on 127.0.0.1:``port``; yields its URL; shuts both down on exit."""
    for name, value in RAY_ENV.items():
        os.environ.setdefault(name, value)
    import ray
    from ray import serve

    own_dir = temp_dir is None
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must be
    # The replicas import this repository (examples.*) wherever Ray starts them.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    try:
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            _temp_dir=temp_dir,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
        )
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            yield f"http://127.0.0.1:{port}"
        finally:
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
    finally:
        if own_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)


def wait_ready(url: str, timeout: float = READY_TIMEOUT) -> None:
    """Poll ``GET url/stats`` (bounded) until a replica answers."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/stats", timeout=5) as response:
                if response.status == 200:
                    return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no replica answered {url}/stats in {timeout:.0f} s")
        time.sleep(0.5)


def replica_stats(url: str, replicas: int | set[str]) -> dict[str, dict[str, Any]]:
    """Every replica's ``GET /stats``, by replica id, once ``replicas`` (a count, or the ids) have answered.

    Ray picks the replica: asked one request at a time, it may pick the same one again and again, so the
    requests go 8 at once (a replica busy with one gets the next), in at most 50 rounds.
    """

    def get(_: int) -> dict[str, Any]:
        with urllib.request.urlopen(url + "/stats", timeout=30) as response:
            stats: dict[str, Any] = json.load(response)
            return stats

    def enough(seen: dict[str, Any]) -> bool:
        return len(seen) >= replicas if isinstance(replicas, int) else replicas <= set(seen)

    seen: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(8) as pool:
        for _ in range(50):
            for stats in pool.map(get, range(8)):
                seen[stats["replica"]] = stats
            if enough(seen):
                return seen
    raise RuntimeError(f"/stats reached {sorted(seen)} only, not {replicas}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.ray_serve", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="Serve's HTTP port on 127.0.0.1")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--batcher", choices=["package", "serve-batch"], default="package")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-queue-time", type=float, default=0.005, help="seconds a batch waits for more")
    parser.add_argument("--max-queue-size", type=int, default=1024, help="this package only: 503 above")
    parser.add_argument("--hidden-layers", type=int, default=49)
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs Ray may schedule (the replicas take 0.5)")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def stop_on_signals() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())

    stop_on_signals()
    # Imported here: the model and Ray load only once the arguments are known good.
    from ray import serve

    from benchmarks.keras import model as example_model
    from examples.ray_serve.deployment import BatchSettings, build_app

    settings = BatchSettings(
        max_batch_size=args.max_batch_size,
        max_queue_time=args.max_queue_time,
        max_queue_size=args.max_queue_size,
        hidden_layers=args.hidden_layers,
    )
    # Train (or load) the model once here, so that the replicas do not all train it at once on first use.
    example_model.load_or_train(example_model.ModelSpec(hidden_layers=args.hidden_layers))
    with local_ray(num_cpus=args.num_cpus, port=args.port) as url:
        # ray.init put in a SIGTERM handler of its own, in C++, that ends the process on the spot (leaving Ray's
        # folder behind, and the app undrained): take the signals back.
        stop_on_signals()
        serve.run(build_app(args.batcher, replicas=args.replicas, settings=settings), name="model", route_prefix="/")
        wait_ready(url)
        print(f"ready {url}", flush=True)
        while not stop.wait(0.5):
            pass
        print("stopping", flush=True)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
