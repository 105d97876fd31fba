"""`bench offload`'s tables, its load floor (bytes over the measured pinned host-to-device bandwidth) and plots."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from roseinfer.bench.env import median_time
from roseinfer.bench.plots import _save, _title, pyplot, report_plot_path


def measure_h2d_bandwidth(device: torch.device, nbytes: int = 256 * 2**20) -> float | None:
    """Bytes per second of one pinned host-to-device copy of `nbytes` (None off CUDA)."""
    if device.type != "cuda":
        return None
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    seconds = median_time(lambda: dev.copy_(host, non_blocking=True), device, warmup=2, repeats=5)
    return nbytes / seconds


def load_floor(row: dict[str, Any], info: dict[str, Any]) -> float | None:
    """Seconds the run's loads take at the measured bandwidth: the least the CPU tier can cost it."""
    bw = info.get("h2d_bytes_per_s")
    return row["loaded_tokens"] * info["kv_bytes_per_token"] / bw if bw else None


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(
    res: dict[str, list[dict[str, Any]]],
    info: dict[str, Any],
    head: tuple[str, str],
    key: Callable[[dict[str, Any]], str],
    cell: Callable[[dict[str, Any], str], str],
    width: int,
) -> list[str]:
    """A title, a header row of configurations, then a row per point: `key` of the point, each configuration's
    `cell` (given the run and its load floor)."""
    configs = list(res)
    lines = [head[0], head[1] + "".join(f"{c:>{width}}" for c in configs)]
    for i, row in enumerate(next(iter(res.values()))):
        cells = [cell(res[c][i], _cell(load_floor(res[c][i], info), ".3f")) for c in configs]
        lines.append(key(row) + "".join(f"{c:>{width}}" for c in cells))
    return lines


def format_w6(res: dict[str, list[dict[str, Any]]], info: dict[str, Any]) -> str:
    title = "== W6 hit-rate sweep: req/s per h (hit tokens / loaded tokens; load floor s) =="
    lines = _table(
        res,
        info,
        (title, "h     "),
        lambda row: f"{row['h']:<6.2f}",
        lambda r, floor: f"{r['req_per_s']:>9.2f} ({r['hit_tokens']:>8}/{r['loaded_tokens']:>8}; {floor:>5})",
        34,
    )
    return "\n".join(lines + [_compiles(res)])


def format_w7(res: dict[str, list[dict[str, Any]]], info: dict[str, Any]) -> str:
    title = "== W7 long-prompt rounds: req/s per output length N and round (loaded tokens; load floor s) =="
    lines = _table(
        res,
        info,
        (title, "N     round"),
        lambda row: f"{row['N']:<6}{row['round']:<5}",
        lambda r, floor: f"{r['req_per_s']:>9.2f} ({r['loaded_tokens']:>8}; {floor:>5})",
        30,
    )
    bw = info.get("h2d_bytes_per_s")
    if bw:
        lines.append(
            f"pinned host-to-device copy: {bw / 1e9:.1f} GB/s; KV {info['kv_bytes_per_token']} B/token"
        )
    return "\n".join(lines + [_compiles(res)])


def format_beside_peer(
    workload: str,
    ours: dict[str, list[dict[str, Any]]],
    theirs: dict[str, list[dict[str, Any]]],
    version: str,
) -> str:
    """A row per point, a column per configuration both engines ran: roseinfer's req/s, vLLM's, and their ratio."""
    configs = [c for c in ours if c in theirs]
    key = (lambda r: f"{r['h']:<12.2f}") if workload == "W6" else (lambda r: f"{r['N']:<6}{r['round']:<6}")
    lines = [
        f"== {workload} beside vLLM {version}: req/s, roseinfer / vLLM (roseinfer over vLLM) ==",
        ("h" if workload == "W6" else "N     round").ljust(12) + "".join(f"{c:>28}" for c in configs),
    ]
    for i, row in enumerate(ours[configs[0]] if configs else []):
        cells = []
        for c in configs:
            a, b = ours[c][i]["req_per_s"], theirs[c][i]["req_per_s"]
            cells.append(f"{a:>9.2f} / {b:>8.2f} ({a / b:.2f}x)")
        lines.append(key(row) + "".join(f"{cell:>28}" for cell in cells))
    return "\n".join(lines)


def _compiles(res: dict[str, list[dict[str, Any]]]) -> str:
    n = sum(r.get("compiles", 0) for rows in res.values() for r in rows)
    return f"Triton compiles in the timed runs: {n}"


def plot_offload(report: dict[str, Any], base: str) -> dict[str, str]:
    """W6: req/s against h per configuration; W7: req/s against N, rounds 1 and 3, per configuration."""
    plt = pyplot()
    if plt is None:
        return {}
    made = {}
    results, title = report["results"], _title(report["header"])
    if "W6" in results:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, rows in results["W6"].items():
            ax.plot([r["h"] for r in rows], [r["req_per_s"] for r in rows], "o-", label=name)
        ax.set(xlabel="hit rate h (share of each prompt seen before)", ylabel="req/s", title=f"W6: {title}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        made["W6"] = report_plot_path(base, "W6")
        _save(plt, fig, made["W6"])
    if "W7" in results:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, rows in results["W7"].items():
            for round_, style in ((1, "o--"), (3, "s-")):
                pts = [r for r in rows if r["round"] == round_]
                ax.plot(
                    [r["N"] for r in pts],
                    [r["req_per_s"] for r in pts],
                    style,
                    label=f"{name} round {round_}",
                )
        ax.set_xscale("log", base=2)
        ax.set(xlabel="output tokens N", ylabel="req/s", title=f"W7: {title}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        made["W7"] = report_plot_path(base, "W7")
        _save(plt, fig, made["W7"])
    peer = report.get("peer", {})
    for w, theirs in peer.get("results", {}).items():
        if theirs:
            made[f"{w}_vllm"] = report_plot_path(base, f"{w}_vllm")
            _plot_beside_peer(
                plt, w, results[w], theirs, f"{w} beside vLLM {peer['version']}: {title}", made[f"{w}_vllm"]
            )
    return made


def _plot_beside_peer(
    plt: Any,
    workload: str,
    ours: dict[str, list[dict[str, Any]]],
    theirs: dict[str, list[dict[str, Any]]],
    title: str,
    path: str,
) -> None:
    """req/s per configuration, roseinfer solid and vLLM dashed in the same colour: W6 against h, W7 (round 3)
    against N."""
    fig, ax = plt.subplots(figsize=(7, 4))
    w6 = workload == "W6"
    for i, name in enumerate(c for c in ours if c in theirs):
        colour = f"C{i}"
        for engine, rows, style in (("roseinfer", ours[name], "o-"), ("vLLM", theirs[name], "s--")):
            pts = rows if w6 else [r for r in rows if r["round"] == 3]
            xs = [r["h"] if w6 else r["N"] for r in pts]
            ax.plot(xs, [r["req_per_s"] for r in pts], style, color=colour, label=f"{engine} {name}")
    if not w6:
        ax.set_xscale("log", base=2)
    xlabel = "hit rate h" if w6 else "output tokens N (round 3)"
    ax.set(xlabel=xlabel, ylabel="req/s", title=title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    _save(plt, fig, path)
