"""Real servers for the tests: an ASGI app under uvicorn in a thread, the benchmark's Keras server in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Bounded waits for a server to come up: the Keras server imports TensorFlow and may train its model first.
STARTUP_TIMEOUT = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadServer:
    """``app`` served by uvicorn on 127.0.0.1 in a thread of its own (with its own event loop)."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.server.started:  # uvicorn offers no start event: poll, bounded, for the start only
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    @property
    def state(self) -> dict[str, Any]:
        """The app's lifespan state (what its lifespan yielded), as uvicorn holds it."""
        state: dict[str, Any] = self.server.lifespan.state
        return state

    def begin_shutdown(self) -> None:
        """What SIGTERM does: stop accepting, answer the requests in flight, then run the lifespan's shutdown."""
        self.server.should_exit = True

    def join(self, timeout: float = 60.0) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError("the test server did not stop")


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


class KerasServer:
    """``python -m benchmarks.keras.server`` as a subprocess on a free port, with the given options.

    ``as_file``: run ``python <root>/benchmarks/keras/server.py`` from another folder instead, as a user may.
    """

    def __init__(self, *options: str, as_file: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="keras-server-", suffix=".log", delete=False)
        # Settings come from the command line only: no KERAS_SERVER_* of the developer's shell leaks in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_SERVER_")}
        program = [str(ROOT / "benchmarks" / "keras" / "server.py")] if as_file else ["-m", "benchmarks.keras.server"]
        command = [sys.executable, *program, "--port", str(self.port), *options]
        cwd = tempfile.gettempdir() if as_file else ROOT
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Keras server exited with {self.process.returncode}:\n{self.log_text()}")
            with contextlib.suppress(OSError, ValueError):
                if _get_json(self.url + "/healthz").get("status") == "ok":
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Keras server was not healthy in {STARTUP_TIMEOUT} s:\n{self.log_text()}")
            time.sleep(0.2)

    def stats(self) -> Any:
        return _get_json(self.url + "/stats")

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        os.unlink(self.log.name)


@contextlib.contextmanager
def keras_server(*options: str, as_file: bool = False) -> Iterator[KerasServer]:
    server = KerasServer(*options, as_file=as_file)
    try:
        yield server
    finally:
        server.stop()
