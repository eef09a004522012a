"""A local server in a subprocess for tests, examples and benchmarks: started on a free port of 127.0.0.1, with a
bounded wait for its first answer, and stopped (or killed, to test a server that dies) by its owner.

Each runs as a separate process so that it can be killed mid-run and does not share the client's GIL. Not part of
the library: the wheel ships ``async_batcher`` only.
"""

from __future__ import annotations

import http.client
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from typing import IO, Any, Self

__all__ = ["LocalServer", "free_port"]

logger = logging.getLogger("tools.servers")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalServer:
    """A server subprocess on 127.0.0.1 (by default one that answers HTTP); a context manager that starts and
    stops it. The server runs in a session of its own, so :meth:`kill` takes its child processes with it."""

    name = "server"
    start_timeout = 60.0
    stop_signal = signal.SIGTERM

    def __init__(self) -> None:
        self.port: int | None = None
        self.last_port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    def command(self, port: int) -> list[str]:
        """The command line that runs the server on ``port``."""
        raise NotImplementedError

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.name} is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def popen_options(self) -> dict[str, Any]:
        """Extra ``subprocess.Popen`` arguments (another user, an environment)."""
        return {}

    def ready(self, port: int) -> bool:
        """Whether the server is ready: by default, whether it answers an HTTP request."""
        return self._answers(port)

    def start(self, port: int | None = None) -> Self:
        """Start on ``port`` (a free one if None) and wait (at most ``start_timeout`` s) until :meth:`ready`."""
        if self._process is not None:
            raise RuntimeError(f"{self.name} is already started")
        if port is not None:
            self._launch(port)
            return self
        # The port is free when probed but may be taken before the server binds it: try a few.
        last_error: Exception | None = None
        for _ in range(3):
            try:
                self._launch(free_port())
                return self
            except _BindFailed as error:
                last_error = error
        raise RuntimeError(f"{self.name} did not start: {last_error}")

    def _launch(self, port: int) -> None:
        self._log = tempfile.TemporaryFile()  # closed in _cleanup()
        # A scratch working directory: DynamoDB Local writes a metadata file into its working directory.
        self._workdir = tempfile.TemporaryDirectory(prefix="async-batcher-server-")
        self._process = subprocess.Popen(
            self.command(port),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self._workdir.name,
            start_new_session=True,
            **self.popen_options(),
        )
        self.port = self.last_port = port
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._process.poll() is not None:
                output = f"exited with {self._process.returncode}: {self._output()}"
                self._cleanup()
                if "in use" in output.lower():
                    raise _BindFailed(output)
                raise RuntimeError(f"{self.name} did not start: {output}")
            if self.ready(port):
                logger.info("%s listening on 127.0.0.1:%d (pid %d)", self.name, port, self._process.pid)
                return
            if time.monotonic() > deadline:
                output = self._output()
                self.stop()
                raise RuntimeError(f"{self.name} gave no HTTP answer within {self.start_timeout} s: {output}")
            time.sleep(0.1)  # polling a subprocess's health: the one place a wait loop is right

    @staticmethod
    def _answers(port: int) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            connection.request("GET", "/")
            connection.getresponse().read()
            return True
        except OSError:
            return False
        finally:
            connection.close()

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read()[-2000:].decode(errors="replace")

    def stop(self) -> None:
        """Stop the server (``stop_signal``, then SIGKILL to its whole session after 10 s); idempotent."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(self.stop_signal)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill_session(process)
        self._cleanup()

    def kill(self) -> None:
        """Kill the server and its child processes at once (SIGKILL), as a crash would; idempotent."""
        process = self._process
        if process is not None and process.poll() is None:
            self._kill_session(process)
        self._cleanup()

    @staticmethod
    def _kill_session(process: subprocess.Popen[bytes]) -> None:
        # The server leads its own session (start_new_session): its process group is its and its children's.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def _cleanup(self) -> None:
        self._process = None
        self.port = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _BindFailed(RuntimeError):
    pass
