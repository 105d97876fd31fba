"""SQL over a profiler trace: `roseinfer trace-sql TRACE "SELECT ..."`.

TRACE is the Chrome/Perfetto JSON file `--profile` writes (`roseinfer.profiling.profile_to`; ".json" or
".json.gz"). Two engines answer the same perfetto-style schema:

* ``perfetto``: the perfetto trace processor (``pip install perfetto``). Its Python package does not
  bundle the ``trace_processor_shell`` binary: on first use it downloads it (commondatastorage.googleapis
  .com) into ~/.local/share/perfetto/prebuilts, which fails offline. Give a binary with ``--tp-bin`` or
  ROSEINFER_TRACE_PROCESSOR, put ``trace_processor_shell`` on PATH, or let perfetto's cache hold one.
* ``sqlite`` (built in, no network, no dependency): the JSON trace loaded into an in-memory sqlite3
  database with the tables below.
* ``auto`` (default): perfetto when it is importable and a binary is already on this machine, else sqlite.

Modules: ``load`` (the JSON trace -> sqlite tables), ``schema`` (the views both engines add),
``engines`` (which engine, and running SQL on it), ``examples`` (canned queries), ``formats`` (table /
csv / json output), ``cli`` (the ``trace-sql`` command; ``python -m roseinfer.trace_sql``).

Tables (times in nanoseconds, as in perfetto):

* ``slice``: id, ts, dur, category (alias cat), name, depth, parent_id, track_id, arg_set_id (alias
  slice_id = id). One row per complete ('X') event, B/E pair or instant (dur 0); nesting (depth,
  parent_id) is computed per (pid, tid) track. record_function ranges have category 'user_annotation'
  (their GPU-side spans 'gpu_user_annotation'), aten ops 'cpu_op', launches 'cuda_runtime' /
  'cuda_driver', GPU work 'kernel' / 'gpu_memcpy' / 'gpu_memset'.
* ``thread_track`` (id, utid, name), ``thread`` (utid, tid, upid, name), ``process`` (upid, pid, name):
  GPU streams are threads named 'stream N' of the GPU's process.
* ``args`` (arg_set_id, flat_key, key, int_value, string_value, real_value, value_type, display_value)
  with keys 'args.<name>', and ``EXTRACT_ARG(arg_set_id, 'args.correlation')``.
* ``flow`` (id, slice_out, slice_in): CPU launch -> GPU kernel (from the trace's flow events, or the
  'correlation' arg when it has none); a cudaGraphLaunch links to every kernel of the graph.

Views this package adds (on both engines):

* ``ancestor`` (slice_id, ancestor_id): every (slice, enclosing slice) pair; built (a table) only when
  the SQL names ``ancestor`` or ``slice_with_range``.
* ``slice_with_range``: each slice once per enclosing record_function range: the slice's columns plus
  range_id, range_name, range_category, range_depth. "Which aten ops inside which range" is a WHERE.
* ``slice_thread``: slice plus utid, tid, thread_name, upid, pid, process_name, is_gpu.

Examples (``--example NAME`` runs one; ``--range`` sets the range they look inside):

  -- top aten ops by total time inside 'forward' (ops nested in ops count in both)
  SELECT s.name, COUNT(*) AS n, SUM(s.dur) / 1e6 AS total_ms, AVG(s.dur) / 1e3 AS avg_us
  FROM slice s
  JOIN ancestor a ON a.slice_id = s.id
  JOIN slice r ON r.id = a.ancestor_id
  WHERE r.name = 'forward' AND r.category = 'user_annotation' AND s.name LIKE 'aten::%'
  GROUP BY s.name ORDER BY total_ms DESC LIMIT 25;

  -- cudaLaunchKernel (and other launches) per engine step; a step starts at each 'schedule' range
  WITH step AS (
    SELECT ROW_NUMBER() OVER (ORDER BY ts) AS step, ts AS t0, LEAD(ts) OVER (ORDER BY ts) AS t1
    FROM slice WHERE name = 'schedule' AND category = 'user_annotation')
  SELECT step.step, SUM(l.name = 'cudaLaunchKernel') AS cudaLaunchKernel, COUNT(l.id) AS launches
  FROM step LEFT JOIN slice l ON l.name GLOB 'cu*Launch*' AND l.ts >= step.t0
    AND (step.t1 IS NULL OR l.ts < step.t1)
  GROUP BY step.step ORDER BY step.step;

  -- gaps between GPU kernels, per stream
  WITH k AS (
    SELECT track_id, dur, ts - LAG(ts + dur) OVER (PARTITION BY track_id ORDER BY ts) AS gap
    FROM slice WHERE category IN ('kernel', 'gpu_memcpy', 'gpu_memset'))
  SELECT track_id, COUNT(*) AS kernels, SUM(dur) / 1e6 AS busy_ms, SUM(MAX(gap, 0)) / 1e6 AS idle_ms,
         MAX(gap) / 1e3 AS max_gap_us
  FROM k GROUP BY track_id ORDER BY busy_ms DESC;

  -- time per record_function range (CPU side and GPU side)
  SELECT category, name, COUNT(*) AS n, SUM(dur) / 1e6 AS total_ms, AVG(dur) / 1e3 AS avg_us
  FROM slice WHERE category IN ('user_annotation', 'gpu_user_annotation')
  GROUP BY category, name ORDER BY total_ms DESC;
"""

from roseinfer.trace_sql.cli import add_trace_sql_arguments, add_trace_sql_parser, main, run_trace_sql
from roseinfer.trace_sql.engines import (
    ENGINES,
    TP_BIN_ENV,
    Row,
    choose_engine,
    find_trace_processor,
    perfetto_importable,
    query_trace,
    split_statements,
)
from roseinfer.trace_sql.errors import TraceQueryError
from roseinfer.trace_sql.examples import EXAMPLES, example_sql
from roseinfer.trace_sql.formats import FORMATS, format_csv, format_json, format_table
from roseinfer.trace_sql.load import add_ancestor_tables_sqlite, load_trace_sqlite, read_trace_events
from roseinfer.trace_sql.schema import GPU_CATEGORIES, needs_ancestor

__all__ = [
    "ENGINES",
    "EXAMPLES",
    "FORMATS",
    "GPU_CATEGORIES",
    "TP_BIN_ENV",
    "Row",
    "TraceQueryError",
    "add_ancestor_tables_sqlite",
    "add_trace_sql_arguments",
    "add_trace_sql_parser",
    "choose_engine",
    "example_sql",
    "find_trace_processor",
    "format_csv",
    "format_json",
    "format_table",
    "load_trace_sqlite",
    "main",
    "needs_ancestor",
    "perfetto_importable",
    "query_trace",
    "read_trace_events",
    "run_trace_sql",
    "split_statements",
]
