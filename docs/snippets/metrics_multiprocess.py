"""Two uvicorn workers, one ``/metrics`` for both: prometheus_client multiprocess mode.

``python docs/snippets/metrics_multiprocess.py`` runs the demo: it empties a metrics
directory, starts ``uvicorn --workers 2`` on this file's ``app`` with
``PROMETHEUS_MULTIPROC_DIR`` pointing at it, sends 200 requests to 127.0.0.1, prints
what one scrape of ``/metrics`` says about both workers' batches, and stops the server.
In a real service the launcher (the container's entrypoint) sets the variable and
empties the folder.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from async_batcher import AsyncBatcher
from async_batcher.metrics_multiprocess import (
    MultiprocessExporter,
    make_metrics_app,
    prepare_directory,
)


class Doubler(AsyncBatcher[int, int]):
    async def process_batch(self, batch: list[int]) -> list[int]:
        return [2 * x for x in batch]


# One batcher per worker process: each worker imports this module on its own.
batcher = Doubler(name="doubler", max_batch_size=16, max_queue_time=0.005)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # Entered once the batcher exists, left after it stopped: the final counts get
    # written.
    async with MultiprocessExporter(batcher):
        try:
            yield
        finally:
            await batcher.stop()


async def double(request: Request) -> JSONResponse:
    x = int(request.path_params["x"])
    return JSONResponse({"result": await batcher.process(x), "pid": os.getpid()})


def create_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/double/{x:int}", double),
            # Every worker's files, added up: whichever worker answers the scrape.
            Mount("/metrics", app=make_metrics_app()),
        ],
        lifespan=lifespan,
    )


def __getattr__(name: str) -> Starlette:
    # uvicorn's "metrics_multiprocess:app": built on first use, in a worker that has
    # PROMETHEUS_MULTIPROC_DIR.
    if name == "app":
        return create_app()
    raise AttributeError(name)


def _get(url: str) -> bytes:
    # A new connection each time: either worker may answer.
    request = urllib.request.Request(url, headers={"Connection": "close"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
        return body


def demo() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as directory:
        prepare_directory(directory)
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        here = str(Path(__file__).parent)
        command = [sys.executable, "-m", "uvicorn", "--app-dir", here]
        command += ["metrics_multiprocess:app", "--workers", "2", "--port", str(port)]
        command += ["--log-level", "warning"]
        server = subprocess.Popen(command, env=env)
        try:
            deadline = time.monotonic() + 60
            # Each worker writes its gauge file once it is up.
            while len(list(Path(directory).glob("gauge_livesum_*.db"))) < 2:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the two workers did not start")
                time.sleep(0.1)
            with ThreadPoolExecutor(16) as pool:
                answers = pool.map(lambda x: _get(f"{url}/double/{x}"), range(200))
                pids = {answer.split(b'"pid":')[1] for answer in answers}
            lines = _get(url + "/metrics/").decode().splitlines()
            print(f"{len(pids)} workers answered; one scrape says:")
            prefix = "async_batcher_batch_size_"
            print("\n".join(line for line in lines if line.startswith(prefix)))
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    demo()
