"""The simulator's cost constants: ``costs.json`` beside this module, written by ``python -m
benchmarks.policy.measure`` (what each constant is and how it was measured: :mod:`benchmarks.policy.measure`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .sim.server import Costs

__all__ = ["COSTS", "fitted_cores", "load", "provenance"]

COSTS = Path(__file__).with_name("costs.json")


def _read(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"cannot read the cost constants {path}: {exc} (python -m benchmarks.policy.measure)") from exc
    return data


def load(path: Path = COSTS) -> Costs:
    return Costs.from_dict(_read(path))


def provenance(path: Path = COSTS) -> dict[str, Any]:
    """How the constants were measured (``measured``) and from what (``derived_from``)."""
    data = _read(path)
    return {"measured": data.get("measured", {}), "derived_from": data.get("derived_from", {}),
            "fit": data.get("fit", {})}  # fmt: skip


def fitted_cores(path: Path = COSTS) -> float | None:
    """The core count :mod:`benchmarks.policy.fit` fitted to the measured closed loops; None where none was."""
    cores = _read(path).get("cores")
    return None if cores is None else float(cores)
