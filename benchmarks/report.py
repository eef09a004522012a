"""Render a benchmark's results (``reports/keras/results.json``) as reports/keras.md with its plots.

``python -m benchmarks.run`` calls :func:`write`; ``python -m benchmarks.report`` renders the saved results
again (after editing this file or the tuning notes) without re-running the load.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path
from typing import Any

from benchmarks.provenance import regenerated_by

__all__ = ["P95_LIMIT_MS", "headline", "main", "write"]

ROOT = Path(__file__).resolve().parents[1]
#: The hand-written part of the report: what was measured while tuning, with the commands.
TUNING_NOTES = ROOT / "benchmarks" / "keras_tuning.md"
#: The latency a step must keep at p95 to count for the batched endpoint's headline figure.
P95_LIMIT_MS = 100.0
#: The targets the report checks: batched vs unbatched, and batched vs the no-model HTTP ceiling.
TARGET_GAIN = 4.0
TARGET_CEILING_SHARE = 0.8

LABELS = {
    "/predict": "/predict (no batching)",
    "/optimized_predict": "/optimized_predict (async-batcher)",
    "/echo_await": "/echo_await (no model, awaits once)",
    "/echo": "/echo (no model: HTTP ceiling)",
}


def _by_endpoint(steps: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for step in steps:
        grouped.setdefault(step["endpoint"], []).append(step)
    for rows in grouped.values():
        rows.sort(key=lambda s: s["users"])
    return grouped


def _best(rows: list[dict[str, Any]], *, p95_limit: float | None = None) -> dict[str, Any] | None:
    eligible = [
        s for s in rows if s["failures"] == 0 and s["requests"] > 0 and (p95_limit is None or s["p95_ms"] <= p95_limit)
    ]
    return max(eligible, key=lambda s: s["rps"], default=None)


def headline(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the report leads with.

    The unbatched endpoint is credited with its best step at any latency (generous to the baseline); the batched
    one with its best step at p95 <= P95_LIMIT_MS; the ceilings are the no-model endpoints' best steps. Steps
    with failures count for none of them.
    """
    grouped = _by_endpoint(steps)
    predict = _best(grouped.get("/predict", []))
    optimized = _best(grouped.get("/optimized_predict", []), p95_limit=P95_LIMIT_MS)
    ceiling = _best(grouped.get("/echo", []))
    awaiting = _best(grouped.get("/echo_await", []))
    gain = optimized["rps"] / predict["rps"] if optimized and predict else math.nan
    share = optimized["rps"] / ceiling["rps"] if optimized and ceiling else math.nan
    return {
        "predict": predict,
        "optimized": optimized,
        "ceiling": ceiling,
        "awaiting": awaiting,
        "gain": gain,
        "ceiling_share": share,
    }


def _fmt(value: float | None, spec: str = ".0f", none: str = "-") -> str:
    return none if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _plots(grouped: dict[str, list[dict[str, Any]]], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    # One figure, two panels (throughput, p95 latency), so that the report is one image.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), dpi=110)
    ticks = sorted({s["users"] for rows in grouped.values() for s in rows})
    for ax, (metric, ylabel, log) in zip(
        axes, (("rps", "requests/s", False), ("p95_ms", "p95 latency (ms)", True)), strict=True
    ):
        for endpoint, rows in grouped.items():
            users = [s["users"] for s in rows]
            ax.plot(users, [s[metric] for s in rows], marker="o", label=LABELS.get(endpoint, endpoint))
        if metric == "p95_ms":
            ax.axhline(P95_LIMIT_MS, color="grey", linestyle=":", linewidth=1, label=f"{P95_LIMIT_MS:.0f} ms")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrent users (each keeps one request in flight)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"Keras example: {ylabel} against users")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    filename = "throughput_latency.png"
    fig.savefig(out_dir / filename)
    plt.close(fig)
    return [filename]


def _summary_csv(steps: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(steps[0]))
        writer.writeheader()
        writer.writerows(steps)


def _step_table(steps: list[dict[str, Any]]) -> list[str]:
    header = "| endpoint | users | requests/s | p50 ms | p95 ms | p99 ms | failures | items/batch | server CPU |"
    lines = [header + " locust CPU |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for s in sorted(steps, key=lambda s: (list(LABELS).index(s["endpoint"]), s["users"])):
        server_cpu = s["server_cpu_s"] / s["wall_s"] * 100 if s["server_cpu_s"] is not None else None
        lines.append(
            f"| `{s['endpoint']}` | {s['users']} | {s['rps']:.0f} | {s['p50_ms']:.0f} | {s['p95_ms']:.0f} |"
            f" {s['p99_ms']:.0f} | {s['failures']} | {_fmt(s['mean_batch_size'], '.1f')} |"
            f" {_fmt(server_cpu)} % | {s['locust_cpu_s'] / s['wall_s'] * 100:.0f} % |"
        )
    return lines


def _per_users_table(grouped: dict[str, list[dict[str, Any]]]) -> list[str]:
    """requests/s side by side at each user count: the endpoints of one row ran minutes apart at most."""
    at = {(e, s["users"]): s for e, rows in grouped.items() for s in rows}
    users = sorted({u for _, u in at})
    endpoints = [e for e in LABELS if e in grouped]
    lines = [
        "| users | " + " | ".join(f"`{e}`" for e in endpoints) + " | x /predict | share of /echo |",
        "|--:|" + "--:|" * (len(endpoints) + 2),
    ]
    for u in users:
        rps = {e: at[(e, u)]["rps"] if (e, u) in at else None for e in endpoints}
        optimized, predict, echo = rps.get("/optimized_predict"), rps.get("/predict"), rps.get("/echo")
        gain = optimized / predict if optimized and predict else None
        share = optimized / echo * 100 if optimized and echo else None
        cells = " | ".join(_fmt(rps[e]) for e in endpoints)
        lines.append(f"| {u} | {cells} | {_fmt(gain, '.1f')}x | {_fmt(share)} % |")
    return lines


def _timing_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| call | batch size | p50 ms | p95 ms | µs per item |", "|---|--:|--:|--:|--:|"]
    for r in sorted(rows, key=lambda r: (r["method"], r["batch_size"])):
        lines.append(
            f"| `{r['method']}` | {r['batch_size']} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['per_item_us']:.1f} |"
        )
    return lines


def _headline_lines(head: dict[str, Any]) -> list[str]:
    p, o, c, a = head["predict"], head["optimized"], head["ceiling"], head["awaiting"]

    def ratio(step: dict[str, Any] | None, base: dict[str, Any] | None, spec: str, suffix: str) -> str:
        if not step or not base:
            return "-"
        return _fmt(step["rps"] / base["rps"] * (100 if suffix == " %" else 1), spec) + suffix

    def row(label: str, step: dict[str, Any] | None) -> str:
        if step is None:
            return f"| {label} | - | - | - | - | - | - |"
        return (
            f"| {label} | {step['rps']:.0f} | {step['users']} | {step['p95_ms']:.0f} | {ratio(step, p, '.1f', 'x')}"
            f" | {ratio(step, c, '.0f', ' %')} | {ratio(step, a, '.0f', ' %')} |"
        )

    gain, share = head["gain"], head["ceiling_share"]
    lines = [
        "| endpoint (best step) | requests/s | users | p95 ms | x /predict | share of /echo | share of /echo_await |",
        "|---|--:|--:|--:|--:|--:|--:|",
        row("`/predict`, any latency", p),
        row(f"`/optimized_predict`, p95 ≤ {P95_LIMIT_MS:.0f} ms", o),
        row("`/echo_await` (no model, awaits once)", a),
        row("`/echo` (no model)", c),
        "",
    ]
    met_gain = "met" if gain >= TARGET_GAIN else "**not met**"
    met_share = "met" if share >= TARGET_CEILING_SHARE else "**not met**"
    lines.append(
        f"Targets: `/optimized_predict` at ≥ {TARGET_GAIN:.0f}x the requests/s of `/predict`: {met_gain}"
        f" ({_fmt(gain, '.1f')}x); at ≥ {TARGET_CEILING_SHARE:.0%} of the no-model ceiling `/echo`: {met_share}"
        f" ({_fmt(share * 100)} %). Steps with failures count for neither."
    )
    return lines


def write(results: dict[str, Any], out: Path) -> str:
    """Write ``out/keras.md``, the plots and ``out/keras/summary.csv``; return the summary table as text."""
    data_dir = out / "keras"
    data_dir.mkdir(parents=True, exist_ok=True)
    steps, env = results["steps"], results["environment"]
    grouped = _by_endpoint(steps)
    plots = _plots(grouped, data_dir)
    _summary_csv(steps, data_dir / "summary.csv")
    head = headline(steps)
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    load = env.get("load_average_before")
    locust = env["locust"]
    md = [
        "# Keras example: what batching buys",
        "",
        regenerated_by("benchmark", env["command"], "BENCH_ARGS"),
        "",
        f"Generated by `{env['command']}` on {env['date']}: {env['cpus']} CPUs ({env['cpu']}), Python"
        f" {env['python']}, {versions}. Load average before the run: {_fmt(load and load[0], '.2f')}. The server"
        " and the load generator share the machine's cores, so the load generator's own CPU counts against the"
        " server; on a machine shared with other work the figures are noisy.",
        "",
        "## Result",
        "",
        *_headline_lines(head),
        "",
        *(f"![{name}](keras/{name})" for name in plots),
        "",
        "Requests/s at each user count (the endpoints of a row ran back to back, so slow drifts in the machine's"
        " other load touch them alike):",
        "",
        *_per_users_table(grouped),
        "",
        "## Every step",
        "",
        f"Each step: locust with `FastHttpUser`, `{locust['processes']}` process(es), every user sending its next"
        f" request {locust['wait_s']} s after the last answer (a closed loop), {locust['step_seconds']} s measured"
        " after all users started (`--reset-stats`). Endpoints interleaved per user count. `items/batch`: items per"
        " model call over the step, from the server's `/stats`. CPU: percent of one core over the step, locust's"
        " start-up included.",
        "",
        *_step_table(steps),
        "",
        "## The model alone",
        "",
        "The example model (49 hidden `Dense(64, relu)` layers on the 10 diabetes features), timed in a process of"
        " its own before the load test, on TensorFlow thread pools sized as the server sizes them"
        " (`python -m benchmarks.keras.timing`). A call costs nearly the same for 1 or 256 rows: that fixed cost is"
        " what batching shares out. `model.predict` is what async-batcher 0.2.2's example called.",
        "",
        *_timing_table(results["model_timing"]),
        "",
        "## How it was run",
        "",
        f"- Server: `python -m benchmarks.keras.server {env['server_args']}` on 127.0.0.1; the defaults are in"
        " `python -m benchmarks.keras.server --help`.",
        "- Data: `keras/results.json`, what this report is rendered from (`make benchmark-report`). Each run also"
        " writes, kept out of git, `keras/summary.csv` (the table above), `keras/model_timing.json`, and in"
        " `keras/raw/` locust's own files (`<endpoint>_u<users>_stats.csv`, `_stats_history.csv`, `_failures.csv`,"
        " the HTML report and its output `<endpoint>_u<users>.log`) and the server's log.",
        "- Reproduce: `make benchmark` (builds `.venv`, then runs `python -m benchmarks.run`).",
    ]
    if TUNING_NOTES.exists():
        md += ["", TUNING_NOTES.read_text().strip()]
    (out / "keras.md").write_text("\n".join(md) + "\n")
    return "\n".join(["", *_headline_lines(head), "", *_step_table(steps), "", f"report: {out / 'keras.md'}"])


def main(argv: list[str] | None = None) -> None:
    import json

    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    args = parser.parse_args(argv)
    with open(args.out / "keras" / "results.json") as f:
        print(write(json.load(f), args.out))


if __name__ == "__main__":
    main()
