"""Canned queries for `trace-sql --example NAME` (each with {range} for the record_function range)."""

from __future__ import annotations

from roseinfer.trace_sql.errors import TraceQueryError

# name -> (help, SQL with {range} for the range name)
EXAMPLES: dict[str, tuple[str, str]] = {
    "ops-in-range": (
        "top aten ops by total time inside a record_function range (--range, default forward)",
        """
SELECT s.name, COUNT(*) AS n, SUM(s.dur) / 1e6 AS total_ms, AVG(s.dur) / 1e3 AS avg_us
FROM slice s
JOIN ancestor a ON a.slice_id = s.id
JOIN slice r ON r.id = a.ancestor_id
WHERE r.name = '{range}' AND r.category = 'user_annotation' AND s.name LIKE 'aten::%'
GROUP BY s.name ORDER BY total_ms DESC LIMIT 25
""",
    ),
    "launches-per-step": (
        "cudaLaunchKernel and all cu*Launch* calls per engine step (a step starts at each 'schedule')",
        """
WITH step AS (
  SELECT ROW_NUMBER() OVER (ORDER BY ts) AS step, ts AS t0, LEAD(ts) OVER (ORDER BY ts) AS t1
  FROM slice WHERE name = 'schedule' AND category = 'user_annotation')
SELECT step.step, SUM(l.name = 'cudaLaunchKernel') AS cudaLaunchKernel, COUNT(l.id) AS launches,
       COALESCE(SUM(l.dur), 0) / 1e3 AS launch_us
FROM step LEFT JOIN slice l ON l.name GLOB 'cu*Launch*' AND l.ts >= step.t0
  AND (step.t1 IS NULL OR l.ts < step.t1)
GROUP BY step.step ORDER BY step.step
""",
    ),
    "gpu-gaps": (
        "busy time and idle gaps between GPU kernels, per stream",
        """
WITH k AS (
  SELECT track_id, dur, ts - LAG(ts + dur) OVER (PARTITION BY track_id ORDER BY ts) AS gap
  FROM slice WHERE category IN ('kernel', 'gpu_memcpy', 'gpu_memset'))
SELECT k.track_id, tt.name AS stream, COUNT(*) AS kernels, SUM(k.dur) / 1e6 AS busy_ms,
       COALESCE(SUM(MAX(k.gap, 0)), 0) / 1e6 AS idle_ms, AVG(MAX(k.gap, 0)) / 1e3 AS avg_gap_us,
       MAX(k.gap) / 1e3 AS max_gap_us
FROM k LEFT JOIN thread_track tt ON tt.id = k.track_id
GROUP BY k.track_id ORDER BY busy_ms DESC
""",
    ),
    "decode-busy": (
        "GPU busy share of steady decode: from the first decode attention kernel after the last prefill "
        "attention kernel to the end of the last GPU activity (overlaps across streams counted once); "
        "steps are counted by the sampler's last launch (_pick_kernel), one per step",
        """
WITH g AS (
  SELECT ts, ts + dur AS te, name FROM slice WHERE category IN ('kernel', 'gpu_memcpy', 'gpu_memset')),
w AS (
  SELECT (SELECT MIN(ts) FROM g WHERE name GLOB '*_decode_kernel*'
            AND ts >= COALESCE((SELECT MAX(te) FROM g WHERE name GLOB '*_prefill_kernel*'), 0)) AS t0,
         (SELECT MAX(te) FROM g) AS t1),
c AS (SELECT MAX(g.ts, w.t0) AS s, MIN(g.te, w.t1) AS e FROM g, w WHERE g.te > w.t0 AND g.ts < w.t1),
o AS (SELECT s, e, MAX(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
      FROM c),
u AS (SELECT SUM(MAX(0, e - MAX(s, COALESCE(reach, s)))) AS busy, COUNT(*) AS n FROM o),
p AS (SELECT COUNT(*) AS steps FROM g, w WHERE g.name GLOB '*_pick_kernel*' AND g.ts >= w.t0 AND g.te <= w.t1)
SELECT (w.t1 - w.t0) / 1e6 AS window_ms, u.busy / 1e6 AS busy_ms, (w.t1 - w.t0 - u.busy) / 1e6 AS idle_ms,
       ROUND(100.0 * u.busy / (w.t1 - w.t0), 2) AS busy_pct, u.n AS kernels, p.steps,
       ROUND(u.busy / 1e3 / NULLIF(p.steps, 0), 2) AS busy_us_per_step
FROM w, u, p
""",
    ),
    "largest-gpu-gaps": (
        "the 20 largest gaps between consecutive GPU kernels, with the kernels around them",
        """
WITH k AS (
  SELECT track_id, ts, name,
         LAG(ts + dur) OVER (PARTITION BY track_id ORDER BY ts) AS prev_end,
         LAG(name) OVER (PARTITION BY track_id ORDER BY ts) AS prev_name
  FROM slice WHERE category IN ('kernel', 'gpu_memcpy', 'gpu_memset'))
SELECT track_id, (ts - prev_end) / 1e3 AS gap_us, prev_name AS before, name AS after, prev_end AS gap_ts
FROM k WHERE prev_end IS NOT NULL ORDER BY ts - prev_end DESC LIMIT 20
""",
    ),
    "top-kernels": (
        "GPU kernels by total time: count, total, average (names cut to 60 characters)",
        """
SELECT SUBSTR(name, 1, 60) AS kernel, COUNT(*) AS n, SUM(dur) / 1e6 AS total_ms, AVG(dur) / 1e3 AS avg_us
FROM slice WHERE category = 'kernel'
GROUP BY kernel ORDER BY total_ms DESC LIMIT 30
""",
    ),
    "range-times": (
        "count and time per record_function range (CPU side, and GPU side when traced)",
        """
SELECT category, name, COUNT(*) AS n, SUM(dur) / 1e6 AS total_ms, AVG(dur) / 1e3 AS avg_us,
       MAX(dur) / 1e3 AS max_us
FROM slice WHERE category IN ('user_annotation', 'gpu_user_annotation')
GROUP BY category, name ORDER BY total_ms DESC
""",
    ),
    "kernels-per-range": (
        "GPU kernels (count, GPU time) launched from inside each record_function range, via flow",
        """
SELECT r.name AS range_name, COUNT(DISTINCT k.id) AS kernels, SUM(k.dur) / 1e6 AS gpu_ms
FROM flow f
JOIN slice k ON k.id = f.slice_in
JOIN ancestor a ON a.slice_id = f.slice_out
JOIN slice r ON r.id = a.ancestor_id AND r.category = 'user_annotation'
GROUP BY r.name ORDER BY gpu_ms DESC
""",
    ),
}


def example_sql(name: str, range_name: str = "forward") -> str:
    if name not in EXAMPLES:
        raise TraceQueryError(f"unknown example {name!r}; one of: {', '.join(EXAMPLES)}")
    return EXAMPLES[name][1].strip().replace("{range}", range_name.replace("'", "''"))
