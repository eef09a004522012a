"""Serve batchers from a FastAPI (or any Starlette) app: run them with the app, hand them to endpoints, answer 503.

::

    predictor = MyBatcher(name="predictor", max_queue_size=1000)
    app = FastAPI(lifespan=batcher_lifespan(predictor))  # runs it with the app
    add_batcher_exception_handlers(app)  # full queue, stopping: 503
    Predictor = Annotated[MyBatcher, Depends(batcher_dependency("predictor"))]

    @app.post("/predict")
    async def predict(body: Features, batcher: Predictor) -> float:
        return await batcher.process(body.values)

The batchers are the app's lifespan state (ASGI's ``scope["state"]``), keyed by their ``name``: an endpoint gets
them through :func:`batcher_dependency`, and tests or several apps in one process never share a global.

A full queue becomes ``503 Service Unavailable`` with a ``Retry-After`` header, the standard signal for a client
or load balancer to back off and come back, instead of a 500 that reads like a bug. A request that arrives while
the batchers stop, after the server began shutting down, gets the same answer; one refused as predicted to miss its
deadline (``refuse_late``) too, with the ``Retry-After`` the batcher computed. An item that can never be admitted
(heavier than ``max_queue_weight`` or ``max_batch_weight``: :class:`~async_batcher.OversizedItemError`) is ``413
Content Too Large``: trying again will not help. A write or a send whose outcome is
unknown (:class:`~async_batcher.OutcomeUnknownError`) is a 500 without ``Retry-After``: it may have been done.
Needs the ``[fastapi]`` extra.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

try:
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "async_batcher.fastapi needs FastAPI (or Starlette): pip install 'async-batcher[fastapi]'"
    ) from exc

from async_batcher.batcher import AsyncBatcher
from async_batcher.exceptions import (
    BatcherStoppedError,
    LateRefusalError,
    OutcomeUnknownError,
    OversizedItemError,
    QueueFullException,
)
from async_batcher.shared import SharedBatcher

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["add_batcher_exception_handlers", "batcher_dependency", "batcher_lifespan", "run_batchers"]

logger = logging.getLogger("async_batcher.fastapi")

#: What the helpers take: a batcher of this process, or one shared by the processes of the machine.
Batcher = AsyncBatcher[Any, Any] | SharedBatcher[Any, Any]
_BATCHERS = (AsyncBatcher, SharedBatcher)


def _by_name(batchers: tuple[Batcher, ...]) -> dict[str, Batcher]:
    named: dict[str, Batcher] = {}
    for batcher in batchers:
        if not isinstance(batcher, _BATCHERS):
            raise TypeError(
                f"expected AsyncBatcher instances (or SharedBatcher; a @batch function's is f.batcher), got {batcher!r}"
            )
        if batcher.name in named:
            raise ValueError(f"two batchers are named {batcher.name!r}: give each batcher its own name=")
        named[batcher.name] = batcher
    return named


@contextlib.asynccontextmanager
async def run_batchers(*batchers: Batcher, stop_timeout: float | None = None) -> AsyncIterator[dict[str, Batcher]]:
    """Start ``batchers`` on entry and give them by name; on exit stop them, draining what they hold, in reverse.

    For a lifespan that builds its batchers itself (after loading a model, say) or has more state to yield::

        async def lifespan(app):
            batcher = KerasAsyncBatcher(model=load_model(), name="predictor")
            async with run_batchers(batcher) as batchers:
                yield {**batchers, "settings": settings}

    ``stop_timeout``: how long each stop may drain before the items left are failed with
    ``BatcherStoppedError`` (None: as long as it takes). Every batcher is stopped even if one fails to stop.
    Two batchers with the same ``name`` are a ``ValueError``, before any starts. A
    :class:`~async_batcher.shared.SharedBatcher` is started before the app serves (in the worker that owns it, its
    factory has loaded the model), and stopped by handing over (the owner drains, a client takes over).
    """
    named = _by_name(batchers)
    started: list[Batcher] = []
    try:
        for batcher in batchers:
            if isinstance(batcher, SharedBatcher):
                await batcher.__aenter__()
            else:
                batcher.start()
            started.append(batcher)
        yield dict(named)
    finally:
        errors: list[BaseException] = []
        for batcher in reversed(started):
            try:
                await batcher.stop(timeout=stop_timeout)
            except Exception as exc:  # stop the others all the same, then report
                errors.append(exc)
        if errors:
            raise errors[0]


def batcher_lifespan(
    *batchers: Batcher, stop_timeout: float | None = None
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[dict[str, Batcher]]]:
    """A ``lifespan=`` for ``FastAPI(...)`` that runs ``batchers`` for the life of the app (see run_batchers).

    Its state is the batchers by name, for :func:`batcher_dependency`. Uvicorn runs the shutdown half after it
    stopped accepting requests and the requests in flight have been answered, so the drain finds only what those
    requests left behind.
    """
    _by_name(batchers)  # a bad argument fails here, where the app is built, not at its start

    def lifespan(app: Starlette) -> contextlib.AbstractAsyncContextManager[dict[str, Batcher]]:
        return run_batchers(*batchers, stop_timeout=stop_timeout)

    return lifespan


def batcher_dependency(name: str | None = None) -> Callable[[Request], Awaitable[Batcher]]:
    """A FastAPI dependency that gives an endpoint the batcher named ``name`` from the app's lifespan state.

    An ``async def``: FastAPI runs it on the event loop, with no hop to a worker thread (a plain ``def`` dependency
    runs in one, which costs a thread hop per request, and on a test's virtual clock lets time jump meanwhile).

    ``Depends(batcher_dependency("predictor"))``; with ``name=None`` the state must hold exactly one batcher,
    which it gives. A batcher that is not there is a ``LookupError`` naming those that are (a bug in the app's
    set-up, so a 500): yield it from the lifespan (:func:`batcher_lifespan`, or :func:`run_batchers` in your own).
    An empty state is most often a lifespan that did not run: in a test, run it around the client (``with
    TestClient(app)``, or asgi-lifespan's ``LifespanManager``; httpx's ``ASGITransport`` alone does not run it).
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a batcher's name (a str) or None, got {name!r}")

    async def get_batcher(request: Request) -> Batcher:
        state: Mapping[str, Any] = request.scope.get("state") or {}
        found = {key: value for key, value in state.items() if isinstance(value, _BATCHERS)}
        if name is not None and name in found:
            return found[name]
        if name is None and len(found) == 1:
            return next(iter(found.values()))
        raise LookupError(_missing(name, state, found))

    return get_batcher


def _missing(name: str | None, state: Mapping[str, Any], found: Mapping[str, Batcher]) -> str:
    """Why the dependency finds no batcher for ``name``. An empty state is most often a lifespan that did not run (a
    test client that does not run it): the advice to yield the batcher would not fix that."""
    wanted = "a batcher" if name is None else f"batcher {name!r}"
    if not state:
        return (
            f"{wanted} is not in the app's lifespan state, which is empty: the app's lifespan did not run (a test"
            " client may not run it: httpx's ASGITransport never does, Starlette's TestClient only as a context"
            " manager), or it yielded nothing. In a test, run the lifespan around the requests: `with"
            " TestClient(app) as client:` (fastapi.testclient), or `async with LifespanManager(app) as manager:`"
            " (asgi-lifespan) with httpx.ASGITransport(app=manager.app). A lifespan yields its batchers as"
            " FastAPI(lifespan=batcher_lifespan(batcher)) does"
        )
    yield_it = "yield it from the lifespan, e.g. FastAPI(lifespan=batcher_lifespan(batcher))"
    if not found:
        return f"{wanted} is not in the app's lifespan state, which holds no batcher (only {sorted(state)}): {yield_it}"
    return f"{wanted} is not in the app's lifespan state, which holds the batchers {sorted(found)}: {yield_it}"


def add_batcher_exception_handlers(app: Starlette, *, retry_after: int = 1) -> None:
    """Answer ``QueueFullException`` and ``BatcherStoppedError`` with 503 and ``Retry-After``: the request was not
    processed, try again. ``Retry-After`` is the seconds the exception computed (its ``retry_after``: a
    :class:`~async_batcher.LateRefusalError`'s, rounded up, at least 1), else ``retry_after``. Answer
    :class:`~async_batcher.OversizedItemError` with 413: the item can never be admitted. Answer
    :class:`~async_batcher.OutcomeUnknownError` (a write or a send cut off by a stop or a lost connection) with 500
    and no ``Retry-After``: it may have been processed, and a client that retries it blindly may do it twice."""
    if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
        raise ValueError(f"retry_after must be a non-negative int of seconds, got {retry_after!r}")

    async def unavailable(request: Request, exc: Exception) -> Response:
        seconds = retry_after
        if isinstance(exc, LateRefusalError):
            reason = "predicted to miss its deadline"
        else:
            reason = "queue full" if isinstance(exc, QueueFullException) else "shutting down"
        computed = getattr(exc, "retry_after", None)
        if computed is not None and math.isfinite(computed):
            seconds = max(1, math.ceil(computed))  # (0 would invite an immediate retry, refused again)
        logger.debug("%s %s: 503, %s", request.method, request.url.path, reason)
        return JSONResponse(
            {"detail": f"Service unavailable: {reason}, retry later"},
            status_code=503,
            headers={"Retry-After": str(seconds)},
        )

    async def too_large(request: Request, exc: Exception) -> Response:
        logger.debug("%s %s: 413, oversized item", request.method, request.url.path)
        return JSONResponse({"detail": f"Content too large: {exc}"}, status_code=413)

    async def unknown(request: Request, exc: Exception) -> Response:
        logger.debug("%s %s: 500, outcome unknown", request.method, request.url.path)
        return JSONResponse(
            {"detail": "The outcome is unknown: the request may have been processed; check before retrying"},
            status_code=500,
        )

    app.add_exception_handler(QueueFullException, unavailable)
    app.add_exception_handler(BatcherStoppedError, unavailable)
    app.add_exception_handler(OversizedItemError, too_large)
    app.add_exception_handler(OutcomeUnknownError, unknown)
