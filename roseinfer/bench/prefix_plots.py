"""`bench prefix` plots (written beside --json)."""

from __future__ import annotations

from typing import Any


def plot_w3(w3: dict[str, Any], path: str) -> str | None:
    """TTFT p99 and E2E p99 vs rate, cache on vs off; None (quietly) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
