"""docs/snippets/aws_batchers.py, the AWS guide's example, run as a user would, against DynamoDB Local and moto.

The snippet names no endpoint: botocore takes it from AWS_ENDPOINT_URL_DYNAMODB and AWS_ENDPOINT_URL_SQS, as it
would take real AWS from the usual chain. Uses only the fixtures' endpoint URLs and the credentials they set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = ROOT / "docs" / "snippets" / "aws_batchers.py"


def test_the_guides_example_writes_reads_and_sends(dynamodb_local: Any, moto_server: Any) -> None:
    table, queue = f"orders-{uuid.uuid4().hex[:8]}", f"orders-{uuid.uuid4().hex[:8]}"
    dynamodb = boto3.client("dynamodb", endpoint_url=dynamodb_local.endpoint_url)
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    sqs = boto3.client("sqs", endpoint_url=moto_server.endpoint_url)
    queue_url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_local.endpoint_url,
        "AWS_ENDPOINT_URL_SQS": moto_server.endpoint_url,
    }
    done = subprocess.run(
        [sys.executable, str(SNIPPET), table, queue_url], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[None, {'n': Decimal('1'), 'pk': 'o1'}, {'n': Decimal('2'), 'pk': 'o2'}]",
        "25 messages sent",
    ]
    keys = {item["pk"]["S"] for item in dynamodb.scan(TableName=table)["Items"]}
    assert keys == {f"o{i}" for i in range(1, 100)}
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    assert attributes["Attributes"]["ApproximateNumberOfMessages"] == "25"
