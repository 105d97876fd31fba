"""A Chrome/Perfetto JSON trace as an in-memory sqlite3 database with perfetto-style tables (the package
doc lists them): events -> slices nested per track, flows, args."""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import sqlite3
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from roseinfer.trace_sql.errors import TraceQueryError
from roseinfer.trace_sql.schema import ANCESTOR_SQL, GPU_CATEGORIES, SLICE_THREAD_SQL, SLICE_WITH_RANGE_SQL


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
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceQueryError(f"{path} is not a readable Chrome/Perfetto JSON trace: {e}") from e
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceQueryError(f"{path} has no traceEvents list (not a Chrome JSON trace)")
    return [e for e in events if isinstance(e, dict)]


def _ns(us: Any) -> int:
    return int(round(float(us) * 1000.0))


def _ns_or_none(us: Any) -> int | None:
    """`_ns`, or None for a timestamp that is no finite number (the event is then skipped)."""
    try:
        return _ns(us)
    except (TypeError, ValueError, OverflowError):
        return None


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
            ts = _ns_or_none(e.get("ts"))
            dur = _ns_or_none(e.get("dur", 0)) if ph == "X" else (-1 if ph == "B" else 0)
            if ts is None or dur is None:
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
            end = _ns_or_none(e.get("ts"))
            if stack and end is not None:
                b = stack.pop()
                b.dur = max(end - b.ts, 0)
                if isinstance(e.get("args"), dict) and e["args"]:
                    b.args = {**(b.args or {}), **e["args"]}
        elif ph in ("s", "t", "f") and "id" in e and _ns_or_none(e.get("ts")) is not None:
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
    pids = sorted(
        {pid for pid, _ in tracks.tracks} | set(tracks.process_names) | set(tracks.process_labels), key=str
    )
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
    db.execute(SLICE_THREAD_SQL.format(view="VIEW"))
    if ancestors:
        add_ancestor_tables_sqlite(db)
    db.commit()
    return db


def add_ancestor_tables_sqlite(db: sqlite3.Connection) -> None:
    db.execute(ANCESTOR_SQL.format(table="TABLE"))
    db.execute("CREATE INDEX ancestor_of ON ancestor (ancestor_id, slice_id)")
    db.execute("CREATE INDEX ancestor_slice ON ancestor (slice_id)")
    db.execute(SLICE_WITH_RANGE_SQL.format(view="VIEW"))
