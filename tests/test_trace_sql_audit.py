"""Mutation audit (roseinfer/trace_sql/, profiling.py): statement splitting and empty SQL, the trace processor
binary search, the perfetto engine's views and clean-up (with a stand-in TraceProcessor: the perfetto package is
not installed here), and the JSON loader's edges, each against a small hand-written trace."""

from __future__ import annotations

import json
import sqlite3
import types
from pathlib import Path
from typing import Any

import pytest

from roseinfer.trace_sql import TraceQueryError, find_trace_processor, load_trace_sqlite, query_trace
from roseinfer.trace_sql.engines import TP_BIN_ENV, choose_engine
from tests.fake_perfetto import install_fake_perfetto


def write_trace(path: Path, events: list[Any], wrap: bool = True) -> Path:
    path.write_text(json.dumps({"traceEvents": events} if wrap else events))
    return path


def x(name: str, ts: float, dur: float, tid: int = 1, cat: str = "user_annotation", **args: Any) -> dict:
    e: dict[str, Any] = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if args:
        e["args"] = args
    return e


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "t.json", [x("forward", 1.0, 10.0), x("aten::mm", 2.0, 3.0, cat="cpu_op")])


def sqlite_rows(path: Path, sql: str) -> tuple[list[str], list[tuple]]:
    return query_trace(path, sql, engine="sqlite")


# -- statements ------------------------------------------------------------------------------------


def test_a_trailing_comment_over_several_lines_is_no_statement(trace: Path) -> None:
    cols, rows = sqlite_rows(trace, "SELECT COUNT(*) AS n FROM slice;\n/* counted\n   above */")
    assert (cols, rows) == (["n"], [(2,)])


def test_sql_of_comments_only_is_empty(trace: Path) -> None:
    with pytest.raises(TraceQueryError, match="empty SQL"):
        sqlite_rows(trace, "-- nothing to run\n/* still nothing */")


def test_a_last_statement_without_rows_returns_no_columns(trace: Path) -> None:
    """The last statement's result: a CREATE after a SELECT gives no columns, not the SELECT's."""
    assert sqlite_rows(trace, "SELECT 1 AS a; CREATE TEMP TABLE t (x)") == ([], [])


# -- finding trace_processor_shell -----------------------------------------------------------------


@pytest.fixture
def no_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No trace processor on PATH, in the environment or in perfetto's cache (a fresh HOME); returns the cache."""
    monkeypatch.delenv(TP_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    cache = home / ".local" / "share" / "perfetto" / "prebuilts"
    cache.mkdir(parents=True)
    return cache


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_named_binary_that_is_not_there_is_an_error(no_binaries: Path, tmp_path: Path) -> None:
    with pytest.raises(TraceQueryError, match="trace processor binary not found: .*nope"):
        find_trace_processor(str(tmp_path / "nope"))


def test_the_environment_names_a_binary_only_where_it_exists(
    no_binaries: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TP_BIN_ENV, str(tmp_path / "missing"))
    assert find_trace_processor() is None
    there = executable(tmp_path / "tp")
    monkeypatch.setenv(TP_BIN_ENV, str(there))
    assert find_trace_processor() == str(there)


def test_perfettos_cache_holds_a_binary_only_when_finished_and_executable(no_binaries: Path) -> None:
    executable(no_binaries / "trace_processor_shell.tmp")  # a download in progress
    (no_binaries / "trace_processor_shell-plain").write_text("")  # not executable
    assert find_trace_processor() is None
    done = executable(no_binaries / "trace_processor_shell")
    assert find_trace_processor() == str(done)


# -- the perfetto engine, with a stand-in TraceProcessor -------------------------------------------


class FakeTraceProcessor:
    """Answers from the sqlite loader. `perfetto_ddl`: like newer trace processors, it takes only PERFETTO
    TABLE / VIEW statements (and refuses plain CREATE VIEW); otherwise it refuses PERFETTO DDL."""

    perfetto_ddl = False
    started: list[FakeTraceProcessor] = []

    def __init__(self, trace: str, config: Any) -> None:
        self.db = load_trace_sqlite(trace, ancestors=False)
        self.db.execute("DROP VIEW slice_thread")  # a trace processor has only its own tables
        self.queries: list[str] = []
        self.closed = False
        type(self).started.append(self)

    def query(self, sql: str) -> Any:
        self.queries.append(sql)
        ddl = sql.lstrip().upper().startswith("CREATE")
        if ddl and self.perfetto_ddl != ("PERFETTO" in sql):
            raise RuntimeError("this trace processor refuses that DDL")
        try:
            cur = self.db.execute(sql.replace("PERFETTO ", ""))
        except sqlite3.Error as e:
            raise RuntimeError(str(e)) from e
        names = [d[0] for d in cur.description] if cur.description else []
        rows = [types.SimpleNamespace(**dict(zip(names, r))) for r in cur.fetchall()]
        result = FakeResult(rows)
        result.column_names = names
        return result

    def close(self) -> None:
        self.closed = True
        self.db.close()


class FakeResult(list):  # type: ignore[type-arg]
    column_names: list[str]


@pytest.fixture
def fake_perfetto(monkeypatch: pytest.MonkeyPatch, no_binaries: Path) -> type[FakeTraceProcessor]:
    install_fake_perfetto(monkeypatch, FakeTraceProcessor)
    monkeypatch.setattr(FakeTraceProcessor, "started", [])
    monkeypatch.setattr(FakeTraceProcessor, "perfetto_ddl", False)
    return FakeTraceProcessor


def test_auto_with_perfetto_importable_but_no_binary_uses_sqlite(trace: Path, fake_perfetto) -> None:
    assert choose_engine("auto") == "sqlite"
    assert query_trace(trace, "SELECT COUNT(*) FROM slice") == (["COUNT(*)"], [(2,)])
    assert fake_perfetto.started == []


@pytest.mark.parametrize("perfetto_ddl", [True, False], ids=["perfetto-ddl", "plain-ddl"])
def test_the_helper_views_on_either_kind_of_trace_processor(
    trace: Path, tmp_path: Path, fake_perfetto, perfetto_ddl: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_perfetto.perfetto_ddl = perfetto_ddl
    tp_bin = str(executable(tmp_path / "tp"))
    sql = "SELECT name, is_gpu FROM slice_thread ORDER BY name"
    assert query_trace(trace, sql, engine="perfetto", tp_bin=tp_bin) == sqlite_rows(trace, sql)
    assert "warning" not in capsys.readouterr().err
    (tp,) = fake_perfetto.started
    assert tp.closed


def test_the_trace_processor_is_closed_after_bad_sql(trace: Path, tmp_path: Path, fake_perfetto) -> None:
    tp_bin = str(executable(tmp_path / "tp"))
    with pytest.raises(TraceQueryError, match="SQL error"):
        query_trace(trace, "SELECT nope FROM slice", engine="perfetto", tp_bin=tp_bin)
    assert [tp.closed for tp in fake_perfetto.started] == [True]


def test_blank_sql_is_refused_before_any_engine_starts(trace: Path, tmp_path: Path, fake_perfetto) -> None:
    tp_bin = str(executable(tmp_path / "tp"))
    with pytest.raises(TraceQueryError, match="empty SQL"):
        query_trace(trace, " \n ", engine="perfetto", tp_bin=tp_bin)
    assert fake_perfetto.started == []


# -- the JSON loader -------------------------------------------------------------------------------


def test_entries_that_are_no_events_are_skipped(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.json", [x("forward", 1.0, 2.0), 7, "text", None, [1]], wrap=False)
    assert sqlite_rows(path, "SELECT name FROM slice") == (["name"], [("forward",)])


def test_microseconds_become_the_nearest_nanosecond(tmp_path: Path) -> None:
    """1.001 us is 1000.9999... ns in binary floating point: the nearest nanosecond is 1001."""
    path = write_trace(tmp_path / "t.json", [x("forward", 1.001, 0.007)])
    assert sqlite_rows(path, "SELECT ts, dur FROM slice") == (["ts", "dur"], [(1001, 7)])


def test_a_trace_directory_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TraceQueryError, match="is a directory"):
        query_trace(tmp_path, "SELECT 1", engine="sqlite")
