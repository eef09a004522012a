"""The AWS SDK, imported in one place so that a missing ``[aws]`` extra says which extra to install."""

from __future__ import annotations

try:
    import aioboto3 as aioboto3
    from aiobotocore.config import AioConfig as AioConfig
    from boto3.dynamodb.types import TypeDeserializer as TypeDeserializer
    from boto3.dynamodb.types import TypeSerializer as TypeSerializer
except ImportError as error:  # pragma: no cover - exercised in a subprocess by tests/aws/test_packaging.py
    raise ImportError(
        f"async_batcher.aws needs aioboto3 ({error.name} is missing): pip install 'async-batcher[aws]'"
    ) from error
