"""The Keras benchmark server's settings: ``--help``'s options, each also read from ``KERAS_SERVER_<NAME>`` (how
uvicorn's worker processes get them)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import MutableMapping
from typing import Any

from benchmarks.keras import model as example_model

__all__ = ["ENV_PREFIX", "ServerSettings", "add_arguments"]

ENV_PREFIX = "KERAS_SERVER_"


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
    # One batcher, and one model, for every worker: the first to start loads it, the others send it their requests.
    shared: bool = False
    # The shared batcher's Unix socket ("": main() makes one in a private temporary folder, removed at exit).
    shared_address: str = ""

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


def _flag(raw: str) -> bool:
    value = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
    return value[raw.strip().lower()]


def _parse(field: dataclasses.Field[Any], raw: str) -> Any:
    kind = {"int": int, "float": float, "str": str, "bool": _flag}[str(field.type)]
    try:
        return kind(raw)
    except (ValueError, KeyError):
        raise ValueError(f"{ENV_PREFIX}{field.name.upper()}={raw!r} is not a valid {field.type}") from None


def add_arguments(parser: argparse.ArgumentParser, defaults: ServerSettings) -> None:
    helps = {
        "host": "address to bind (127.0.0.1: this machine only)",
        "port": "port to listen on",
        "workers": "uvicorn worker processes, each with its own model and batcher (unless --shared)",
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
        "shared": "one batcher and one model for all the workers: the first to start loads it (a SharedBatcher)",
        "shared_address": "the shared batcher's Unix socket ('': a new one in a private temporary folder)",
    }
    for field in dataclasses.fields(ServerSettings):
        default = getattr(defaults, field.name)
        flag, text = (
            "--" + field.name.replace("_", "-"),
            f"{helps[field.name]} (default {default}; env {ENV_PREFIX}{field.name.upper()})",
        )
        if field.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            kind = {"int": int, "float": float, "str": str}[str(field.type)]
            parser.add_argument(flag, type=kind, default=default, help=text)
