"""The open-loop part of a report: per arrival shape, p50/p99 at each rate (the median of the rounds, with the
p99's spread), goodput at the SLO, every figure of every step, the mixed scenario, and the targets of issue 24 that
open-loop figures decide; the CSV of every step and the chart."""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.openloop.steps import OpenStep

__all__ = [
    "GREEDY",
    "PEER_NAMES",
    "Goodput",
    "OpenSummary",
    "goodput",
    "is_ours",
    "open_sections",
    "open_target_rows",
    "p_text",
    "paired_counts",
    "paired_rows",
    "paired_section",
    "read_csv",
    "read_rows",
    "sign_test",
    "summarise",
    "write_csv",
    "write_png",
]

PEER_NAMES = ("async-batcher-0.2.2", "batched", "fast-dynamic-batcher")
GREEDY = "ours-greedy"  # the reference: this package with max_queue_time=0, no hold, no turns (plain greedy)
TARGET_FRACTIONS = (0.1, 0.9)  # the open-loop p99 targets hold from about 10 % to 90 % of saturation
SLACK = 0.05  # a fixed --rates value within 5 % of that range counts as in it

_Row = TypeVar("_Row")


def is_ours(variant: str) -> bool:
    return variant == "ours" or variant.startswith("ours-")


@dataclasses.dataclass(frozen=True)
class OpenSummary:
    """One variant at one shape, rate and mixed setting: medians over the rounds (p99 with its min and max)."""

    variant: str
    shape: str
    rate: float
    fraction: float | None
    scenario: str
    mixed: int
    rounds: int
    offered_rps: float
    answered_rps: float
    p50_ms: float
    p99_ms: float
    p99_low: float
    p99_high: float
    p999_ms: float
    max_ms: float
    errors: int  # summed over the rounds
    timeouts: int
    scheduled: int  # summed over the rounds
    items_per_call: float | None
    server_cpu: float | None
    gen_cpu: float
    gen_cpu_max: float
    lag_p99_ms: float  # the worst round's
    connections: int  # the most a round opened
    held: bool  # in every round
    closed_rps: float | None
    closed_p99_ms: float | None
    hold_share: float | None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None


def _med(values: Iterable[float]) -> float:
    """Median where inf counts (a percentile on a failure); NaN if nothing."""
    present = sorted(v for v in values if not math.isnan(v))
    if not present:
        return math.nan
    mid = len(present) // 2
    if len(present) % 2:
        return present[mid]
    a, b = present[mid - 1], present[mid]
    return math.inf if math.inf in (a, b) else (a + b) / 2


Key = tuple[str, str, float, str]  # variant, shape, rate, scenario


def summarise(steps: list[OpenStep]) -> dict[Key, OpenSummary]:
    groups: dict[Key, list[OpenStep]] = {}
    for s in steps:
        groups.setdefault((s.variant, s.shape, s.rate, s.scenario), []).append(s)
    out = {}
    for key, g in groups.items():
        p99 = [s.p99_ms for s in g]
        out[key] = OpenSummary(
            variant=key[0],
            shape=key[1],
            rate=key[2],
            fraction=g[0].fraction,
            scenario=key[3],
            mixed=g[0].mixed,
            rounds=len(g),
            offered_rps=_med(s.offered_rps for s in g),
            answered_rps=_med(s.answered_rps for s in g),
            p50_ms=_med(s.p50_ms for s in g),
            p99_ms=_med(p99),
            p99_low=min(p99),
            p99_high=max(p99),
            p999_ms=_med(s.p999_ms for s in g),
            max_ms=max(s.max_ms for s in g),
            errors=sum(s.errors for s in g),
            timeouts=sum(s.timeouts for s in g),
            scheduled=sum(s.scheduled for s in g),
            items_per_call=_median(s.items_per_call for s in g),
            server_cpu=_median(s.server_cpu for s in g),
            gen_cpu=_med(s.gen_cpu for s in g),
            gen_cpu_max=max(s.gen_cpu for s in g),
            lag_p99_ms=max(s.lag_p99_ms for s in g),
            connections=max(s.connections for s in g),
            held=all(s.held for s in g),
            closed_rps=_median(s.closed_rps for s in g),
            closed_p99_ms=_median(s.closed_p99_ms for s in g),
            hold_share=_median(s.hold_share for s in g),
        )
    return out


def _ms(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "timeout"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _rate(v: float) -> str:
    return f"{v:,.0f}".replace(",", " ")


def _pct(v: float | None) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{v:.0f}"


def _rate_label(rate: float, fraction: float | None) -> str:
    return f"{_rate(rate)}/s" + (f" ({fraction * 100:.0f} %)" if fraction is not None else "")


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


@dataclasses.dataclass(frozen=True)
class Goodput:
    """The highest rate swept at which this variant's p99 (median of the rounds) met the SLO, and so did every lower
    rate; ``first_miss``: the next rate swept, where it did not (None: it met it at every rate)."""

    rate: float  # 0 when it missed at the lowest rate
    fraction: float | None
    first_miss: float | None
    first_miss_p99: float | None
    held: bool  # the generator held the schedule at every rate up to first_miss


def goodput(summary: dict[Key, OpenSummary], variant: str, shape: str, slo_ms: float) -> Goodput | None:
    rows = sorted(
        (s for s in summary.values() if s.variant == variant and s.shape == shape and s.scenario == "sweep"),
        key=lambda s: s.rate,
    )
    if not rows:
        return None
    best, fraction, held = 0.0, None, True
    for s in rows:
        held = held and s.held
        if not s.p99_ms <= slo_ms:
            return Goodput(best, fraction, s.rate, s.p99_ms, held)
        best, fraction = s.rate, s.fraction
    return Goodput(best, fraction, None, None, held)


def _goodput_cell(g: Goodput | None) -> str:
    if g is None:
        return "n/a"
    text = f"**{_rate(g.rate)}**" + (f" ({g.fraction * 100:.0f} %)" if g.fraction is not None and g.rate else "")
    if g.first_miss is not None:
        text += f"; at {_rate(g.first_miss)}: p99 {_ms(g.first_miss_p99)}"
    return text + ("" if g.held else " †")


def _shapes(steps: list[OpenStep]) -> list[str]:
    return list(dict.fromkeys(s.shape for s in steps if s.scenario == "sweep"))


def open_sections(
    steps: list[OpenStep], variants: list[str], shapes: dict[str, str], slo_ms: float, timeout: float
) -> list[str]:
    """The open-loop and mixed sections (``shapes``: each shape's name and its description)."""
    summary = summarise(steps)
    lines: list[str] = []
    rounds = max((s.rounds for s in summary.values()), default=0)
    note = (
        f"Latency from each request's intended send time to its answer, median of {rounds} round(s); a request not "
        f"answered within {timeout:g} s of it is a timeout, and counts as slower than any answer (`timeout`: the "
        "percentile fell on one). `†`: in some round the generator did not hold the schedule (its p99 lag or its "
        "CPU over the limit: see the figures below); the figure is given at the rate asked for, not a lower one."
    )
    for shape in _shapes(steps):
        rates = sorted({s.rate for s in summary.values() if s.shape == shape and s.scenario == "sweep"})
        lines += [f"## Open loop, {shapes.get(shape, shape)}: p50 / p99 ms", "", note, ""]
        body = []
        for v in variants:
            cells = []
            for r in rates:
                s = summary.get((v, shape, r, "sweep"))
                if s is None:
                    cells.append("n/a")
                    continue
                failed = (s.errors + s.timeouts) / s.scheduled if s.scheduled else 0.0
                cell = f"{_ms(s.p50_ms)} / {_ms(s.p99_ms)}" + ("" if s.held else " †")
                cells.append(cell + (f" ({failed * 100:.0f} % failed)" if failed >= 0.005 else ""))
            body.append([v, *cells])
        fractions = {s.rate: s.fraction for s in summary.values() if s.shape == shape}
        lines += [*_table(["variant", *[_rate_label(r, fractions[r]) for r in rates]], body), ""]
    if any(s.scenario == "sweep" for s in steps):
        lines += [f"## Goodput: the highest rate with p99 ≤ {slo_ms:g} ms", ""]
        lines += [
            f"The highest rate swept at which the variant's p99 was at most {slo_ms:g} ms, as at every lower rate "
            "swept (its resolution is the sweep's: the next rate, where it was not, is given). `†`: the generator "
            "did not hold the schedule at one of those rates.",
            "",
        ]
        shape_names = _shapes(steps)
        body = [[v, *[_goodput_cell(goodput(summary, v, sh, slo_ms)) for sh in shape_names]] for v in variants]
        lines += [*_table(["variant", *[shapes.get(sh, sh) for sh in shape_names]], body), ""]
    lines += paired_section(steps, variants)
    mixed = sorted((s for s in summary.values() if s.scenario == "mixed"), key=lambda s: variants.index(s.variant))
    if mixed:
        lines += ["## Mixed: a closed-loop population and open-loop arrivals at once", ""]
        lines += [
            "The open-loop arrivals (Poisson) alone, then at the same rate with the closed-loop clients running "
            "beside them (each sends its next request when the last is answered: a batch job), one after the other "
            "for each variant. The closed-loop part's figures are over a window that covers the open-loop one.",
            "",
        ]
        body = []
        for m in mixed:
            alone = summary.get((m.variant, m.shape, m.rate, "alone"))
            ratio = m.p99_ms / alone.p99_ms if alone and alone.p99_ms > 0 else math.nan
            body.append(
                [
                    m.variant,
                    _rate_label(m.rate, m.fraction),
                    _ms(alone.p99_ms) if alone else "n/a",
                    _ms(m.p99_ms) + ("" if m.held else " †"),
                    "n/a" if math.isnan(ratio) or math.isinf(ratio) else f"{ratio:.2f}x",
                    f"{_ms(alone.p50_ms) if alone else 'n/a'} / {_ms(m.p50_ms)}",
                    f"{m.mixed}: {_rate(m.closed_rps or 0)}/s, p99 {_ms(m.closed_p99_ms)}",
                    f"{_f1(alone.items_per_call) if alone else 'n/a'} / {_f1(m.items_per_call)}",
                ]
            )
        head = ["variant", "open-loop rate", "p99 alone", "p99 mixed", "mixed / alone"]
        head += ["p50 alone / mixed", "closed loop: connections, req/s, p99", "items/call alone / mixed"]
        lines += [*_table(head, body), ""]
    lines += _every_figure(summary, variants, shapes)
    return lines


def _f1(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def _every_figure(summary: dict[Key, OpenSummary], variants: list[str], shapes: dict[str, str]) -> list[str]:
    lines = ["## Every open-loop figure (median of the rounds; p99 range: min-max over the rounds)", ""]
    lines += [
        "Offered: the schedule's own rate over the window (Poisson noise around the rate asked for); answered: "
        "2xx answers a second. CPU in % of one core over the measured window (the server's child processes "
        "included; the generator's clock thread included; for the mixed steps, the open-loop generator's alone). "
        "Lag: how late the generator handed requests out against the schedule (p99, the worst round's). "
        "Connections: the most one round opened. Held: of the model calls, the share a hold kept back for "
        "returning callers (this package's `BatcherStats.held`; the gate's and the probes'); n/a for the peers.",
        "",
    ]
    head = ["variant", "rate", "offered/s", "answered/s", "p50", "p99", "p99 range", "p99.9", "max", "errors"]
    head += ["timeouts", "items/call", "held", "server CPU", "gen. CPU", "lag p99 ms", "conns", "on schedule"]
    order = {"sweep": 0, "alone": 1, "mixed": 2}
    shape_order = list(shapes)
    groups = sorted(
        {(s.scenario, s.shape, s.mixed) for s in summary.values()},
        key=lambda k: (order.get(k[0], 3), shape_order.index(k[1]) if k[1] in shape_order else len(shape_order)),
    )
    for scenario, shape, mixed in groups:
        title = shapes.get(shape, shape)
        if scenario == "alone":
            title += ", the mixed scenario's arrivals alone"
        elif scenario == "mixed":
            title += f", beside {mixed} closed-loop connections"
        lines += [f"### {title}", ""]
        rows = []
        for r in sorted({s.rate for s in summary.values() if s.shape == shape and s.scenario == scenario}):
            for v in variants:
                s = summary.get((v, shape, r, scenario))
                if s is None:
                    continue
                rows.append(
                    [
                        v,
                        _rate_label(s.rate, s.fraction),
                        _rate(s.offered_rps),
                        _rate(s.answered_rps),
                        _ms(s.p50_ms),
                        _ms(s.p99_ms),
                        f"{_ms(s.p99_low)}-{_ms(s.p99_high)}",
                        _ms(s.p999_ms),
                        _ms(s.max_ms),
                        str(s.errors),
                        str(s.timeouts),
                        _f1(s.items_per_call),
                        "n/a" if s.hold_share is None else f"{100 * s.hold_share:.1f} %",
                        _pct(s.server_cpu),
                        _pct(s.gen_cpu),
                        _ms(s.lag_p99_ms),
                        str(s.connections),
                        "yes" if s.held else "**no**",
                    ]
                )
        lines += [*_table(head, rows), ""]
    return lines


def _shape_name(shape: str) -> str:
    """A shape as a table names it: ``Poisson``, ``on/off:50/150``."""
    return "Poisson" if shape == "poisson" else shape.replace("onoff", "on/off")


def _in_target_range(s: OpenSummary | OpenStep) -> bool:
    lo, hi = TARGET_FRACTIONS
    return s.fraction is not None and lo * (1 - SLACK) <= s.fraction <= hi * (1 + SLACK)


# ---------------------------------------------------------------------- paired rounds
#
# One step's p99 on a shared 2-core machine moves by two times or more from one round to the next, so a verdict on
# the medians of three rounds is a draw. Each round runs every variant once, minutes apart, at the same rates: the
# rounds pair them, and the sign test says how often two alike variants would split the pairs at least as unevenly.


def paired_counts(steps: Iterable[OpenStep], a: str, b: str, shape: str) -> tuple[int, int]:
    """Over the sweep's steps of ``shape`` from 10 to 90 % of saturation, the (rate, round) pairs where ``a`` and
    ``b`` both ran and differed: in how many ``a`` had the lower tail (:func:`_tail`), and how many there were (a
    tie counts in neither)."""
    tails: dict[tuple[str, float, int], tuple[float, float]] = {}
    for s in steps:
        if s.scenario == "sweep" and s.shape == shape and s.variant in (a, b) and _in_target_range(s):
            tails[(s.variant, s.rate, s.round)] = _tail(s)
    lower = pairs = 0
    for (variant, rate, rnd), tail in tails.items():
        other = tails.get((b, rate, rnd))
        if variant == a and other is not None and tail != other:
            pairs += 1
            lower += tail < other
    return lower, pairs


def sign_test(lower: int, pairs: int) -> float:
    """The two-sided sign test: the probability that two alike variants split ``pairs`` paired rounds at least as
    unevenly as ``lower`` against ``pairs - lower``."""
    k = min(lower, pairs - lower)
    return min(1.0, 2 * sum(math.comb(pairs, i) for i in range(k + 1)) / 2**pairs) if pairs else 1.0


def p_text(p: float) -> str:
    """A probability to two places, ``< 0.01`` below them."""
    return "< 0.01" if p < 0.005 else f"{p:.2f}"


def paired_rows(steps: list[OpenStep], variants: list[str]) -> list[list[str]]:
    """Rows (variant, against, arrivals, lower p99 in, p) for each variant of ours against plain greedy dispatch and
    each peer, for each arrival shape."""
    rows = []
    against = [v for v in variants if v == GREEDY or v in PEER_NAMES]
    for v in (v for v in variants if is_ours(v)):
        for ref in (r for r in against if r != v):
            for shape in _shapes(steps):
                lower, pairs = paired_counts(steps, v, ref, shape)
                if pairs:
                    rows.append([v, ref, _shape_name(shape), f"{lower} of {pairs}", p_text(sign_test(lower, pairs))])
    return rows


def paired_section(steps: list[OpenStep], variants: list[str]) -> list[str]:
    """The paired rounds' section of the report (empty without two variants to pair)."""
    rows = paired_rows(steps, variants)
    if not rows:
        return []
    text = (
        "One step's p99 moves by two times or more from one round to the next on a shared machine; each round runs "
        "every variant once, at the same rates, minutes apart. Over the rounds and rates from 10 to 90 % of the "
        "saturation: in how many pairs the variant had the lower p99 than the other, and the sign test's two-sided "
        "`p`, how often two alike variants would split the pairs at least as unevenly (below 0.05: this run tells "
        "them apart; above, read the medians' verdicts as draws). `python -m benchmarks.openloop.paired CSV...` "
        "pools the pairs of several runs."
    )
    head = ["variant", "against", "arrivals", "lower p99 in", "p (sign test)"]
    return ["## Paired rounds: which had the lower p99", "", text, "", *_table(head, rows), ""]


def _times(a: float, b: float) -> str:
    """`` (1.23x)``: a / b, where both are finite (a timeout has no ratio)."""
    return f" ({a / b:.2f}x)" if math.isfinite(a) and math.isfinite(b) and b > 0 else ""


def _failed(s: OpenSummary | OpenStep) -> float:
    return (s.errors + s.timeouts) / s.scheduled if s.scheduled else 0.0


def _tail(s: OpenSummary | OpenStep) -> tuple[float, float]:
    """What "a lower p99" compares: the p99, then, between two beyond the timeout, the share that failed."""
    return (s.p99_ms, _failed(s) if math.isinf(s.p99_ms) else 0.0)


def _tail_within(a: OpenSummary, b: OpenSummary, factor: float) -> tuple[str, str]:
    """Whether ``a``'s p99 is at most ``factor`` times ``b``'s (a :func:`verdict`), and the measured text. Where
    both p99s are beyond the timeout (a p99 of "timeout"), their shares of failed requests are compared instead,
    with the same factor."""
    if math.isinf(a.p99_ms) and math.isinf(b.p99_ms):
        ok = _failed(a) <= factor * _failed(b)
        detail = f"p99 timeout vs timeout: {_failed(a) * 100:.0f} % vs {_failed(b) * 100:.0f} % failed"
        return verdict(ok, decided=True), detail
    ok = a.p99_ms <= factor * b.p99_ms
    # Decided: every pairing of the two variants' rounds agrees (the ranges are apart by the factor).
    decided = a.p99_high <= factor * b.p99_low if ok else a.p99_low > factor * b.p99_high
    return verdict(ok, decided), f"p99 {_ms(a.p99_ms)} vs {_ms(b.p99_ms)} ms{_times(a.p99_ms, b.p99_ms)}"


def verdict(ok: bool, decided: bool) -> str:
    """PASS or FAIL, on the medians of the rounds; marked "(rounds overlap)" where some round of one variant and
    some round of the other would have given the other verdict: a difference this machine's noise can make or
    hide at this number of rounds."""
    return ("PASS" if ok else "FAIL") + ("" if decided else " (rounds overlap)")


def _held(*summaries: OpenSummary) -> str:
    return "" if all(s.held for s in summaries) else " (generator lagged †)"


def open_target_rows(steps: list[OpenStep], variants: list[str], slo_ms: float) -> list[list[str]]:
    """Rows (variant, scope, target, measured, verdict) for issue 24's open-loop targets, for every variant of ours:

    - every arrival shape (Poisson, bursts), every rate from 10 % to 90 % of saturation: p99 at most 1.1x
      ``ours-greedy``'s and at most every peer's (the lowest peer p99 at that rate); where both p99s are beyond the
      timeout, the shares of requests that failed are compared instead;
    - goodput at p99 <= ``slo_ms`` (Poisson) at least 1.1x the best peer's;
    - mixed: the open-loop part's p99 at most 1.2x its p99 alone at the same rate.
    """
    summary = summarise(steps)
    peers = [v for v in variants if v in PEER_NAMES]
    rows: list[list[str]] = []
    ours = [v for v in variants if is_ours(v)]
    for v in ours:
        for s in sorted(
            (s for s in summary.values() if s.variant == v and s.scenario == "sweep"),
            key=lambda s: (s.shape != "poisson", s.shape, s.rate),
        ):
            if not _in_target_range(s):
                continue
            scope = f"{_shape_name(s.shape)} {_rate_label(s.rate, s.fraction)}"
            greedy = summary.get((GREEDY, s.shape, s.rate, "sweep"))
            if greedy is not None and v != GREEDY:
                result, detail = _tail_within(s, greedy, 1.1)
                detail += _held(s, greedy)
                rows.append([v, scope, f"p99 ≤ 1.1x {GREEDY}'s", detail, result])
            others = [summary[(p, s.shape, s.rate, "sweep")] for p in peers if (p, s.shape, s.rate, "sweep") in summary]
            if others:
                best = min(others, key=_tail)
                result, detail = _tail_within(s, best, 1.0)
                detail += f" ({best.variant})" + _held(s, best)
                rows.append([v, scope, "p99 ≤ every peer's", detail, result])
        mine = goodput(summary, v, "poisson", slo_ms)
        theirs = [(p, goodput(summary, p, "poisson", slo_ms)) for p in peers]
        theirs_present = [(p, g) for p, g in theirs if g is not None]
        if mine is not None and theirs_present:
            name, best_g = max(theirs_present, key=lambda pg: pg[1].rate)
            ok = mine.rate > 0 and mine.rate >= 1.1 * best_g.rate
            times = f"{mine.rate / best_g.rate:.2f}x" if best_g.rate else "n/a"
            detail = f"{_rate(mine.rate)} vs {_rate(best_g.rate)} req/s ({name}): {times}"
            detail += "" if mine.held and best_g.held else " (generator lagged †)"
            rows.append(
                [v, f"Poisson, p99 ≤ {slo_ms:g} ms", "goodput ≥ 1.1x the best peer's", detail, "PASS" if ok else "FAIL"]
            )
        for m in (s for s in summary.values() if s.variant == v and s.scenario == "mixed"):
            alone = summary.get((v, m.shape, m.rate, "alone"))
            if alone is None:
                continue
            result, detail = _tail_within(m, alone, 1.2)
            detail = "mixed vs alone: " + detail + _held(m, alone)
            scope = f"mixed: {_rate_label(m.rate, m.fraction)} + {m.mixed} closed-loop connections"
            rows.append([v, scope, "p99 ≤ 1.2x alone", detail, result])
    return rows


def write_csv(path: Path, steps: list[OpenStep]) -> None:
    fields = [f.name for f in dataclasses.fields(OpenStep)]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for s in steps:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in dataclasses.asdict(s).items()})


def read_csv(path: Path) -> list[OpenStep]:
    """The steps :func:`write_csv` wrote (to render a report again)."""
    return read_rows(path, OpenStep)


def read_rows(path: Path, cls: type[_Row]) -> list[_Row]:
    """The rows of a CSV that a report wrote from dataclass ``cls`` (one column a field), as ``cls``: an empty cell
    is ``None`` where the field allows it."""
    fields: Any = dataclasses.fields(cls)  # type: ignore[arg-type]
    types = {f.name: str(f.type) for f in fields}
    out = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            values: dict[str, object] = {}
            for k, raw in row.items():
                kind = types[k]
                if raw == "" and "None" in kind:
                    values[k] = None
                elif kind.startswith("int"):
                    values[k] = int(raw)
                elif kind == "bool":
                    values[k] = raw == "True"
                elif kind == "str":
                    values[k] = raw
                else:
                    values[k] = float(raw)
            out.append(cls(**values))
    return out


def _short(shape: str) -> str:
    """A chart's title for a shape: ``Poisson``, ``on/off 50/150 ms``."""
    return "Poisson" if shape == "poisson" else shape.replace("onoff:", "on/off ") + " ms"


def write_png(path: Path, steps: list[OpenStep], variants: list[str], slo_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarise(steps)
    names = _shapes(steps)
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(6 * (len(names) + 1), 4.8), squeeze=False)
    cap = 10_000.0  # a p99 on a timeout is drawn at the top of the axis
    for ax, shape in zip(axes[0], names, strict=False):
        for v in variants:
            pts = sorted(
                (s for s in summary.values() if s.variant == v and s.shape == shape and s.scenario == "sweep"),
                key=lambda s: s.rate,
            )
            if not pts:
                continue
            line = ax.plot([s.rate for s in pts], [min(s.p99_ms, cap) for s in pts], marker="o", label=v)[0]
            lagged = [s for s in pts if not s.held]
            if lagged:
                ax.plot(
                    [s.rate for s in lagged],
                    [min(s.p99_ms, cap) for s in lagged],
                    "x",
                    color=line.get_color(),
                    markersize=10,
                )
        ax.axhline(slo_ms, color="grey", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("offered rate, requests/s")
        ax.set_title(f"p99 ms, {_short(shape)} (log; x: the generator lagged)", fontsize=9)
        ax.grid(alpha=0.3)
    ax = axes[0][-1]
    for v in variants:
        pts = sorted(
            (
                s
                for s in summary.values()
                if s.variant == v
                and s.shape == (names[0] if names else "")
                and s.scenario == "sweep"
                and s.items_per_call is not None
            ),
            key=lambda s: s.rate,
        )
        if pts:
            ax.plot([s.rate for s in pts], [s.items_per_call for s in pts], marker="o", label=v)
    ax.set_xlabel("offered rate, requests/s")
    ax.set_title(f"items per model call, {_short(names[0]) if names else ''}", fontsize=9)
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Open loop: one Keras model behind one FastAPI app, per batcher (dashed: the SLO, {slo_ms:g} ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
