"""Bench reports as PNG plots, and `roseinfer bench plot REPORT.json`, which draws a saved report again.

Plots need matplotlib (the `plots` extra). Without it a plot is skipped quietly (the functions return None):
the GPU machine may lack it, so a report written there with `--json` can be drawn later where it is installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from types import ModuleType
from typing import Any


def pyplot() -> ModuleType | None:
    """matplotlib.pyplot on the file-only Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def report_plot_path(base: str, name: str) -> str:
    """Where a report's plot `name` goes: `<base>.<name>.png`, base being the report's path less `.json`."""
    return f"{base.removesuffix('.json')}.{name}.png"


def _save(plt: ModuleType, fig: Any, path: str) -> None:
    """Lays out, writes (its folder made if missing) and closes a figure."""
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finish_log_x(ax: Any, ticks: list[float], label: str = "{:g}") -> None:
    """A log x axis labelled at `ticks` only, a light grid and a small legend."""
    ax.set_xticks(ticks, [label.format(t) for t in ticks])
    ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def _title(header: dict[str, Any]) -> str:
    return f"{header.get('model_shape', '?')} on {header.get('device', '?')} at {header.get('commit', '?')}"


def plot_w3(w3: dict[str, Any], path: str) -> str | None:
    """W3: TTFT p99 and E2E p99 against the arrival rate, prefix cache on vs off."""
    plt = pyplot()
    if plt is None:
        return None
    fig, (ax_ttft, ax_e2e) = plt.subplots(1, 2, figsize=(11, 4))
    for cache, style in (("off", "o--"), ("on", "s-")):
        rows = sorted((r for r in w3["rows"] if r["cache"] == cache), key=lambda r: r["rate"])
        rates = [r["rate"] for r in rows]
        ax_ttft.plot(rates, [r["ttft_p99_ms"] for r in rows], style, label=f"prefix cache {cache}")
        ax_e2e.plot(rates, [r["e2e_p99_s"] for r in rows], style, label=f"prefix cache {cache}")
    ax_e2e.axhline(w3["workload"]["slo_p99_s"], color="gray", linestyle=":", label="SLO")
    ax_ttft.set(xlabel="arrival rate (req/s)", ylabel="TTFT p99 (ms)", title="W3 TTFT p99", yscale="log")
    ax_e2e.set(xlabel="arrival rate (req/s)", ylabel="E2E p99 (s)", title="W3 E2E p99")
    for ax in (ax_ttft, ax_e2e):
        ax.grid(True, alpha=0.3)
        ax.legend()
    _save(plt, fig, path)
    return path


def plot_w8(report: dict[str, Any], path: str) -> str | None:
    """W8: TTFT and TPOT (p50, p99) and output tokens/s against the offered arrival rate (finite rates only); a
    peer's rows (`report["peer"]`, vLLM from `--peer vllm`) as dotted lines of the same colours."""
    plt = pyplot()
    if plt is None:
        return None

    def finite(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted((r for r in rows if math.isfinite(r["rate"])), key=lambda r: r["rate"])

    rows = finite(report["rows"])
    if not rows:  # only `inf` (every request at once): no rate axis to draw on
        return None
    peer = report.get("peer") or {}
    series = [("roseinfer", rows, ("o-", "s--"))]
    if peer.get("rows"):
        series.append((f"vLLM {peer.get('version', '')}".strip(), finite(peer["rows"]), ("x:", "+:")))
    rates = [r["rate"] for r in rows]
    fig, (ax_lat, ax_tput) = plt.subplots(1, 2, figsize=(11, 4))
    for engine, engine_rows, styles in series:
        x = [r["rate"] for r in engine_rows]
        prefix = "" if len(series) == 1 else f"{engine} "
        for name, color in (("ttft", "tab:blue"), ("tpot", "tab:orange")):
            for q, style in zip(("p50", "p99"), styles):
                y = [r[f"{name}_{q}_ms"] for r in engine_rows]
                ax_lat.plot(x, y, style, color=color, label=f"{prefix}{name.upper()} {q}")
        ax_tput.plot(x, [r["output_tok_s"] for r in engine_rows], styles[0], label=f"{prefix}output tok/s")
    if report.get("saturated_at") is not None:
        ax_tput.axvline(report["saturated_at"], color="gray", linestyle=":", label="saturated")
    ax_lat.set(xlabel="arrival rate (req/s)", ylabel="ms", title="W8 latency", xscale="log", yscale="log")
    ax_tput.set(xlabel="arrival rate (req/s)", ylabel="output tok/s", title="W8 throughput", xscale="log")
    for ax in (ax_lat, ax_tput):
        _finish_log_x(ax, rates)
    fig.suptitle(_title(report.get("header", {})))
    _save(plt, fig, path)
    return path


def roofline_series(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the roofline plot draws, from `bench roofline`'s rows (skipped rows left out): per decode context,
    the batches and both timings as multiples of the floor; the prefill token counts and % of the matmul rate."""
    decode: dict[int, dict[str, list[float]]] = {}
    for r in sorted(
        (r for r in rows if r["kind"] == "decode" and "skipped" not in r), key=lambda r: r["batch"]
    ):
        series = decode.setdefault(r["context"], {"batch": [], "x_floor": [], "steady_x_floor": []})
        series["batch"].append(r["batch"])
        series["x_floor"].append(r["x_floor"])
        series["steady_x_floor"].append(r.get("steady_x_floor", math.nan))
    prefill = sorted(
        (r for r in rows if r["kind"] == "prefill" and "skipped" not in r), key=lambda r: r["tokens"]
    )
    return {
        "decode": dict(sorted(decode.items())),
        "prefill_tokens": [r["tokens"] for r in prefill],
        "prefill_pct": [r["pct_matmul_rate"] for r in prefill],
    }


def plot_roofline(result: dict[str, Any], path: str) -> str | None:
    """`bench roofline`: decode step time over its byte floor by batch (a line per context, one step at a time
    and steady), and prefill's share of the measured matmul rate by prompt length."""
    plt = pyplot()
    if plt is None:
        return None
    series = roofline_series(result["rows"])
    fig, (ax_dec, ax_pre) = plt.subplots(1, 2, figsize=(12, 4.5))
    for context, s in series["decode"].items():
        (line,) = ax_dec.plot(s["batch"], s["x_floor"], "o--", label=f"ctx {context}, one step at a time")
        ax_dec.plot(
            s["batch"], s["steady_x_floor"], "s-", color=line.get_color(), label=f"ctx {context}, steady"
        )
    ax_dec.axhline(1.0, color="gray", linestyle=":", label="floor (bytes / copy bandwidth)")
    ax_dec.set(
        xlabel="batch (sequences)",
        ylabel="step time / floor",
        title=f"decode (copy {result['bandwidth_TBps']:.2f} TB/s)",
        ylim=(0, None),
    )
    ax_dec.set_xscale("log", base=2)
    batches = sorted({b for s in series["decode"].values() for b in s["batch"]})
    ax_dec.set_xticks(batches, [str(b) for b in batches])
    labels = [str(n) for n in series["prefill_tokens"]]
    bars = ax_pre.bar(labels, series["prefill_pct"], color="tab:green")
    ax_pre.bar_label(bars, fmt="%.0f%%")
    ax_pre.axhline(100.0, color="gray", linestyle=":", label="measured matmul rate")
    ax_pre.set(
        xlabel="prompt tokens",
        ylabel="% of matmul rate",
        title=f"prefill (matmul {result['matmul_TFLOPs']:.0f} TFLOP/s)",
        ylim=(0, 110),
    )
    for ax in (ax_dec, ax_pre):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"roofline: {_title(result['header'])}")
    _save(plt, fig, path)
    return path


def plot_decode(report: dict[str, Any], path: str) -> str | None:
    """`bench decode`: each engine's step time by batch, per context, and (on a GPU) as a multiple of the floor."""
    plt = pyplot()
    if plt is None or not report.get("rows"):
        return None
    rows = report["rows"]
    floors = all("floor_ms" in r for r in rows)
    peer = any("peer_step_ms" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if floors else 1, figsize=(11 if floors else 6, 4), squeeze=False)
    panels = [("step_ms", "peer_step_ms", "ms a step", "decode step")]
    if floors:
        panels.append(("x_floor", "peer_x_floor", "x floor", "decode step / its floor"))
    for ax, (ours, theirs, ylabel, title) in zip(axes[0], panels):
        for context in sorted({r["context"] for r in rows}):
            cells = sorted((r for r in rows if r["context"] == context), key=lambda r: r["batch"])
            batches = [r["batch"] for r in cells]
            ax.plot(batches, [r[ours] for r in cells], "o-", label=f"roseinfer ctx {context}")
            if peer:
                ax.plot(batches, [r.get(theirs) for r in cells], "x:", label=f"vLLM ctx {context}")
        if ours == "x_floor":
            ax.axhline(1.0, color="gray", linestyle="--", label="floor")
        ax.set(xlabel="batch", ylabel=ylabel, title=title, xscale="log")
        _finish_log_x(ax, sorted({r["batch"] for r in rows}))
    fig.suptitle(_title(report.get("header", {})))
    _save(plt, fig, path)
    return path


def plot_report(report: dict[str, Any], base: str) -> dict[str, str | None]:
    """Every plot a saved report holds, written as `<base>.<name>.png`: name -> path (None: not drawn)."""
    if not isinstance(report, dict):
        raise ValueError("a report is a JSON object")
    workload = report.get("header", {}).get("workload")
    if workload == "roofline" and "rows" in report:
        return {"roofline": plot_roofline(report, report_plot_path(base, "roofline"))}
    if workload == "W8" and "rows" in report:
        return {"W8": plot_w8(report, report_plot_path(base, "W8"))}
    if workload == "decode-steps" and "rows" in report:
        return {"decode": plot_decode(report, report_plot_path(base, "decode"))}
    if "W3" in report.get("results", {}):
        return {"W3": plot_w3(report["results"]["W3"], report_plot_path(base, "W3"))}
    if {"W6", "W7"} & set(report.get("results", {})):
        from roseinfer.bench.offload_report import plot_offload

        made = plot_offload(report, base)
        beside = [f"{w}_vllm" for w, rows in report.get("peer", {}).get("results", {}).items() if rows]
        return {w: made.get(w) for w in [w for w in ("W6", "W7") if w in report["results"]] + beside}
    raise ValueError(
        f"no plot for this report (workload {workload!r}): plots are drawn for `bench roofline`, `bench serve`,"
        " `bench decode`, `bench offload` and `bench prefix` reports with W3"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "report",
        help="a report that `bench roofline`, `bench serve`, `bench decode`, `bench offload` or `bench prefix` wrote "
        "with --json",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="BASE",
        help="write <BASE>.<plot>.png (default: the report's path less .json)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        with open(args.report) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"bench plot: cannot read {args.report}: {e}") from e
    if pyplot() is None:
        raise SystemExit("bench plot needs matplotlib: pip install 'roseinfer[plots]'")
    try:
        made = plot_report(report, args.out or args.report)
    except ValueError as e:
        raise SystemExit(f"bench plot: {e}") from e
    for name, path in made.items():
        print(f"plot {name}: {path}")
    return 0
