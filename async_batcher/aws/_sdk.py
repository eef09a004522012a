"""The AWS SDK, imported in one place so that a missing ``[aws]`` extra says which extra to install."""

from __future__ import annotations

try:
    import aioboto3 as aioboto3
    from aiobotocore.config import AioConfig as AioConfig
    from aiohttp import ClientConnectorError as ClientConnectorError
    from boto3.dynamodb.types import TypeDeserializer as TypeDeserializer
    from boto3.dynamodb.types import TypeSerializer as TypeSerializer
    from botocore.exceptions import ConnectTimeoutError as ConnectTimeoutError
    from botocore.exceptions import EndpointConnectionError as EndpointConnectionError
    from botocore.exceptions import ProxyConnectionError as ProxyConnectionError
    from botocore.exceptions import SSLError as SSLError
except ImportError as error:  # pragma: no cover - exercised in a subprocess by tests/aws/test_packaging.py
    raise ImportError(
        f"async_batcher.aws needs aioboto3 ({error.name} is missing): pip install 'async-batcher[aws]'"
    ) from error
