"""The server the scaling tests run (tests/keras/test_example_workers.py, tests/kubernetes): named once here."""

from __future__ import annotations

import importlib
from types import ModuleType

#: The Keras example server, as ``python -m`` runs it (examples/kubernetes/deployment.yaml names it too).
SERVER_MODULE = "benchmarks.keras.server"


def server_module() -> ModuleType:
    """The server's module, imported (TensorFlow loads only when an app starts)."""
    return importlib.import_module(SERVER_MODULE)
