"""Mutation audit (trace_sql/formats.py, cli.py, examples.py, schema.py): how results print (small numbers,
escaped cells, empty and one-row tables, CSV and JSON), how the command reads its SQL and passes its flags on,
and the views' edges (GPU slices by stream or category, GPU-side ranges), on hand-written traces."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from roseinfer.trace_sql import (
    TraceQueryError,
    add_trace_sql_parser,
    example_sql,
    format_csv,
    format_json,
    format_table,
    query_trace,
)


def trace(tmp_path: Path) -> Path:
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "stream 7"}},
        {"ph": "X", "name": "it's", "cat": "user_annotation", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "X", "name": "memcpy", "cat": "ac2g", "ts": 20, "dur": 5, "pid": 1, "tid": 7},
        {"ph": "X", "name": "step", "cat": "gpu_user_annotation", "ts": 30, "dur": 50, "pid": 1, "tid": 8},
        {"ph": "X", "name": "k", "cat": "kernel", "ts": 40, "dur": 5, "pid": 1, "tid": 8},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def cli(path: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="roseinfer")
    add_trace_sql_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["trace-sql", str(path), *argv])


# -- formats ---------------------------------------------------------------------------------------


def test_cells_small_numbers_and_text() -> None:
    text = format_table(["v", "s", "b"], [(0.00012345, "a|b\nc", b"\x01\xff"), (None, None, None)])
    assert text.splitlines() == [
        "|         v | s      | b    |",
        "|----------:|--------|------|",
        "| 0.0001234 | a\\|b c | 01ff |",
        "|      NULL | NULL   | NULL |",
        "(2 rows)",
    ]


def test_tables_of_one_row_no_rows_and_no_columns() -> None:
    assert format_table(["n"], [(3,)]).splitlines()[-1] == "(1 row)"
    assert format_table(["name"], []).splitlines() == ["| name |", "|------|", "(0 rows)"]
    assert format_table([], []) == "(0 rows)"


def test_csv_and_json_carry_the_column_names() -> None:
    assert format_csv(["a", "b"], [(1, "x,y")]) == 'a,b\n1,"x,y"'
    assert json.loads(format_json(["a", "b"], [(1, None)])) == [{"a": 1, "b": None}]


# -- the command -----------------------------------------------------------------------------------


def test_sql_from_stdin_and_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = trace(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT COUNT(*) AS n FROM slice"))
    args = cli(path, "-", "--engine", "sqlite", "--format", "csv")
    assert args.func(args) == 0
    assert capsys.readouterr().out.split() == ["n", "5"]
    sql = tmp_path / "q.sql"
    sql.write_text("SELECT name FROM slice WHERE cat = 'kernel'")
    args = cli(path, f"@{sql}", "--engine", "sqlite", "--format", "json")
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out) == [{"name": "k"}]
    args = cli(path, f"@{tmp_path / 'missing.sql'}", "--engine", "sqlite")
    assert args.func(args) == 2
    assert "cannot read SQL file" in capsys.readouterr().err


def test_sql_and_an_example_together_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli(trace(tmp_path), "SELECT 1", "--example", "top-kernels")
    assert args.func(args) == 2
    assert "not both" in capsys.readouterr().err


def test_show_sql_and_the_default_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli(trace(tmp_path), "--example", "ops-in-range", "--show-sql", "--engine", "sqlite")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "WHERE r.name = 'forward'" in out  # the printed SQL, for the default range
    assert out.rstrip().endswith("(0 rows)")


def test_a_range_name_with_a_quote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli(trace(tmp_path), "--example", "ops-in-range", "--range", "it's", "--engine", "sqlite")
    assert args.func(args) == 0
    assert "aten::mm" in capsys.readouterr().out


def test_the_engine_flag_reaches_the_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = cli(trace(tmp_path), "SELECT 1", "--engine", "perfetto", "--tp-bin", str(tmp_path / "none"))
    assert args.func(args) == 2
    assert "error: " in (err := capsys.readouterr().err) and "perfetto" in err  # not answered by sqlite


# -- views -----------------------------------------------------------------------------------------


def test_gpu_slices_by_stream_or_by_category(tmp_path: Path) -> None:
    _, rows = query_trace(
        trace(tmp_path), "SELECT name, is_gpu FROM slice_thread ORDER BY ts", engine="sqlite"
    )
    assert rows == [("it's", 0), ("aten::mm", 0), ("memcpy", 1), ("step", 1), ("k", 1)]


def test_gpu_side_ranges_hold_their_kernels(tmp_path: Path) -> None:
    sql = "SELECT name, range_name, range_category FROM slice_with_range WHERE name = 'k'"
    assert query_trace(trace(tmp_path), sql, engine="sqlite")[1] == [("k", "step", "gpu_user_annotation")]


def test_view_names_in_any_case_build_the_ancestors(tmp_path: Path) -> None:
    _, rows = query_trace(trace(tmp_path), "SELECT COUNT(*) FROM ANCESTOR", engine="sqlite")
    assert rows == [(2,)]


def test_an_unknown_example_is_refused_by_name() -> None:
    with pytest.raises(TraceQueryError, match="unknown example 'nope'"):
        example_sql("nope")
