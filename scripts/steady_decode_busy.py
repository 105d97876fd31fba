"""GPU busy share of steady decode without the profiler's slowdown: the kernel time of a decode step in a
GPU-only trace (`trace-sql --example decode-busy`) over the median decode step of an untraced run of the
same workload (`bench throughput --json`, continuous mode). Kernel durations do not depend on how fast
the host is; the step period of a traced run does, since tracing makes every graph launch dearer. The trace
does slow the kernels a little (at 77d7367, 1,169 us of traced kernels a step against a 1,141 us untraced
step), so a saturated device can read over 100%.

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
    share = 100 * busy["busy_us_per_step"] / period_us
    print(f"steady decode busy: {share:.1f}% of the untraced step")
    if share > 100:
        # The trace slows the kernels themselves by at least the excess, so past 100% the figure says only
        # that the untraced step has no idle time this method can see.
        print("  over 100%: the traced kernels alone outlast the untraced step; the device is saturated")


if __name__ == "__main__":
    main(*sys.argv[1:3])
