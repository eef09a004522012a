"""The AWS snippets of the documentation run as written, against DynamoDB Local and moto's server (botocore takes
their endpoints from ``AWS_ENDPOINT_URL_<SERVICE>``, so the snippets carry no test-only setting); what they wrote
is read back."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from tests.snippets import run_snippet
from tools.aws import DynamoDBLocal, MotoServer
from tools.servers import LocalServer

# The region the snippets name: local servers keep one set of tables, queues and streams per region.
REGION = "eu-west-1"


def endpoints(moto: MotoServer, dynamodb: LocalServer) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint_url,
        **{f"AWS_ENDPOINT_URL_{service}": moto.endpoint_url for service in ("SQS", "SNS", "KINESIS")},
    }


@pytest.mark.parametrize(
    "path",
    [
        "docs/snippets/aws_sns.py",
        "docs/snippets/aws_kinesis.py",
        "docs/snippets/aws_retries.py",
        "docs/snippets/aws_unknown.py",  # it checks by receiving: each order exactly once
    ],
)
def test_the_snippet_runs(path: str, tmp_path: Path, moto_server: MotoServer) -> None:
    # Each snippet checks what it did with an assert (an AssertionError fails the run) and prints a result. None
    # of these uses DynamoDB: moto's server answers for it too.
    output = run_snippet(path, tmp_path, endpoints(moto_server, moto_server))
    assert output.strip()


def test_the_dynamodb_snippet_leaves_its_writes_in_the_table(
    tmp_path: Path, moto_server: MotoServer, dynamodb_local: DynamoDBLocal
) -> None:
    output = run_snippet("docs/snippets/aws_dynamodb.py", tmp_path, endpoints(moto_server, dynamodb_local))
    assert output.splitlines() == ["{'n': Decimal('1'), 'pk': 'order-1'} None"]
    client = boto3.client("dynamodb", region_name=REGION, endpoint_url=dynamodb_local.endpoint_url)
    pages = client.get_paginator("scan").paginate(TableName="async-batcher-orders")
    keys = {item["pk"]["S"] for page in pages for item in page["Items"]}
    assert keys == {f"order-{i}" for i in range(99)}  # 100 puts, then order-99 deleted


def test_the_sqs_snippet_sends_every_message_once(tmp_path: Path, moto_server: MotoServer) -> None:
    client = boto3.client("sqs", region_name=REGION, endpoint_url=moto_server.endpoint_url)
    assert run_snippet("docs/snippets/aws_sqs.py", tmp_path, endpoints(moto_server, moto_server)).splitlines() == [
        "25 messages sent"
    ]
    queue_url = client.get_queue_url(QueueName="async-batcher-example")["QueueUrl"]
    bodies: list[str] = []
    while messages := client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        bodies += [message["Body"] for message in messages]
        client.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
        )
    assert sorted(bodies) == sorted(f"hello {i}" for i in range(25))
