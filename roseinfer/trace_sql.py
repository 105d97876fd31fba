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

Views this module adds (on both engines):

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

from __future__ import annotations

import argparse
import bisect
import csv
import glob
import gzip
import io
import json
import os
import re
import shutil
import sqlite3
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

ENGINES = ("auto", "sqlite", "perfetto")
TP_BIN_ENV = "ROSEINFER_TRACE_PROCESSOR"

Row = tuple[Any, ...]


class TraceQueryError(RuntimeError):
    """A trace that cannot be read, an engine that cannot run, or SQL that does not work."""


# -- canned queries --------------------------------------------------------------------------------

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


# -- schema shared by both engines -----------------------------------------------------------------

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")

_ANCESTOR_SQL = """
CREATE {table} ancestor AS
WITH RECURSIVE up(slice_id, ancestor_id) AS (
  SELECT id, parent_id FROM slice WHERE parent_id IS NOT NULL
  UNION ALL
  SELECT up.slice_id, p.parent_id FROM up JOIN slice p ON p.id = up.ancestor_id
  WHERE p.parent_id IS NOT NULL)
SELECT slice_id, ancestor_id FROM up
"""

_SLICE_WITH_RANGE_SQL = """
CREATE {view} slice_with_range AS
SELECT s.id, s.ts, s.dur, s.category, s.category AS cat, s.name, s.depth, s.parent_id, s.track_id,
       s.arg_set_id, r.id AS range_id, r.name AS range_name, r.category AS range_category,
       r.depth AS range_depth, r.ts AS range_ts, r.dur AS range_dur
FROM ancestor a
JOIN slice s ON s.id = a.slice_id
JOIN slice r ON r.id = a.ancestor_id
WHERE r.category IN ('user_annotation', 'gpu_user_annotation')
"""

_SLICE_THREAD_SQL = f"""
CREATE {{view}} slice_thread AS
SELECT s.id, s.ts, s.dur, s.category, s.category AS cat, s.name, s.depth, s.parent_id, s.track_id,
       s.arg_set_id, t.utid, t.tid, t.name AS thread_name, p.upid, p.pid, p.name AS process_name,
       (s.category IN ({", ".join(repr(c) for c in GPU_CATEGORIES)})
        OR COALESCE(t.name, '') LIKE 'stream%') AS is_gpu
FROM slice s
LEFT JOIN thread_track tt ON tt.id = s.track_id
LEFT JOIN thread t ON t.utid = tt.utid
LEFT JOIN process p ON p.upid = t.upid
"""

_NEEDS_ANCESTOR = re.compile(r"\b(ancestor|slice_with_range)\b", re.IGNORECASE)


def needs_ancestor(sql: str) -> bool:
    return _NEEDS_ANCESTOR.search(sql) is not None


# -- reading the Chrome JSON trace -----------------------------------------------------------------


def read_trace_events(trace_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The trace's event list ({"traceEvents": [...]} or a bare list; gzip allowed)."""
    path = os.fspath(trace_path)
    if not os.path.exists(path):
        raise TraceQueryError(f"trace file not found: {path}")
    if os.path.isdir(path):
        raise TraceQueryError(f"trace path is a directory, not a trace file: {path}")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceQueryError(f"{path} is not a readable Chrome/Perfetto JSON trace: {e}") from e
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceQueryError(f"{path} has no traceEvents list (not a Chrome JSON trace)")
    return [e for e in events if isinstance(e, dict)]


def _ns(us: Any) -> int:
    return int(round(float(us) * 1000.0))


@dataclass
class _Slice:
    ts: int
    dur: int
    name: str
    category: str | None
    track: int
    args: dict[str, Any] | None
    order: int
    id: int = -1
    depth: int = 0
    parent: _Slice | None = None


@dataclass
class _Tracks:
    """(pid, tid) -> thread track; pid -> process."""

    process_names: dict[Any, str] = field(default_factory=dict)
    process_labels: dict[Any, str] = field(default_factory=dict)
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    tracks: dict[tuple[Any, Any], int] = field(default_factory=dict)

    def track(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = len(self.tracks)
        return track


def _flatten_args(args: Any, prefix: str = "args") -> Iterator[tuple[str, str, Any]]:
    """(flat_key, key, value) like perfetto's JSON importer: nested dicts by '.', lists by [i]."""
    if isinstance(args, dict):
        for k, v in args.items():
            yield from _flatten_args(v, f"{prefix}.{k}")
    elif isinstance(args, list):
        for i, v in enumerate(args):
            yield from _flatten_args(v, f"{prefix}[{i}]")
    else:
        yield (re.sub(r"\[\d+\]", "", prefix) if "[" in prefix else prefix), prefix, args


def _nest(slices: list[_Slice]) -> None:
    """Depth and parent of the slices of one track, by time containment (sorted by start, longest first)."""
    stack: list[_Slice] = []
    for s in slices:
        # pop what ended at or before s starts; an unfinished B (dur -1) stays open to the end
        while stack and stack[-1].dur >= 0 and stack[-1].ts + stack[-1].dur <= s.ts:
            stack.pop()
        s.parent = stack[-1] if stack else None
        s.depth = s.parent.depth + 1 if s.parent else 0
        stack.append(s)


def _innermost_at(track_slices: list[_Slice], starts: list[int], ts: int) -> _Slice | None:
    """The deepest slice of a track that contains ts: the last one starting at or before ts, or its
    nearest ancestor that still contains ts (slices of a track nest)."""
    i = bisect.bisect_right(starts, ts) - 1
    s = track_slices[i] if i >= 0 else None
    while s is not None and not (s.dur < 0 or ts <= s.ts + s.dur):
        s = s.parent
    return s


def _next_at(track_slices: list[_Slice], starts: list[int], ts: int) -> _Slice | None:
    i = bisect.bisect_left(starts, ts)
    return track_slices[i] if i < len(track_slices) else None


def _build_slices(
    events: list[dict[str, Any]],
) -> tuple[list[_Slice], _Tracks, list[tuple[_Slice, _Slice]]]:
    tracks = _Tracks()
    slices: list[_Slice] = []
    open_b: dict[int, list[_Slice]] = {}
    # (cat, id) -> [(phase, track, ts, binds to the enclosing slice)]
    flow_points: dict[tuple[Any, Any], list[tuple[str, int, int, bool]]] = {}
    for order, e in enumerate(events):
        ph = e.get("ph")
        pid, tid = e.get("pid", 0), e.get("tid", 0)
        if ph == "M":
            args = e.get("args") or {}
            name = e.get("name")
            if name == "process_name":
                tracks.process_names[pid] = str(args.get("name", ""))
            elif name == "process_labels":
                tracks.process_labels[pid] = str(args.get("labels", ""))
            elif name == "thread_name":
                tracks.thread_names[(pid, tid)] = str(args.get("name", ""))
            continue
        if ph in ("X", "B", "i", "I", "n"):
            try:
                ts = _ns(e["ts"])
                dur = _ns(e.get("dur", 0)) if ph == "X" else (-1 if ph == "B" else 0)
            except (KeyError, TypeError, ValueError):
                continue
            s = _Slice(
                ts=ts,
                dur=dur,
                name=str(e.get("name", "")),
                category=e.get("cat"),
                track=tracks.track(pid, tid),
                args=e.get("args") if isinstance(e.get("args"), dict) and e.get("args") else None,
                order=order,
            )
            slices.append(s)
            if ph == "B":
                open_b.setdefault(s.track, []).append(s)
        elif ph == "E":
            stack = open_b.get(tracks.track(pid, tid))
            if stack and "ts" in e:
                b = stack.pop()
                b.dur = max(_ns(e["ts"]) - b.ts, 0)
                if isinstance(e.get("args"), dict) and e["args"]:
                    b.args = {**(b.args or {}), **e["args"]}
        elif ph in ("s", "t", "f") and "id" in e and "ts" in e:
            key = (e.get("cat"), e.get("id"))
            point = (str(ph), tracks.track(pid, tid), _ns(e["ts"]), ph != "f" or e.get("bp") == "e")
            flow_points.setdefault(key, []).append(point)

    slices.sort(key=lambda s: (s.ts, -s.dur if s.dur >= 0 else -(1 << 62), s.order))
    for i, s in enumerate(slices):
        s.id = i
    by_track: dict[int, list[_Slice]] = {}
    for s in slices:
        by_track.setdefault(s.track, []).append(s)
    for track_slices in by_track.values():
        _nest(track_slices)

    starts = {t: [s.ts for s in ss] for t, ss in by_track.items()}
    flows: list[tuple[_Slice, _Slice]] = []
    for points in flow_points.values():
        # v1 flow: s -> t -> ... -> f; every f links from the last s/t (a graph launch has several f)
        prev: _Slice | None = None
        for ph, track, ts, enclosing in sorted(points, key=lambda p: (p[2], p[0] != "s")):
            if track not in by_track:
                continue
            find = _innermost_at if enclosing else _next_at
            here = find(by_track[track], starts[track], ts)
            if ph != "s" and prev is not None and here is not None and here is not prev:
                flows.append((prev, here))
            if ph != "f":
                prev = here
    if not flows:
        flows = _correlation_flows(slices)
    return slices, tracks, flows


def _correlation_flows(slices: list[_Slice]) -> list[tuple[_Slice, _Slice]]:
    """Launch -> GPU work pairs by the 'correlation' arg, for traces without flow events."""
    launches: dict[Any, _Slice] = {}
    gpu: list[_Slice] = []
    for s in slices:
        corr = s.args.get("correlation") if s.args else None
        if corr is None:
            continue
        if s.category in ("cuda_runtime", "cuda_driver"):
            launches[corr] = s
        elif s.category in GPU_CATEGORIES:
            gpu.append(s)
    return [(launches[s.args["correlation"]], s) for s in gpu if s.args and s.args["correlation"] in launches]


def _arg_row(arg_set_id: int, flat_key: str, key: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, bool):
        return (arg_set_id, flat_key, key, int(value), None, None, "bool", str(value).lower())
    if isinstance(value, int):
        return (arg_set_id, flat_key, key, value, None, None, "int", str(value))
    if isinstance(value, float):
        return (arg_set_id, flat_key, key, None, None, value, "real", repr(value))
    if value is None:
        return (arg_set_id, flat_key, key, None, None, None, "null", None)
    return (arg_set_id, flat_key, key, None, str(value), None, "string", str(value))


def load_trace_sqlite(trace_path: str | os.PathLike[str], *, ancestors: bool = True) -> sqlite3.Connection:
    """The trace as an in-memory sqlite3 database with the perfetto-style tables in the module doc."""
    events = read_trace_events(trace_path)
    slices, tracks, flows = _build_slices(events)

    db = sqlite3.connect(":memory:")
    db.executescript(
        """
        CREATE TABLE process (upid INTEGER PRIMARY KEY, pid, name TEXT, labels TEXT);
        CREATE TABLE thread (utid INTEGER PRIMARY KEY, tid, upid INTEGER, name TEXT);
        CREATE TABLE thread_track (id INTEGER PRIMARY KEY, utid INTEGER, name TEXT);
        CREATE TABLE track (id INTEGER PRIMARY KEY, name TEXT, type TEXT);
        CREATE TABLE _slice (
          id INTEGER PRIMARY KEY, ts INTEGER, dur INTEGER, category TEXT, name TEXT, depth INTEGER,
          parent_id INTEGER, track_id INTEGER, arg_set_id INTEGER);
        CREATE VIEW slice AS SELECT *, category AS cat, id AS slice_id FROM _slice;
        CREATE TABLE args (
          arg_set_id INTEGER, flat_key TEXT, key TEXT, int_value INTEGER, string_value TEXT,
          real_value REAL, value_type TEXT, display_value TEXT);
        CREATE TABLE flow (id INTEGER PRIMARY KEY, slice_out INTEGER, slice_in INTEGER);
        """
    )
    pids = sorted({pid for pid, _ in tracks.tracks} | set(tracks.process_names), key=str)
    upid = {pid: i for i, pid in enumerate(pids)}
    db.executemany(
        "INSERT INTO process VALUES (?, ?, ?, ?)",
        [(upid[p], p, tracks.process_names.get(p), tracks.process_labels.get(p)) for p in pids],
    )
    thread_rows = []
    track_rows = []
    for (pid, tid), track_id in tracks.tracks.items():
        name = tracks.thread_names.get((pid, tid))
        thread_rows.append((track_id, tid, upid[pid], name))
        track_rows.append((track_id, track_id, name))
    db.executemany("INSERT INTO thread VALUES (?, ?, ?, ?)", thread_rows)
    db.executemany("INSERT INTO thread_track VALUES (?, ?, ?)", track_rows)
    db.executemany("INSERT INTO track VALUES (?, ?, 'thread')", [(t, n) for t, _, n in track_rows])

    arg_values: dict[int, dict[str, Any]] = {}
    arg_rows = []
    slice_rows = []
    for s in slices:
        arg_set_id = None
        if s.args:
            arg_set_id = len(arg_values)
            values = arg_values[arg_set_id] = {}
            for flat_key, key, value in _flatten_args(s.args):
                values[key] = value
                arg_rows.append(_arg_row(arg_set_id, flat_key, key, value))
        parent_id = s.parent.id if s.parent else None
        slice_rows.append((s.id, s.ts, s.dur, s.category, s.name, s.depth, parent_id, s.track, arg_set_id))
    db.executemany("INSERT INTO _slice VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", slice_rows)
    db.executemany("INSERT INTO args VALUES (?, ?, ?, ?, ?, ?, ?, ?)", arg_rows)
    db.executemany("INSERT INTO flow (slice_out, slice_in) VALUES (?, ?)", [(a.id, b.id) for a, b in flows])
    db.executescript(
        """
        CREATE INDEX slice_name ON _slice (name);
        CREATE INDEX slice_ts ON _slice (track_id, ts);
        CREATE INDEX slice_parent ON _slice (parent_id);
        CREATE INDEX args_set ON args (arg_set_id);
        """
    )

    def extract_arg(arg_set_id: int | None, key: str) -> Any:
        if arg_set_id is None:
            return None
        values = arg_values.get(arg_set_id, {})
        value = values.get(key, values.get(f"args.{key}"))
        return int(value) if isinstance(value, bool) else value if not isinstance(value, dict) else None

    db.create_function("EXTRACT_ARG", 2, extract_arg, deterministic=True)
    db.execute(_SLICE_THREAD_SQL.format(view="VIEW"))
    if ancestors:
        add_ancestor_tables_sqlite(db)
    db.commit()
    return db


def add_ancestor_tables_sqlite(db: sqlite3.Connection) -> None:
    db.execute(_ANCESTOR_SQL.format(table="TABLE"))
    db.execute("CREATE INDEX ancestor_of ON ancestor (ancestor_id, slice_id)")
    db.execute("CREATE INDEX ancestor_slice ON ancestor (slice_id)")
    db.execute(_SLICE_WITH_RANGE_SQL.format(view="VIEW"))


# -- running SQL -----------------------------------------------------------------------------------


def split_statements(sql: str) -> list[str]:
    """Splits on the ';' that end statements (not those in strings or comments)."""
    statements: list[str] = []
    start = 0
    for i, ch in enumerate(sql):
        if ch == ";" and sqlite3.complete_statement(sql[start : i + 1]):
            statements.append(sql[start : i + 1])
            start = i + 1
    statements.append(sql[start:])
    return [s for s in statements if s.strip().rstrip(";").strip() and not _only_comments(s)]


def _only_comments(sql: str) -> bool:
    text = re.sub(r"--[^\n]*", "", sql)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    return not text.strip().strip(";").strip()


def _sqlite_query(db: sqlite3.Connection, sql: str) -> tuple[list[str], list[Row]]:
    statements = split_statements(sql)
    if not statements:
        raise TraceQueryError("empty SQL")
    columns: list[str] = []
    rows: list[Row] = []
    for stmt in statements:
        try:
            cur = db.execute(stmt)
            columns = [d[0] for d in cur.description] if cur.description else []
            rows = [tuple(r) for r in cur.fetchall()]
        except sqlite3.Error as e:
            raise TraceQueryError(f"SQL error: {e}\n  in: {' '.join(stmt.split())}") from e
    return columns, rows


def find_trace_processor(tp_bin: str | None = None) -> str | None:
    """A trace_processor_shell binary already on this machine (never downloads)."""
    if tp_bin:
        if not os.path.isfile(tp_bin):
            raise TraceQueryError(f"trace processor binary not found: {tp_bin}")
        return tp_bin
    env = os.environ.get(TP_BIN_ENV)
    if env and os.path.isfile(env):
        return env
    on_path = shutil.which("trace_processor_shell")
    if on_path:
        return on_path
    cache = os.path.join(os.path.expanduser("~"), ".local", "share", "perfetto", "prebuilts")
    cached = [
        p
        for p in sorted(glob.glob(os.path.join(cache, "trace_processor_shell*")))
        if not p.endswith(".tmp") and os.access(p, os.X_OK)
    ]
    return cached[-1] if cached else None


def perfetto_importable() -> bool:
    try:
        import perfetto.trace_processor  # noqa: F401
    except Exception:
        return False
    return True


def choose_engine(engine: str = "auto", tp_bin: str | None = None) -> str:
    if engine not in ENGINES:
        raise TraceQueryError(f"unknown engine {engine!r}; one of {ENGINES}")
    if engine != "auto":
        return engine
    if perfetto_importable() and find_trace_processor(tp_bin) is not None:
        return "perfetto"
    return "sqlite"


class _EngineStartError(TraceQueryError):
    pass


def _perfetto_query(trace_path: str, sql: str, tp_bin: str | None) -> tuple[list[str], list[Row]]:
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except Exception as e:
        raise _EngineStartError(
            f"the perfetto engine needs the perfetto package (pip install perfetto): {e}"
        ) from e
    binary = find_trace_processor(tp_bin)
    try:
        tp = TraceProcessor(trace=trace_path, config=TraceProcessorConfig(bin_path=binary))
    except Exception as e:
        hint = (
            ""
            if binary
            else " (with no local trace_processor_shell, perfetto downloads one, which fails offline: "
            f"give --tp-bin / {TP_BIN_ENV}, or use --engine sqlite)"
        )
        raise _EngineStartError(f"perfetto trace processor did not start{hint}: {e}") from e
    try:
        _perfetto_prelude(tp, needs_ancestor(sql))
        try:
            result = tp.query(sql)
        except Exception as e:
            raise TraceQueryError(f"SQL error: {e}\n  in: {' '.join(sql.split())}") from e
        columns = list(result.column_names)
        rows = [tuple(getattr(r, c, None) for c in columns) for r in result]
        return columns, rows
    finally:
        tp.close()


def _perfetto_prelude(tp: Any, ancestors: bool) -> None:
    """This module's views, on perfetto (PERFETTO TABLE/VIEW where the version wants them)."""
    statements = [_SLICE_THREAD_SQL]
    if ancestors:
        statements += [_ANCESTOR_SQL, _SLICE_WITH_RANGE_SQL]
    for template in statements:
        errors = []
        for kind in ("PERFETTO", ""):
            try:
                tp.query(template.format(table=f"{kind} TABLE".strip(), view=f"{kind} VIEW".strip()))
                break
            except Exception as e:
                errors.append(str(e))
        else:
            print(
                f"warning: trace-sql could not create a helper view on perfetto: {errors[-1]}",
                file=sys.stderr,
            )


def query_trace(
    trace_path: str | os.PathLike[str],
    sql: str,
    *,
    engine: str = "auto",
    tp_bin: str | None = None,
) -> tuple[list[str], list[Row]]:
    """Runs SQL (one or more ';'-separated statements; the last one's result) over a trace.

    Returns (column names, rows). Raises TraceQueryError on a missing/unreadable trace, an engine that
    cannot run, or bad SQL. With engine="auto", a perfetto that fails to start falls back to sqlite.
    """
    path = os.fspath(trace_path)
    if not os.path.exists(path):
        raise TraceQueryError(f"trace file not found: {path}")
    if not sql or not sql.strip():
        raise TraceQueryError("empty SQL")
    chosen = choose_engine(engine, tp_bin)
    if chosen == "perfetto":
        try:
            return _perfetto_query(path, sql, tp_bin)
        except _EngineStartError as e:
            if engine != "auto":
                raise
            print(f"warning: {e}; using the built-in sqlite engine", file=sys.stderr)
    db = load_trace_sqlite(path, ancestors=needs_ancestor(sql))
    try:
        return _sqlite_query(db, sql)
    finally:
        db.close()


# -- output ----------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value == int(value) and abs(value) < 1e15:
            return str(int(value))
        if abs(value) >= 1e-3:
            return f"{value:.6f}".rstrip("0").rstrip(".")
        return f"{value:.4g}"
    if isinstance(value, bytes):
        return value.hex()
    return str(value).replace("\n", " ").replace("|", "\\|")


def format_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (aligned), numbers right-aligned, then a row count."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not columns:
        return f"({len(cells)} rows)"
    header = [str(c).replace("|", "\\|") for c in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells if i < len(r)]) for i, h in enumerate(header)]
    numeric = [
        bool(cells) and all(i < len(r) and (r[i] == "NULL" or _is_number(r[i])) for r in cells)
        for i in range(len(header))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [(v.rjust(w) if num else v.ljust(w)) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(parts) + " |"

    sep = (
        "|"
        + "|".join(("-" * (w + 1) + ":") if num else "-" * (w + 2) for w, num in zip(widths, numeric))
        + "|"
    )
    out = [line(header), sep, *(line(r) for r in cells)]
    out.append(f"({len(cells)} row{'s' if len(cells) != 1 else ''})")
    return "\n".join(out)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def format_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue().rstrip("\n")


def format_json(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    return json.dumps([dict(zip(columns, r)) for r in rows], indent=1, default=str)


FORMATS = {"table": format_table, "csv": format_csv, "json": format_json}


# -- CLI -------------------------------------------------------------------------------------------


def _examples_help() -> str:
    lines = ["canned queries (--example NAME):"]
    for name, (help_text, _) in EXAMPLES.items():
        lines.append(f"  {name:<18} {help_text}")
    lines.append("")
    lines.append("e.g.  roseinfer trace-sql profiles/trace.json --example ops-in-range --range forward")
    lines.append(
        '      roseinfer trace-sql profiles/trace.json "SELECT name, COUNT(*) n FROM slice_with_range '
        "WHERE range_name = 'sample' GROUP BY name ORDER BY n DESC\""
    )
    lines.append(
        "tables: slice, ancestor, slice_with_range, slice_thread, thread_track, thread, process, "
        "args, flow (see roseinfer/trace_sql.py)"
    )
    return "\n".join(lines)


def add_trace_sql_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="Chrome/Perfetto JSON trace (what --profile writes; .json or .json.gz)")
    parser.add_argument(
        "sql",
        nargs="?",
        default=None,
        help="SQL to run ('-' reads stdin, '@FILE' reads a file); several ';'-separated statements "
        "return the last one's rows",
    )
    parser.add_argument("--example", choices=sorted(EXAMPLES), default=None, help="run a canned query")
    parser.add_argument("--range", default="forward", help="record_function range for --example (forward)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="perfetto trace processor, the built-in sqlite loader, or auto (perfetto only when its "
        "binary is already here; else sqlite)",
    )
    parser.add_argument(
        "--tp-bin",
        default=None,
        help=f"trace_processor_shell binary for --engine perfetto (or ${TP_BIN_ENV})",
    )
    parser.add_argument("--format", choices=sorted(FORMATS), default="table", help="output format (table)")
    parser.add_argument("--show-sql", action="store_true", help="print the SQL before the result")


def add_trace_sql_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `trace-sql` on an argparse subparsers object; the command runs `run_trace_sql`."""
    parser = subparsers.add_parser(
        "trace-sql",
        help="run SQL over a profiler trace (slice, ancestor, slice_with_range, ...)",
        description="Run SQL over a torch profiler trace (Chrome/Perfetto JSON).",
        epilog=_examples_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_trace_sql_arguments(parser)
    parser.set_defaults(func=run_trace_sql)
    return parser


def _read_sql(args: argparse.Namespace) -> str:
    if args.example:
        if args.sql:
            raise TraceQueryError("give SQL or --example, not both")
        return example_sql(args.example, args.range)
    if args.sql is None:
        raise TraceQueryError("no SQL given\n" + _examples_help())
    if args.sql == "-":
        return sys.stdin.read()
    if args.sql.startswith("@"):
        try:
            with open(args.sql[1:], encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise TraceQueryError(f"cannot read SQL file {args.sql[1:]}: {e}") from e
    return str(args.sql)


def run_trace_sql(args: argparse.Namespace) -> int:
    try:
        sql = _read_sql(args)
        if getattr(args, "show_sql", False):
            print(sql.strip())
            print()
        columns, rows = query_trace(
            args.trace, sql, engine=getattr(args, "engine", "auto"), tp_bin=getattr(args, "tp_bin", None)
        )
    except TraceQueryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(FORMATS[getattr(args, "format", "table")](columns, rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m roseinfer.trace_sql")
    add_trace_sql_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["trace-sql", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
