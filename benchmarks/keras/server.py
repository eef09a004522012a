"""The Keras benchmark's server: the same model behind a plain endpoint and a batched one, tuned for load.

For the short app to copy, see examples/keras/app.py; this one is what ``make benchmark`` measures, with every
per-request cost it could shed, shed (each measured: reports/keras.md, tuning).

``POST /predict`` runs the model once per request, in a thread pool so that the event loop is never blocked (a
blocked loop would make the unbatched endpoint look worse than it is). ``POST /optimized_predict`` sends the
request through a :class:`KerasAsyncBatcher`. Both take a JSON list of 10 floats and answer a JSON number, and
both run the same compiled model function on float32 input: batching changes no answer beyond float32 round-off.
``POST /echo`` validates the same body and answers a constant: the HTTP ceiling of the machine; ``POST /echo_await``
does the same after awaiting once, the ceiling of an endpoint that awaits its answer. ``GET /healthz`` says whether
the model is loaded; ``GET /ready`` answers 200 only while the batcher runs (503 before it starts and once it
stops: a readiness probe); ``GET /stats`` gives the batcher's counters and ``batch_rows``, the rows its model calls
computed (padding to ``--buckets`` included); ``GET /metrics`` the Prometheus metrics, added up over the workers
when there are several (``PROMETHEUS_MULTIPROC_DIR``, set up by ``main`` for ``--workers`` above 1 when it is not
set: async_batcher.metrics_multiprocess).

``--workers 2 --shared``: the workers share one batcher and one model (a :class:`~async_batcher.shared.SharedBatcher`):
the first worker to start imports TensorFlow and loads the model (:func:`benchmarks.keras.service.make_batcher`), the
others import neither and send it their requests over a Unix socket (in a private temporary folder unless
``--shared-address``); ``/metrics`` shows the one batcher whichever worker answers; ``/predict``, which has no model
to run in the other workers, answers 501.

Run it with ``python -m benchmarks.keras.server --port 8000`` or ``python benchmarks/keras/server.py --port 8000``
(``--help`` for the settings); every setting also reads an environment variable ``KERAS_SERVER_<NAME>``, which is
how uvicorn's worker processes get them. The settings: :mod:`benchmarks.keras.settings`; the model and its
batcher: :mod:`benchmarks.keras.service`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

if not __package__:
    # Run as a file (python benchmarks/keras/server.py): the repository's root, not this folder, is where the
    # imports below (and uvicorn's "benchmarks.keras.server:app") are found.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import prometheus_client
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import Field, TypeAdapter, ValidationError
from starlette.routing import request_response

from async_batcher import AsyncBatchException, metrics_multiprocess
from async_batcher.fastapi import add_batcher_exception_handlers, run_batchers
from async_batcher.metrics import register_batcher
from async_batcher.shared import SharedBatcher
from benchmarks.keras import model as example_model
from benchmarks.keras.service import BATCHER_NAME, ModelService, make_batcher, owned, release
from benchmarks.keras.settings import ENV_PREFIX, ServerSettings, add_arguments

__all__ = ["ENV_PREFIX", "ServerSettings", "app", "create_app", "main"]

logger = logging.getLogger("async_batcher.benchmarks.keras.server")

# The body: exactly the model's 10 features, finite numbers (JSON has no NaN, but Python's parser reads one).
Features = Annotated[
    list[Annotated[float, Field(strict=True, allow_inf_nan=False)]],
    Field(min_length=example_model.N_FEATURES, max_length=example_model.N_FEATURES),
]

_FEATURES = TypeAdapter(Features)
_SCHEMA = _FEATURES.json_schema()


async def read_features(request: Request) -> list[float]:
    """The request's body as the model's features, or a ``RequestValidationError`` (422) saying what is wrong."""
    try:
        return _FEATURES.validate_json(await request.body())
    except ValidationError as exc:
        # FastAPI's own errors place a body's problems under "body"; keep that shape.
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_input=False)]
        raise RequestValidationError(errors) from None


def answer(value: float) -> Response:
    """A JSON number: the prediction is finite (a NaN or infinity would be no JSON, and json.dumps would say so)."""
    return Response(json.dumps(value, allow_nan=False), media_type="application/json")


class DirectRoute(APIRoute):
    """A route whose endpoint reads the ``Request`` and returns the ``Response`` itself: it is called directly.

    FastAPI's own handler would first solve the endpoint's dependencies (it has none), open two exit stacks for
    them and then check what it returned: about 30 µs of each request on the 2-core VM, a third of the server's
    time for ``/echo`` (reports/keras.md, tuning). The route runs its endpoint as a Starlette ``Route`` would,
    through ``starlette.routing.request_response``, which still sends its errors to the app's exception handlers
    (422, 503); it stays an ``APIRoute``, so the OpenAPI schema still documents it.
    """

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.app = request_response(endpoint)


async def _invalid_body(request: Request, exc: Exception) -> JSONResponse:
    """422 without echoing the input: FastAPI's own handler would, and a NaN in it is no JSON (a 500)."""
    raw = exc.errors() if isinstance(exc, RequestValidationError) else []
    errors = [{k: v for k, v in error.items() if k not in ("input", "ctx")} for error in raw]
    return JSONResponse({"detail": errors}, status_code=422)


def _exported(
    batcher: Any, multiprocess: bool, registry: prometheus_client.CollectorRegistry
) -> contextlib.AbstractAsyncContextManager[Any]:
    """The batcher's metrics for /metrics: in every worker's files (multiprocess mode), or in the app's registry. A
    shared batcher is passed in every worker: the one that owns it exports it, the others nothing."""
    if multiprocess:
        return metrics_multiprocess.MultiprocessExporter(batcher)
    register_batcher(batcher, registry)
    return contextlib.nullcontext()


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """The example app; the model loads (training it on first use) when the app starts, not on import."""
    settings = settings or ServerSettings.from_env()
    service: ModelService | None = None
    ready = False  # the batcher runs: set inside run_batchers, cleared before it stops
    # Several workers write their metrics to files that /metrics adds up (uvicorn --workers).
    multiprocess = metrics_multiprocess.multiprocess_dir() is not None
    # --shared: one batcher for every worker, made (with the model) by the first worker to start; TensorFlow is
    # imported there only (the factory imports it), the other workers send it their requests over a Unix socket.
    shared: SharedBatcher[list[float], Any] | None = None
    if settings.shared:
        shared = SharedBatcher(make_batcher, name=BATCHER_NAME, address=settings.shared_address or None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal service, ready
        sys.setswitchinterval(settings.switch_interval)
        if shared is not None:
            async with _exported(shared, multiprocess, registry), run_batchers(shared):
                ready = True
                try:
                    yield
                finally:
                    ready = False
                    owned = release()
            if owned is not None:
                owned.close()
            return
        example_model.configure_threads(settings.tf_intra_op_threads, settings.tf_inter_op_threads)
        service = await asyncio.to_thread(ModelService, settings)
        app.state.service = service
        # TensorFlow and Keras leave millions of long-lived objects that every full collection would walk again
        # (a third of the server's time under load, measured): move them out of the collector's sight, as
        # async-batcher 0.2.2's example did. Both endpoints gain alike.
        gc.collect()
        gc.freeze()
        try:
            async with _exported(service.batcher, multiprocess, registry), run_batchers(service.batcher):
                ready = True
                try:
                    yield
                finally:
                    ready = False
        finally:
            service.close()

    # FastAPI's OpenTelemetry hooks ask on every request whether a provider was configured (measured: 2 % of the
    # server's time); this example configures none.
    # max_body_size: FastAPI's own limit (413 above it), counted while the body is read, announced or not.
    app = FastAPI(
        title="async-batcher Keras benchmark",
        lifespan=lifespan,
        telemetry={"tracing": False, "metrics": False, "logs": False},
        max_body_size=settings.max_body_bytes,
    )
    # Prometheus metrics of the batcher, read from its statistics at scrape time (a registry per app: tests build
    # several apps in one process).
    registry = prometheus_client.CollectorRegistry()
    metrics_app = metrics_multiprocess.make_metrics_app() if multiprocess else prometheus_client.make_asgi_app(registry)
    app.mount("/metrics", metrics_app)
    add_batcher_exception_handlers(app)
    app.add_exception_handler(RequestValidationError, _invalid_body)

    def loaded() -> ModelService:
        if shared is not None:  # (--shared: no model here, unless this worker owns the batcher)
            raise HTTPException(501, "with --shared the model is the shared batcher's: use /optimized_predict")
        if service is None:  # only reachable if a request beats the lifespan, which uvicorn never lets happen
            raise RuntimeError("the model is not loaded yet")
        return service

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        if shared is None:
            return {"status": "ok" if service is not None else "loading"}
        try:  # the model is loaded where an owner answers
            async with asyncio.timeout(1.0):
                await shared.fetch_stats()
        except (TimeoutError, AsyncBatchException):
            return {"status": "loading", "role": shared.role}
        return {"status": "ok", "role": shared.role}

    @app.get("/ready")
    async def ready_probe() -> JSONResponse:
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        # NaN (a percentile over no batch yet) is no JSON: null instead.
        if shared is not None:  # the owner's batcher's, from whichever worker (batch_rows: the owner's only)
            mine = owned()
            rows = None if mine is None else mine.batch_rows
            stats = {**dataclasses.asdict(await shared.fetch_stats()), "batch_rows": rows, "role": shared.role}
        else:
            svc = loaded()
            stats = {**dataclasses.asdict(svc.batcher.stats), "batch_rows": svc.batch_rows}
        return json.loads(json.dumps(stats).replace("NaN", "null"))

    # The body is read and validated by hand, in one call into pydantic's JSON parser, and the answer written as
    # bytes: FastAPI's body parameters and return-type serialisation run about twenty Python steps a request
    # that an endpoint this small pays in full (measured: 15 % of the server's time per request; reports/keras.md,
    # tuning). Same validation, same 422; all four endpoints below share it, so the comparison stays fair.
    # They are DirectRoutes, called without FastAPI's per-request dependency solving.
    body_schema = {"requestBody": {"required": True, "content": {"application/json": {"schema": _SCHEMA}}}}

    def post(path: str) -> Callable[[Callable[[Request], Coroutine[Any, Any, Response]]], Any]:
        def register(endpoint: Callable[[Request], Coroutine[Any, Any, Response]]) -> Any:
            app.router.add_api_route(
                path,
                endpoint,
                methods=["POST"],
                response_model=float,
                openapi_extra=body_schema,
                route_class_override=DirectRoute,
            )
            return endpoint

        return register

    @post("/predict")
    async def predict(request: Request) -> Response:
        data = await read_features(request)
        svc = loaded()
        return answer(await asyncio.get_running_loop().run_in_executor(svc.single_executor, svc.predict_one, data))

    if shared is None:

        @post("/optimized_predict")
        async def optimized_predict(request: Request) -> Response:
            row = await loaded().batcher.process(await read_features(request))
            return answer(float(row[0]))

    else:
        batcher = shared

        @post("/optimized_predict")
        async def optimized_shared(request: Request) -> Response:
            row = await batcher.process(await read_features(request))  # batched with every worker's requests
            return answer(float(row[0]))

    @post("/echo")
    async def echo(request: Request) -> Response:
        await read_features(request)
        return answer(0.0)

    @post("/echo_await")
    async def echo_await(request: Request) -> Response:
        await read_features(request)
        # Suspends the request once, as any endpoint that awaits its answer must: the HTTP ceiling for those.
        await asyncio.sleep(0)
        return answer(0.0)

    # Starlette tries the routes in order, about 0.6 µs each, and FastAPI put its docs routes first: with the
    # /metrics mount and the GET routes, /optimized_predict came ninth (5.7 µs a request, measured). The model
    # endpoints go first; sort is stable, so the rest keep their order.
    hot = ("/predict", "/optimized_predict", "/echo", "/echo_await")
    app.router.routes.sort(key=lambda route: getattr(route, "path", None) not in hot)
    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras.server", description=__doc__.split("\n")[0])
    add_arguments(parser, ServerSettings.from_env())
    args = parser.parse_args(argv)
    settings = ServerSettings(**vars(args))
    own_dirs = []
    if settings.shared and not settings.shared_address:  # a socket of this server's own, in a folder of mode 0700
        own_dirs.append(tempfile.mkdtemp(prefix="keras-server-shared-"))
        settings = dataclasses.replace(settings, shared_address=os.path.join(own_dirs[-1], "batcher.sock"))
    os.environ.update(settings.to_env())
    _train_once(settings)
    # Several workers: their metrics meet in one directory, emptied first (a temporary one unless given).
    if settings.workers > 1 and metrics_multiprocess.multiprocess_dir() is None:
        own_dirs.append(tempfile.mkdtemp(prefix="keras-server-metrics-"))
        os.environ[metrics_multiprocess.ENV] = own_dirs[-1]
    if (directory := metrics_multiprocess.multiprocess_dir()) is not None:
        metrics_multiprocess.prepare_directory(directory)
    try:
        _serve(uvicorn, settings)
    finally:
        for own_dir in own_dirs:
            shutil.rmtree(own_dir, ignore_errors=True)


def _train_once(settings: ServerSettings) -> None:
    """Train (or load) the model once before the workers start, so that several do not all train at once on first
    use; the thread pools first, as TensorFlow fixes them at its first op. The single-worker server runs in this
    process, which loads TensorFlow anyway; with several workers it is done in a child process, so that this one,
    uvicorn's supervisor, never holds TensorFlow (the memory the workers' benchmark sums up)."""
    if settings.workers == 1:
        example_model.configure_threads(settings.tf_intra_op_threads, settings.tf_inter_op_threads)
        example_model.load_or_train(settings.model_spec)
        return
    root = str(Path(__file__).resolve().parents[2])
    code = (
        "from benchmarks.keras import model as m; "
        f"m.configure_threads({settings.tf_intra_op_threads}, {settings.tf_inter_op_threads}); "
        f"m.load_or_train(m.ModelSpec(hidden_layers={settings.hidden_layers}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True, timeout=600)


def _serve(uvicorn: Any, settings: ServerSettings) -> None:
    uvicorn.run(
        "benchmarks.keras.server:app",
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        access_log=False,
        # No proxy in front of a server on 127.0.0.1: skip the middleware that would read X-Forwarded-*. It is
        # one more coroutine layer that every suspended request passes through twice (measured: about a tenth
        # of the cost of an awaiting request; reports/keras.md).
        proxy_headers=False,
    )


app = create_app()

if __name__ == "__main__":
    main()
