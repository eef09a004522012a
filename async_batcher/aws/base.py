"""What the AWS batchers share: the aioboto3 client they open at start and close at stop, the retry policy, and
what the callers of a batch cut off by a stop get.

One client per batcher, not one per batch: opening a client builds its endpoint, credentials and HTTP
connection pool, which costs more than a small batch call. The client is opened in ``on_start`` (the first
batch waits for it) and closed in ``on_stop`` after the drain.

A stop that cuts a batch off (``stop(force=True)``, an expired ``stop(timeout=...)``) asks
:meth:`AwsBatcher.abandoned_error`, which reads the batch's :class:`~async_batcher.aws._delivery.Outcomes` as they
are at that moment: callers of a batch none of whose items can have been applied (nothing sent yet, or every call
so far answered "not applied", as a throttled call is) get the plain ``BatcherStoppedError``; otherwise every
caller gets an :class:`~async_batcher.aws.errors.AbandonedBatchError`, which knows each item's outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Final, TypeVar

from async_batcher.aws._delivery import Delivery, Outcomes, Splitter, answer_may_have_applied, record_attempt
from async_batcher.aws._sdk import (
    AioConfig,
    ClientConnectorError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ProxyConnectionError,
    SSLError,
    aioboto3,
)
from async_batcher.aws.errors import AwsOutcomeUnknownError
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


def never_sent(error: BaseException) -> bool:
    """Whether a transport error says the request never left: the connection could not be opened (refused, no
    route, DNS, TLS handshake, proxy, connect timeout). Anything else (a connection lost mid-call, a read
    timeout) may have come after the service received the request."""
    if isinstance(error, ConnectTimeoutError | ProxyConnectionError):
        return True
    if isinstance(error, EndpointConnectionError | SSLError):
        # aiobotocore raises EndpointConnectionError for any aiohttp connection error, a reset mid-call included;
        # only a connector error is the connection failing to open.
        return isinstance(error.kwargs.get("error"), ClientConnectorError | socket.gaierror)
    return False


def _on_response_received(event_name: str, exception: BaseException | None = None,
                          response_dict: dict[str, Any] | None = None, **_: Any) -> None:  # fmt: skip
    """botocore's report of one HTTP attempt: note whether it may have applied the call (see ``_delivery``)."""
    if exception is not None:
        verdict = not never_sent(exception)
    else:
        verdict = answer_may_have_applied((response_dict or {}).get("status_code"))
    record_attempt(event_name, verdict)


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
    has_effects: ClassVar[bool] = True
    """Whether the batcher writes or sends (False for reads: nothing it does can be applied twice)."""

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
        self._aws_retry = retry if retry is not None else RetryPolicy()
        # Waits between attempts; replaceable so tests can observe them.
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self._client: Any = None
        self._client_stack: contextlib.AsyncExitStack | None = None
        # The outcomes of each batch in process_batch, by id() of its list: what abandoned_error() reads.
        # (the list, its items as given, their outcomes): a process_batch that reorders or empties its list must not
        # change which item an outcome belongs to.
        self._batches: dict[int, tuple[list[Any], tuple[Any, ...], Outcomes[Any]]] = {}

    @property
    def retry(self) -> RetryPolicy:  # type: ignore[override]
        """How this batcher retries throttling and partial results within each batch: its own
        :class:`~async_batcher.aws.retry.RetryPolicy` (``retry=`` of an AWS batcher is this, not the core's
        :class:`async_batcher.failures.RetryPolicy`)."""
        return self._aws_retry

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
        outcomes: Outcomes[Any],
        indices_of: Callable[[E], Iterable[int]],
    ) -> Delivery[E]:
        return Delivery(
            send=send,
            fail=fail,
            policy=self._aws_retry,
            operation=operation,
            split=split,
            sleep=self._sleep,
            outcomes=outcomes,
            indices_of=indices_of,
            observed=True,  # on_start listens to botocore's reports of each attempt
        )

    def _outcomes(self, size: int, operation: str) -> Outcomes[Any]:
        return Outcomes(size, operation=operation, effects=self.has_effects)

    @contextlib.contextmanager
    def _tracking(self, batch: list[Any], outcomes: Outcomes[Any]) -> Iterator[None]:
        """Keep ``outcomes`` where :meth:`abandoned_error` finds them while ``process_batch`` works on ``batch``.

        Kept after a cancellation: the loop shutting down cancels the batch before asking the hook."""
        self._batches[id(batch)] = (batch, tuple(batch), outcomes)
        try:
            yield
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._batches.pop(id(batch), None)
            raise
        else:
            self._batches.pop(id(batch), None)

    def abandoned_error(self, batch: list[T], error: BaseException) -> BaseException:
        """What the callers of a batch cut off by a stop get (see the module docstring): the stop's error when
        none of its items can have been applied, else :class:`~async_batcher.aws.errors.AbandonedBatchError`."""
        kept = self._batches.pop(id(batch), None)
        if not self.has_effects:
            return error
        if kept is not None and kept[0] is batch:
            try:
                return kept[2].abandoned(kept[1], error)
            except Exception:  # a bug here must not turn into the core's default, the plain stop
                logger.exception("%s: could not tell what the stop cut off; its callers are told 'unknown'", self.name)
        # Not a batch this class tracked (a subclass's own process_batch): nothing says what it did.
        unknown = AwsOutcomeUnknownError(self.service_name, "the batcher was stopped while its batch was under way")
        unknown.__cause__ = error
        return unknown

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
        timeout, after botocore's retries), every item still without an outcome gets that error, or an
        ``AwsOutcomeUnknownError`` caused by it if a call may have applied the item; returns False then."""
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
        self._batches.clear()  # (those of a previous run that a cancellation left behind)
        stack = contextlib.AsyncExitStack()
        client = await stack.enter_async_context(
            self.aioboto3_session.client(self.service_name, **self._client_kwargs())
        )
        # Each HTTP attempt's end, for Delivery to know what a call may have applied (botocore retries inside it).
        client.meta.events.register("response-received", _on_response_received)
        self._client = client
        self._client_stack = stack
        logger.debug("%s: %s client opened (endpoint %s)", self.name, self.service_name, self.endpoint_url)

    async def on_stop(self) -> None:
        await self._close_client()

    async def _close_client(self) -> None:
        stack, self._client_stack, self._client = self._client_stack, None, None
        if stack is not None:
            await stack.aclose()
            logger.debug("%s: %s client closed", self.name, self.service_name)
