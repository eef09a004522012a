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

Run it with ``python -m benchmarks.keras.server --port 8000`` or ``python benchmarks/keras/server.py --port 8000``
(``--help`` for the settings); every setting also reads an environment variable ``KERAS_SERVER_<NAME>``, which is
how uvicorn's worker processes get them.
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
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

if not __package__:
    # Run as a file (python benchmarks/keras/server.py): the repository's root, not this folder, is where the
    # imports below (and uvicorn's "benchmarks.keras.server:app") are found.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import prometheus_client
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import Field, TypeAdapter, ValidationError
from starlette.routing import request_response

from async_batcher import metrics_multiprocess
from async_batcher.fastapi import add_batcher_exception_handlers, run_batchers
from async_batcher.metrics import register_batcher
from async_batcher.ml.keras import KerasAsyncBatcher
from async_batcher.ml.numpy import collate
from benchmarks.keras import model as example_model

__all__ = ["ServerSettings", "app", "create_app", "main"]

logger = logging.getLogger("async_batcher.benchmarks.keras.server")

ENV_PREFIX = "KERAS_SERVER_"

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


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Every knob of the benchmark server; ``--help`` and the defaults below say what each does."""

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    max_batch_size: int = 256
    # 0: a batch leaves as soon as the model is free; while it runs, the next one fills by itself. Waiting on top
    # of that only adds latency here (reports/keras.md, tuning).
    max_queue_time: float = 0.0
    # No hold (the README's settings): the four turns of the loop at a batch's end keep the clients in one cohort.
    max_hold_time: float = 0.0
    max_queue_size: int = 4096
    concurrency: int = 1
    predict_threads: int = 2
    tf_intra_op_threads: int = 1
    tf_inter_op_threads: int = 1
    hidden_layers: int = example_model.ModelSpec.hidden_layers
    max_body_bytes: int = 4096
    switch_interval: float = 0.005
    log_level: str = "warning"
    # Comma-separated batch sizes ("" for none): pad each batch up to a bucket; send batches at preferred sizes.
    buckets: str = ""
    preferred_batch_sizes: str = ""

    def __post_init__(self) -> None:
        positive = ("workers", "max_batch_size", "concurrency", "predict_threads", "hidden_layers", "max_body_bytes")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_queue_time < 0 or self.max_hold_time < 0 or self.switch_interval <= 0:
            raise ValueError(
                "max_queue_time and max_hold_time must be >= 0 and switch_interval > 0, got"
                f" {self.max_queue_time}, {self.max_hold_time}, {self.switch_interval}"
            )
        for name in ("buckets", "preferred_batch_sizes"):
            _sizes(name, getattr(self, name))

    @property
    def bucket_sizes(self) -> tuple[int, ...] | None:
        return _sizes("buckets", self.buckets) or None

    @property
    def preferred_sizes(self) -> tuple[int, ...]:
        return _sizes("preferred_batch_sizes", self.preferred_batch_sizes)

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None) -> ServerSettings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = environ.get(ENV_PREFIX + field.name.upper())
            if raw is not None:
                values[field.name] = _parse(field, raw)
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        return {ENV_PREFIX + f.name.upper(): str(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def model_spec(self) -> example_model.ModelSpec:
        return example_model.ModelSpec(hidden_layers=self.hidden_layers)


def _sizes(name: str, text: str) -> tuple[int, ...]:
    """``"1,8,32"`` as ``(1, 8, 32)``; ``""`` as ``()``."""
    try:
        sizes = tuple(int(part) for part in text.split(",")) if text.strip() else ()
    except ValueError:
        sizes = (0,)
    if any(size < 1 for size in sizes):
        raise ValueError(f"{name} must be comma-separated batch sizes >= 1, got {text!r}")
    return sizes


def _parse(field: dataclasses.Field[Any], raw: str) -> Any:
    kind = {"int": int, "float": float, "str": str}[str(field.type)]
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{ENV_PREFIX}{field.name.upper()}={raw!r} is not a valid {field.type}") from None


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


class ModelService:
    """The model, its compiled function and the two ways of calling it that the endpoints compare."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.model = example_model.load_or_train(settings.model_spec)
        self.predict_fn = example_model.compiled_predict(self.model)
        # One thread per batch in flight: the batcher never runs more than `concurrency` batches at once.
        self.batch_executor = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="keras-batch")
        # /predict's pool: as many model calls at once as there are cores to run them; more only queue in TF.
        self.single_executor = ThreadPoolExecutor(settings.predict_threads, thread_name_prefix="keras-single")
        self.batch_rows = 0  # rows the batcher's model calls computed, padding included (benchmarks/padding.py)
        self._rows_lock = threading.Lock()
        self.batcher = KerasAsyncBatcher(
            model=self.model,
            predict_fn=self.predict_batch,
            dtype=np.float32,
            buckets=settings.bucket_sizes,
            preferred_batch_sizes=settings.preferred_sizes,
            max_batch_size=settings.max_batch_size,
            max_queue_time=settings.max_queue_time,
            max_hold_time=settings.max_hold_time,
            max_queue_size=settings.max_queue_size,
            concurrency=settings.concurrency,
            executor=self.batch_executor,
            name="keras-benchmark",
        )
        self._warm_up()

    def predict_rows(self, rows: Any) -> Any:
        return self.predict_fn(rows).numpy()

    def predict_batch(self, rows: Any) -> Any:
        with self._rows_lock:
            self.batch_rows += len(rows)
        return self.predict_rows(rows)

    def predict_one(self, features: list[float]) -> float:
        """What /predict runs in its thread: the batcher's path (collate, model, split) for a batch of one."""
        batch = collate([features], dtype=np.float32)
        return float(batch.split(self.predict_rows(batch.inputs))[0][0])

    def _warm_up(self) -> None:
        # The first calls trace the graph and size TF's buffers: keep that out of the first requests' latency.
        for size in (1, 2, self.settings.max_batch_size):
            self.predict_rows(np.zeros((max(size, 1), example_model.N_FEATURES), dtype=np.float32))

    def close(self) -> None:
        self.single_executor.shutdown(wait=True)
        self.batch_executor.shutdown(wait=True)


async def _invalid_body(request: Request, exc: Exception) -> JSONResponse:
    """422 without echoing the input: FastAPI's own handler would, and a NaN in it is no JSON (a 500)."""
    raw = exc.errors() if isinstance(exc, RequestValidationError) else []
    errors = [{k: v for k, v in error.items() if k not in ("input", "ctx")} for error in raw]
    return JSONResponse({"detail": errors}, status_code=422)


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """The example app; the model loads (training it on first use) when the app starts, not on import."""
    settings = settings or ServerSettings.from_env()
    service: ModelService | None = None
    ready = False  # the batcher runs: set inside run_batchers, cleared before it stops
    # Several workers write their metrics to files that /metrics adds up (uvicorn --workers).
    multiprocess = metrics_multiprocess.multiprocess_dir() is not None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal service, ready
        sys.setswitchinterval(settings.switch_interval)
        example_model.configure_threads(settings.tf_intra_op_threads, settings.tf_inter_op_threads)
        service = await asyncio.to_thread(ModelService, settings)
        app.state.service = service
        if not multiprocess:
            register_batcher(service.batcher, registry)
        exporter: contextlib.AbstractAsyncContextManager[Any] = contextlib.nullcontext()
        if multiprocess:
            exporter = metrics_multiprocess.MultiprocessExporter(service.batcher)
        # TensorFlow and Keras leave millions of long-lived objects that every full collection would walk again
        # (a third of the server's time under load, measured): move them out of the collector's sight, as
        # async-batcher 0.2.2's example did. Both endpoints gain alike.
        gc.collect()
        gc.freeze()
        try:
            async with exporter, run_batchers(service.batcher):
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
        if service is None:  # only reachable if a request beats the lifespan, which uvicorn never lets happen
            raise RuntimeError("the model is not loaded yet")
        return service

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok" if service is not None else "loading"}

    @app.get("/ready")
    async def ready_probe() -> JSONResponse:
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        # NaN (a percentile over no batch yet) is no JSON: null instead.
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

    @post("/optimized_predict")
    async def optimized_predict(request: Request) -> Response:
        row = await loaded().batcher.process(await read_features(request))
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


def _add_arguments(parser: argparse.ArgumentParser, defaults: ServerSettings) -> None:
    helps = {
        "host": "address to bind (127.0.0.1: this machine only)",
        "port": "port to listen on",
        "workers": "uvicorn worker processes, each with its own model and batcher",
        "max_batch_size": "largest batch the batcher forms",
        "max_queue_time": "seconds the first item of a batch waits for more",
        "max_hold_time": "seconds a freed slot waits for the next of the clients the last batch answered",
        "max_queue_size": "items the batcher holds before answering 503",
        "concurrency": "batches run at once (threads of the batch executor)",
        "predict_threads": "threads /predict runs the model on",
        "tf_intra_op_threads": "TensorFlow intra-op threads (0: TensorFlow's default)",
        "tf_inter_op_threads": "TensorFlow inter-op threads (0: TensorFlow's default)",
        "hidden_layers": "hidden Dense(64) layers of the model",
        "max_body_bytes": "largest request body (413 above)",
        "switch_interval": "seconds a thread may hold the GIL while another waits for it (sys.setswitchinterval)",
        "log_level": "uvicorn's log level",
        "buckets": "batch sizes the batcher pads its batches up to, comma-separated ('': no padding)",
        "preferred_batch_sizes": "batch sizes the batcher sends batches at when it can, comma-separated",
    }
    for field in dataclasses.fields(ServerSettings):
        kind = {"int": int, "float": float, "str": str}[str(field.type)]
        default = getattr(defaults, field.name)
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            type=kind,
            default=default,
            help=f"{helps[field.name]} (default {default}; env {ENV_PREFIX}{field.name.upper()})",
        )


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras.server", description=__doc__.split("\n")[0])
    _add_arguments(parser, ServerSettings.from_env())
    args = parser.parse_args(argv)
    settings = ServerSettings(**vars(args))
    os.environ.update(settings.to_env())
    # Train (or load) once here, so that several workers do not all train at once on first use; the thread
    # pools first, as TensorFlow fixes them at its first op and the single-worker server runs in this process.
    example_model.configure_threads(settings.tf_intra_op_threads, settings.tf_inter_op_threads)
    example_model.load_or_train(settings.model_spec)
    # Several workers: their metrics meet in one directory, emptied first (a temporary one unless given).
    own_dir = None
    if settings.workers > 1 and metrics_multiprocess.multiprocess_dir() is None:
        own_dir = os.environ[metrics_multiprocess.ENV] = tempfile.mkdtemp(prefix="keras-server-metrics-")
    if (directory := metrics_multiprocess.multiprocess_dir()) is not None:
        metrics_multiprocess.prepare_directory(directory)
    try:
        _serve(uvicorn, settings)
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


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
