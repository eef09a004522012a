"""What the full tier's tests import that the fast tier's environment lacks: missing, it fails them, never skips.

``make test-all`` installs all of it; a test run without it fails at collection, naming what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, install: str) -> ModuleType:
    """``module``, imported; if it is missing, an ImportError that says how to install it (``install``)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"these tests need {module}: {install} ({error})") from error
