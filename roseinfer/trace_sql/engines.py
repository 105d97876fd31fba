"""Which engine answers (perfetto's trace processor or the built-in sqlite loader) and running SQL on it."""

from __future__ import annotations

import glob
import os
import re
import shutil
import sqlite3
import sys
from typing import Any

from roseinfer.trace_sql.errors import TraceQueryError
from roseinfer.trace_sql.load import load_trace_sqlite
from roseinfer.trace_sql.schema import ANCESTOR_SQL, SLICE_THREAD_SQL, SLICE_WITH_RANGE_SQL, needs_ancestor

ENGINES = ("auto", "sqlite", "perfetto")
TP_BIN_ENV = "ROSEINFER_TRACE_PROCESSOR"

Row = tuple[Any, ...]


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
    statements = [SLICE_THREAD_SQL]
    if ancestors:
        statements += [ANCESTOR_SQL, SLICE_WITH_RANGE_SQL]
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
