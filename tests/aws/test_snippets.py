"""The AWS snippets of the documentation run as written, against DynamoDB Local and moto's server (botocore takes
their endpoints from ``AWS_ENDPOINT_URL_<SERVICE>``, so the snippets carry no test-only setting)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.snippets import run_snippet
from tools.aws import DynamoDBLocal, MotoServer


def endpoints(moto: MotoServer, dynamodb: DynamoDBLocal) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint_url,
        **{f"AWS_ENDPOINT_URL_{service}": moto.endpoint_url for service in ("SQS", "SNS", "KINESIS")},
    }


@pytest.mark.parametrize("name", ["aws_dynamodb", "aws_sqs", "aws_sns", "aws_kinesis", "aws_retries"])
def test_the_snippet_runs(name: str, tmp_path: Path, moto_server: MotoServer, dynamodb_local: DynamoDBLocal) -> None:
    # Each snippet checks what it did with an assert (an AssertionError fails the run) and prints a result.
    output = run_snippet(name, tmp_path, endpoints(moto_server, dynamodb_local))
    assert output.strip()
