"""Runs simulation jobs in one interpreter: JSON jobs on stdin, one JSON line per result on stdout.

``python -I worker.py [--repo ROOT]``. With ``--repo`` (this package: ``ours``), ``ROOT`` goes first on ``sys.path``
and the engine is ``benchmarks.policy.sim``. Without (a peer, in its own virtual environment, where this repository's
``async_batcher`` must not be importable: async-batcher 0.2.2 has the same import name), the engine's folder is
loaded by path as the package ``_policy_sim``, and nothing of this repository is on ``sys.path``.

A job: ``{"id", "kind", "kwargs", "setup", "scenario", "costs", "clock", "cores"}``. ``kwargs`` is the batcher's keyword
arguments as in a Python call (``max_queue_time=0, max_hold_time=0.002``), evaluated anew for every batcher built,
after the statements of ``setup`` (imports, say), in a namespace that holds ``async_batcher``'s public names for
ours: a variant may pass objects (``policy=SomePolicy(...)``). A result line: ``{"id", "result"}`` or
``{"id", "error"}``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
import types
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The distribution each kind must import, at this version (None: this repository's, whatever its version).
DISTRIBUTIONS = {
    "ours": ("async-batcher", None),
    "async-batcher-0.2.2": ("async-batcher", "0.2.2"),
    "batched": ("batched", "0.1.5"),
}


def engine(repo: Path | None) -> str:
    """The engine's package name, importable from here on."""
    if repo is not None:
        sys.path.insert(0, str(repo))
        return "benchmarks.policy.sim"
    package = types.ModuleType("_policy_sim")
    package.__path__ = [str(HERE / "sim")]
    sys.modules["_policy_sim"] = package
    return "_policy_sim"


def check_distribution(kind: str, repo: Path | None) -> str:
    """The version of what ``kind`` imports; refuses the wrong one (a stray ``sys.path`` entry, a wrong venv)."""
    dist, expected = DISTRIBUTIONS[kind]
    version = metadata.version(dist)
    if expected is not None and version != expected:
        raise RuntimeError(f"{kind}: found {dist} {version}, expected {expected} (wrong interpreter?)")
    if kind != "batched":
        import async_batcher

        where = Path(async_batcher.__file__).resolve()
        inside = repo is not None and where.is_relative_to(repo.resolve())
        if inside != (kind == "ours"):
            raise RuntimeError(f"{kind}: imported async_batcher from {where}")
    return version


def namespace(kind: str, setup: str) -> dict[str, Any]:
    """Where a variant's ``kwargs`` are evaluated: ours gets ``async_batcher``'s public names, then ``setup`` runs."""
    space: dict[str, Any] = {"import_module": importlib.import_module}
    if kind == "ours":
        import async_batcher

        space["async_batcher"] = async_batcher
        space.update({name: getattr(async_batcher, name) for name in async_batcher.__all__})
    if setup:
        exec(setup, space)  # the variant's own imports: a benchmark's command line, by its user
    return space


def kwargs_maker(kind: str, kwargs: str, setup: str) -> Callable[[], dict[str, Any]]:
    """Evaluates ``dict(<kwargs>)`` anew at each call; checks it once here, so that a typo fails at once."""
    space = namespace(kind, setup)
    code = compile(f"dict({kwargs})", f"<variant kwargs {kwargs!r}>", "eval")

    def make() -> dict[str, Any]:
        made: dict[str, Any] = eval(code, space)  # (same)
        return made

    make()
    return make


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, help="this repository's root: run ours (else a peer, by path)")
    args = parser.parse_args(argv)
    package = engine(args.repo)
    server = importlib.import_module(f"{package}.server")
    batchers = importlib.import_module(f"{package}.batchers")
    traffic = importlib.import_module(f"{package}.traffic")
    jobs = json.load(sys.stdin)["jobs"]
    versions: dict[str, str] = {}
    for job in jobs:
        line: dict[str, Any] = {"id": job["id"]}
        try:
            kind = job["kind"]
            if kind not in versions:
                versions[kind] = check_distribution(kind, args.repo)
            make = batchers.adapter_factory(kind, kwargs_maker(kind, job["kwargs"], job.get("setup", "")))
            scenario = traffic.Scenario(**job["scenario"])
            costs = server.Costs.from_dict(job["costs"])
            result = server.run(scenario, costs, make, job.get("clock", "uvloop"), job.get("cores", 2.0))
            line["result"] = {**result.as_dict(), "version": versions[kind]}
        except Exception:
            line["error"] = traceback.format_exc()
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
