"""GPU busy share of steady decode without the profiler's slowdown: the kernel time of a decode step in a
GPU-only trace (`trace-sql --example decode-busy`) over the median decode step of an untraced run of the
same workload (`bench throughput --json`, continuous mode). Kernel durations do not depend on how fast
the host is; the step period of a traced run does, since tracing makes every graph launch dearer.

Usage: python scripts/steady_decode_busy.py TRACE.json UNTRACED_REPORT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from roseinfer.trace_sql import example_sql, query_trace


def main(trace: str, report: str) -> None:
    columns, rows = query_trace(trace, example_sql("decode-busy"))
    busy = dict(zip(columns, rows[0]))
    extra = json.loads(Path(report).read_text())["results"]["continuous"]["extra"]
    period_us = extra["decode_step_median_s"] * 1e6
    print(
        f"traced: {busy['busy_pct']}% busy over {busy['window_ms']:.1f} ms, {busy['steps']} steps, "
        f"{busy['busy_us_per_step']} us of kernels per step"
    )
    print(f"untraced: {extra['num_decode_steps']} decode steps, median {period_us:.1f} us")
    print(f"steady decode busy: {100 * busy['busy_us_per_step'] / period_us:.1f}% of the untraced step")


if __name__ == "__main__":
    main(*sys.argv[1:3])
