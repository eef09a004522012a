"""The variants the simulator compares: a name, the batcher (ours or a peer), and its constructor's keyword arguments.

A variant's ``kwargs`` is the text of a Python call's keyword arguments, evaluated anew for every batcher the
simulator builds (in the worker that runs it, :mod:`benchmarks.policy.worker`), after its ``setup`` statements, with
``async_batcher``'s public names in scope for ours: ``max_queue_time=0, max_hold_time=0.002``, or an object,
``policy=Greedy(turns=2)`` with ``setup="from async_batcher.policies import Greedy"``. On the command line:
``--variant NAME:KWARGS`` (ours; ``--setup`` for the imports), or a name of :data:`REGISTRY`. To add a variant for
every run, add it to :data:`REGISTRY` and to :data:`EXTRA` (or pass ``--variant NAME``).

The grid (:func:`grid`) is every combination of :data:`QUEUE_TIMES` and :data:`HOLD_TIMES` at the README's other
settings (the policies' four turns), its ``max_queue_time=0``, no-hold point named ``greedy``: the best of the grid
is the best a user can set with the keywords, the bar the defaults and the candidates are judged against.
:func:`candidates` are the settings considered for the default: ``greedy`` at the other :data:`TURNS`
(``greedy-turns0`` ...) and without the regather, latency budgets, and closed-loop holds over them; none of them is
in the grid but ``greedy`` itself and ``wait0ms+holdXms``, which are judged against the rest of it
(:mod:`.verdicts`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONSTRUCTOR",
    "EXTRA",
    "HOLD_TIMES",
    "PEERS",
    "QUEUE_TIMES",
    "RECOMMENDED",
    "REGISTRY",
    "TURNS",
    "TURNS0",
    "Variant",
    "candidates",
    "grid",
    "parse",
    "turns_variant",
]

ROLES = ("constructor", "recommended", "grid", "peer", "candidate", "extra")


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "ours", "async-batcher-0.2.2" or "batched" (sim/batchers.py)
    kwargs: str  # keyword arguments, as in a call
    role: str = "extra"
    setup: str = ""  # statements run before kwargs is evaluated (imports)

    def job(self) -> dict[str, str]:
        return {"kind": self.kind, "kwargs": self.kwargs, "setup": self.setup}


# What a user gets from ``AsyncBatcher(...)`` with no argument (max_batch_size=None, max_queue_time=0.01, ...).
CONSTRUCTOR = Variant("constructor-defaults", "ours", "", "constructor")
# The README's "Settings for a model server" (and the FastAPI guide's), as the head-to-head's app uses them.
RECOMMENDED = Variant("recommended", "ours", "max_batch_size=256, max_queue_time=0, max_queue_size=4096", "recommended")
PEERS = (
    # Each as its README shows, at the head-to-head's settings (benchmarks/peers/apps).
    Variant("async-batcher-0.2.2", "async-batcher-0.2.2", "max_batch_size=256, max_queue_time=0.001", "peer"),
    Variant("batched", "batched", "batch_size=256, timeout_ms=1.0", "peer"),
)
QUEUE_TIMES = (0.0, 0.0005, 0.001, 0.002, 0.005)
HOLD_TIMES = (0.0, 0.001, 0.002, 0.005)
TURNS = (0, 1, 2, 8, 16, 32)  # besides the policies' default, 4
# Ours with a policy object: the README's other settings, the policies in scope.
POLICIES = "from async_batcher.policies import ClosedLoopHold, Deadline, LatencyBudget"
SETTINGS = "max_batch_size=256, max_queue_size=4096"


def _policy(name: str, policy: str, role: str = "candidate") -> Variant:
    return Variant(name, "ours", f"{SETTINGS}, policy={policy}", role, POLICIES)


def turns_variant(turns: int) -> Variant:
    """``max_queue_time=0`` at ``turns`` turns, the README's other settings: the head-to-head's
    ``ours-turnsT`` (``--ours turnsT:turns=T``)."""
    return _policy(f"turns{turns}", f"Deadline(0, turns={turns})", "extra")


# The head-to-head's ``ours-greedy``: max_queue_time=0 without turns (the calibration's).
TURNS0 = turns_variant(0)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g}ms"


def grid(queue_times: tuple[float, ...] = QUEUE_TIMES, hold_times: tuple[float, ...] = HOLD_TIMES) -> list[Variant]:
    """Fixed settings: every ``max_queue_time`` with every ``max_hold_time``, the README's other settings kept."""
    out = []
    for wait in queue_times:
        for hold in hold_times:
            name = "greedy" if wait == 0 and hold == 0 else f"wait{_ms(wait)}" + (f"+hold{_ms(hold)}" if hold else "")
            kwargs = f"max_batch_size=256, max_queue_time={wait!r}, max_hold_time={hold!r}, max_queue_size=4096"
            out.append(Variant(name, "ours", kwargs, "grid"))
    return out


def candidates(the_grid: list[Variant], turns: tuple[int, ...] = TURNS) -> tuple[list[str], list[Variant]]:
    """The settings considered for the default: their names, and the variants to run besides the grid's."""
    extra = [
        *(_policy(f"greedy-turns{t}", f"Deadline(0, turns={t})") for t in turns),
        *(_policy(f"greedy-turns{t}-noregather", f"Deadline(0, turns={t}, regather=False)") for t in (1, 2, 4, 8, 16)),
        *(_policy(f"budget{b}ms", f"LatencyBudget({b / 1000!r})") for b in (10, 25, 50)),
        _policy("budget25ms-turns1", "LatencyBudget(0.025, turns=1)"),
        _policy("budget25ms-turns16", "LatencyBudget(0.025, turns=16)"),
        _policy("hold2ms-turns1", "ClosedLoopHold(0.002, Deadline(0, turns=1))"),
        _policy("hold5ms-turns1", "ClosedLoopHold(0.005, Deadline(0, turns=1))"),
        _policy("hold2ms-turns16", "ClosedLoopHold(0.002, Deadline(0, turns=16))"),
        _policy("hold2ms-budget25ms", "ClosedLoopHold(0.002, LatencyBudget(0.025))"),
    ]
    names = {v.name for v in the_grid}
    from_grid = [n for n in ("greedy", "wait0ms+hold2ms", "wait0ms+hold5ms") if n in names]
    return [*from_grid, *(v.name for v in extra)], extra


# Named variants besides the grid, for --variant NAME; EXTRA are run by default too.
REGISTRY: dict[str, Variant] = {
    v.name: v
    for v in (
        CONSTRUCTOR,
        RECOMMENDED,
        *PEERS,
        Variant("adaptive", "ours", "max_batch_size=256, max_latency=0.025, max_queue_size=4096"),
        # Keyed traffic with a slot per key, as the peers' batchers per key have (sim/batchers.py).
        Variant("slots32", "ours", "max_batch_size=256, max_queue_time=0, max_queue_size=4096, concurrency=32"),
    )
}
EXTRA: tuple[str, ...] = ()


def parse(spec: str, setup: str = "") -> Variant:
    """``NAME`` (of :data:`REGISTRY`) or ``NAME:KWARGS`` (ours, with those keyword arguments)."""
    name, sep, kwargs = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"variant {spec!r}: no name before ':'")
    if not sep:
        if name not in REGISTRY:
            raise ValueError(f"variant {spec!r}: not one of {sorted(REGISTRY)}; give NAME:KWARGS for a new one")
        return REGISTRY[name]
    return Variant(name, "ours", kwargs.strip(), "extra", setup)
