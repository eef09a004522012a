"""One variant's server: ``python -I serve.py --variant ours --port 8001 [--settings JSON]``.

Run by path, with ``-I``, by the variant's own interpreter: only ``apps/`` (this folder's app modules) joins
``sys.path``, at its end, so that async-batcher 0.2.2's environment never sees this repository's package. uvicorn
serves the app on 127.0.0.1 in this process (one worker) with uvloop and httptools, for every variant alike.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["MODULES", "main", "serve"]

# The variant's name -> its module in apps/.
MODULES = {
    "none": "app_none",
    "ours": "app_ours",
    "async-batcher-0.2.2": "app_async_batcher_022",
    "batched": "app_batched",
    "fast-dynamic-batcher": "app_fast_dynamic_batcher",
    "cohort": "app_cohort",
}


def _versions(variant: str) -> dict[str, str]:
    names = ["tensorflow-cpu", "tensorflow", "keras", "numpy", "fastapi", "starlette", "pydantic", "uvicorn", "uvloop"]
    names.append({"none": "", "ours": "async-batcher", "async-batcher-0.2.2": "async-batcher"}.get(variant, variant))
    found = {}
    for name in filter(None, names):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True, choices=sorted(MODULES))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--settings", default="{}", help="JSON object of the batcher's settings")
    args = parser.parse_args(argv)
    settings = json.loads(args.settings)
    if not isinstance(settings, dict):
        parser.error(f"--settings must be a JSON object, got {args.settings!r}")
    sys.path.append(str(Path(__file__).resolve().with_name("apps")))
    from app_shape import create_app  # type: ignore[import-not-found,unused-ignore]

    module = importlib.import_module(MODULES[args.variant])
    info = {
        "variant": args.variant,
        "settings": {**getattr(module, "DEFAULTS", {}), **settings},
        "versions": _versions(args.variant),
        "python": sys.version.split()[0],
    }
    serve(create_app(functools.partial(module.make_predictor, settings=settings), info), args.port)


def serve(app: Any, port: int) -> None:
    """Serve ``app`` as every variant's server runs: uvicorn on 127.0.0.1, one worker, uvloop and httptools."""
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # nothing in front of a server on 127.0.0.1
    )


if __name__ == "__main__":
    main()
