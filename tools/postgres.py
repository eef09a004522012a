"""A throwaway PostgreSQL cluster for tests, examples and benchmarks: ``initdb`` in a temporary directory, the
server on a free port of 127.0.0.1 (no Unix socket), trust authentication for the ``postgres`` user.

PostgreSQL refuses to run as root: when this process is root, the cluster belongs to, and the server runs as, the
``postgres`` system user (the Debian package creates it), or ``nobody``. The binaries are looked up in
``$PG_BIN``, then in ``/usr/lib/postgresql/<version>/bin`` (newest first), then on the ``PATH``.

The cluster outlives a :meth:`PostgresServer.kill` (a crash): :meth:`PostgresServer.start` again recovers it,
as after a power cut, and serves the rows that were committed. :meth:`PostgresServer.close` (or leaving the
``with`` block) stops the server and deletes the cluster.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from tools.servers import LocalServer

__all__ = ["PostgresServer", "postgres_bin"]


def postgres_bin() -> Path:
    """The directory of PostgreSQL's server binaries (``initdb``, ``postgres``, ``pg_isready``)."""
    candidates = [Path(os.environ["PG_BIN"])] if os.environ.get("PG_BIN") else []
    installed = Path("/usr/lib/postgresql")
    if installed.is_dir():
        versions = sorted(installed.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0, reverse=True)
        candidates += [version / "bin" for version in versions]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "postgres").exists():
            return candidate
    raise RuntimeError("PostgreSQL's server binaries were not found: install postgresql or set PG_BIN")


def _run_as() -> str | None:
    """The user to run PostgreSQL as: None (this one) unless this process is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root, and there is no postgres or nobody user to run PostgreSQL as")


class PostgresServer(LocalServer):
    """A throwaway cluster (see the module docstring); ``url`` is its SQLAlchemy asyncpg URL."""

    name = "PostgreSQL"
    start_timeout = 30.0
    stop_signal = signal.SIGINT  # "fast" shutdown: SIGTERM would wait for the clients to leave

    def __init__(self) -> None:
        super().__init__()
        self.bin = postgres_bin()
        self.user = _run_as()
        self.data_dir: Path | None = None

    def _init_cluster(self) -> Path:
        data_dir = Path(tempfile.mkdtemp(prefix="async-batcher-pg-"))
        if self.user is not None:
            shutil.chown(data_dir, user=self.user)
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(data_dir), "-U", "postgres", "-A", "trust", "-E", "UTF8",
             "--locale=C", "--no-sync"],
            check=True, capture_output=True, **self.popen_options(),
        )  # fmt: skip
        return data_dir

    def popen_options(self) -> dict[str, Any]:
        return {} if self.user is None else {"user": self.user}

    def command(self, port: int) -> list[str]:
        if self.data_dir is None:
            self.data_dir = self._init_cluster()
        return [
            str(self.bin / "postgres"), "-D", str(self.data_dir), "-p", str(port), "-h", "127.0.0.1", "-k", "",
            # A test cluster: no fsync (a killed server loses nothing the OS has; only an OS crash would).
            "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200",
        ]  # fmt: skip

    def ready(self, port: int) -> bool:
        done = subprocess.run(
            [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"], capture_output=True
        )
        return done.returncode == 0

    @property
    def url(self) -> str:
        """``postgresql+asyncpg://postgres@127.0.0.1:<port>/postgres``."""
        if self.port is None:
            raise RuntimeError(f"{self.name} is not started")
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def close(self) -> None:
        """Stop the server and delete the cluster; idempotent."""
        self.stop()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
