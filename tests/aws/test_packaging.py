"""The AWS integration stays optional, and the local-server runners behave."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tools.aws import DynamoDBLocal, MotoServer
from tools.servers import LocalServer


@pytest.mark.parametrize(
    "module", ["async_batcher", "async_batcher.aws", "async_batcher.aws.retry", "async_batcher.aws._chunking"]
)
def test_importing_does_not_import_the_aws_sdk(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in ('aioboto3', 'aiobotocore', 'boto3') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("module", [f"async_batcher.aws.{name}" for name in ("dynamodb", "sqs", "sns", "kinesis")])
def test_a_missing_sdk_names_the_extra(module: str) -> None:
    # sys.modules[name] = None makes `import name` raise ImportError, as an environment without it would.
    code = f"import sys; sys.modules['aioboto3'] = None; import {module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "ImportError: async_batcher.aws needs aioboto3" in done.stderr
    assert "pip install 'async-batcher[aws]'" in done.stderr


def test_each_package_re_exports_its_public_classes() -> None:
    from async_batcher.aws.dynamodb import AsyncDynamoDbGetBatcher, AsyncDynamoDbWriteBatcher, GetItem, WriteOperation
    from async_batcher.aws.dynamodb.get import AsyncDynamoDbGetBatcher as Get
    from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher as Write
    from async_batcher.aws.kinesis import AsyncKinesisPutBatcher, KinesisRecord
    from async_batcher.aws.sns import AsyncSnsPublishBatcher, SnsMessage
    from async_batcher.aws.sqs import AsyncSqsSendBatcher, SqsMessage

    assert (AsyncDynamoDbGetBatcher, AsyncDynamoDbWriteBatcher) == (Get, Write)
    assert all(
        isinstance(cls, type)
        for cls in (GetItem, WriteOperation, AsyncKinesisPutBatcher, KinesisRecord, AsyncSnsPublishBatcher,
                    SnsMessage, AsyncSqsSendBatcher, SqsMessage)
    )  # fmt: skip


@pytest.mark.parametrize("module", ["_chunking", "_delivery", "_entries", "_sdk", "_targeted", "dynamodb._keys"])
def test_private_modules_export_nothing(module: str) -> None:
    assert not hasattr(importlib.import_module(f"async_batcher.aws.{module}"), "__all__")


def test_the_test_tools_are_not_in_the_package() -> None:
    assert importlib.util.find_spec("async_batcher.aws.testing") is None


def test_the_0_2_2_import_paths_work() -> None:
    from async_batcher.aws.dynamodb.get import AsyncDynamoDbGetBatcher, GetItem
    from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher, WriteOperation

    assert AsyncDynamoDbWriteBatcher().max_batch_size == 25
    assert AsyncDynamoDbGetBatcher().max_batch_size == 100
    assert WriteOperation(operation="PUT", table_name="t", data={"pk": 1}).data == {"pk": 1}
    assert GetItem(table_name="t", key={"pk": 1}).key == {"pk": 1}


def test_0_2_2_constructor_keywords_are_accepted() -> None:
    from async_batcher.aws.dynamodb.write import AsyncDynamoDbWriteBatcher

    batcher = AsyncDynamoDbWriteBatcher(
        region_name="eu-west-1",
        use_ssl=False,
        verify=False,
        endpoint_url="http://127.0.0.1:1",
        config=None,
        aioboto3_session=None,
        max_batch_size=10,
        max_queue_time=0.5,
        concurrency=2,
        max_queue_size=100,
    )
    assert (batcher.region_name, batcher.endpoint_url, batcher.max_batch_size, batcher.concurrency) == (
        "eu-west-1",
        "http://127.0.0.1:1",
        10,
        2,
    )
    with pytest.raises(TypeError, match="retry must be a RetryPolicy"):
        AsyncDynamoDbWriteBatcher(retry=3)


def test_a_stopped_server_no_longer_answers(moto_server: MotoServer) -> None:
    server = MotoServer().start()
    port = server.port
    assert port is not None and port != moto_server.port
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    server.stop()
    server.stop()  # idempotent
    assert not LocalServer._answers(port)
    with pytest.raises(RuntimeError, match="is not started"):
        _ = server.endpoint_url


def test_a_relative_install_dir_is_made_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server runs in a scratch working directory, where a relative jar path would not resolve.
    monkeypatch.setenv("DYNAMODB_LOCAL_DIR", ".cache/dynamodb-local")
    assert DynamoDBLocal().install_dir == (Path.cwd() / ".cache" / "dynamodb-local").resolve()
    assert DynamoDBLocal(Path("relative")).install_dir.is_absolute()


def test_a_missing_jar_is_reported_clearly(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"no DynamoDB Local in .*install-dynamodb-local"):
        DynamoDBLocal(tmp_path, install=False).start()
