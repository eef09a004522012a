"""What the AWS batchers share: the aioboto3 client they open at start and close at stop, and the retry policy.

One client per batcher, not one per batch: opening a client builds its endpoint, credentials and HTTP
connection pool, which costs more than a small batch call. The client is opened in ``on_start`` (the first
batch waits for it) and closed in ``on_stop`` after the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, ClassVar, Final, TypeVar

from async_batcher.aws._delivery import Delivery, Outcomes, Splitter
from async_batcher.aws._sdk import AioConfig, aioboto3
from async_batcher.aws.retry import RetryPolicy
from async_batcher.batcher import AsyncBatcher

__all__ = ["BOTOCORE_RETRIES", "AwsBatcher", "client_config"]

logger = logging.getLogger("async_batcher.aws")

T = TypeVar("T")
R = TypeVar("R")
E = TypeVar("E")

BOTOCORE_RETRIES: Final[dict[str, Any]] = {"mode": "standard", "total_max_attempts": 2}
"""botocore's retries inside each call of a batcher whose ``config`` sets none: its ``standard`` mode (throttling,
5xx and connection errors, with a retry quota that stops retrying when most calls fail) and 2 attempts. The
batcher's :class:`RetryPolicy` (10 calls by default) comes on top, so one item costs at most 20 HTTP requests."""


def client_config(config: AioConfig | None) -> AioConfig:
    """``config`` (or a default one) with :data:`BOTOCORE_RETRIES` unless it sets ``retries`` itself."""
    default = AioConfig(retries=dict(BOTOCORE_RETRIES))
    if config is None:
        return default
    if config.retries is not None:
        return config
    # merge keeps config's own settings (its connector_args included) and adds the retries.
    merged: AioConfig = config.merge(default)
    return merged


class AwsBatcher(AsyncBatcher[T, R]):
    """An :class:`AsyncBatcher` with an aioboto3 client of ``service_name``.

    Args:
        region_name: The AWS region; the standard chain (``AWS_DEFAULT_REGION``, config files) if None.
        use_ssl: Whether to use TLS; botocore's default (yes) if None.
        verify: Whether to verify TLS certificates, or a CA bundle path; botocore's default if None.
        endpoint_url: The endpoint to use instead of AWS's, e.g. a local server.
        config: The botocore client configuration (``aiobotocore.config.AioConfig``); its ``retries`` govern
            botocore's own retries inside each call, beneath this batcher's (:data:`BOTOCORE_RETRIES` when it
            sets none).
        aioboto3_session: The session whose credentials the client uses; a new ``aioboto3.Session()`` (the
            standard credential chain) if None.
        retry: How this batcher retries throttling and partial results; ``RetryPolicy()`` if None.
        **kwargs: The :class:`AsyncBatcher` settings (``max_batch_size``, ``max_queue_time``, ``concurrency``,
            ``max_queue_size``, ``executor``, ``wait_when_full``, ``name``).
    """

    service_name: ClassVar[str]

    def __init__(
        self,
        *,
        region_name: str | None = None,
        use_ssl: bool | None = None,
        verify: bool | str | None = None,
        endpoint_url: str | None = None,
        config: AioConfig | None = None,
        aioboto3_session: aioboto3.Session | None = None,
        retry: RetryPolicy | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")
        self.region_name = region_name
        self.use_ssl = use_ssl
        self.verify = verify
        self.endpoint_url = endpoint_url
        self.config = config
        self.aioboto3_session = aioboto3_session if aioboto3_session is not None else aioboto3.Session()
        self.retry = retry if retry is not None else RetryPolicy()
        # Waits between attempts; replaceable so tests can observe them.
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._client: Any = None
        self._client_stack: contextlib.AsyncExitStack | None = None

    @property
    def client(self) -> Any:
        """The aioboto3 client, open between start and stop."""
        if self._client is None:
            raise RuntimeError(f"{self.name}: the {self.service_name} client is open only while the batcher runs")
        return self._client

    def _client_kwargs(self) -> dict[str, Any]:
        settings = {
            "region_name": self.region_name,
            "use_ssl": self.use_ssl,
            "verify": self.verify,
            "endpoint_url": self.endpoint_url,
            "config": client_config(self.config),
        }
        # None means "botocore's default": leave it out rather than pass None (use_ssl=None would mean http).
        return {name: value for name, value in settings.items() if value is not None}

    def _delivery(
        self,
        operation: str,
        send: Callable[[list[E]], Awaitable[Sequence[E]]],
        fail: Callable[[E, Exception], None],
        split: Splitter[E],
    ) -> Delivery[E]:
        return Delivery(send=send, fail=fail, policy=self.retry, operation=operation, split=split, sleep=self._sleep)

    async def _run_calls(
        self,
        delivery: Delivery[E],
        calls: Collection[Sequence[E]],
        outcomes: Outcomes[Any],
        *,
        in_order: bool = False,
    ) -> bool:
        """Deliver ``calls`` concurrently, or one after the other with ``in_order`` (a FIFO queue or topic, whose
        message groups keep their order only so). When the service gives no answer (connection refused,
        timeout, after botocore's retries), every item still without an outcome gets that error; returns False
        then."""
        if in_order:
            answers: list[BaseException | None] = []
            for call in calls:
                answers.append(await self._answer_of(delivery.run(call)))
                if answers[-1] is not None:
                    break
        else:
            answers = await asyncio.gather(*(delivery.run(call) for call in calls), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # cancellation: the core handles it
                logger.warning("%s: %s got no answer: %s", self.name, delivery.operation, type(answer).__name__)
                outcomes.fail_pending(answer)
        return not any(isinstance(answer, BaseException) for answer in answers)

    @staticmethod
    async def _answer_of(run: Awaitable[None]) -> Exception | None:
        try:
            await run
        except Exception as error:
            return error
        return None

    async def on_start(self) -> None:
        await self._close_client()
        stack = contextlib.AsyncExitStack()
        self._client = await stack.enter_async_context(
            self.aioboto3_session.client(self.service_name, **self._client_kwargs())
        )
        self._client_stack = stack
        logger.debug("%s: %s client opened (endpoint %s)", self.name, self.service_name, self.endpoint_url)

    async def on_stop(self) -> None:
        await self._close_client()

    async def _close_client(self) -> None:
        stack, self._client_stack, self._client = self._client_stack, None, None
        if stack is not None:
            await stack.aclose()
            logger.debug("%s: %s client closed", self.name, self.service_name)
