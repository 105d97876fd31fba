"""profile_to / record / enable_nvtx, and `trace-sql` over the traces they write (CPU only)."""

from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from roseinfer import profiling
from roseinfer.profiling import enable_nvtx, profile_to, record
from roseinfer.trace_sql import (
    EXAMPLES,
    TraceQueryError,
    add_trace_sql_parser,
    example_sql,
    format_table,
    load_trace_sqlite,
    query_trace,
    run_trace_sql,
    split_statements,
)
from tests.fake_perfetto import install_fake_perfetto

NUM_STEPS = 2
MM_PER_FORWARD = 3


def _workload() -> None:
    a = torch.randn(32, 32)
    w = torch.randn(32, 32)
    cache = torch.zeros(8, 32)
    for _ in range(NUM_STEPS):
        with record("schedule"):
            ids = list(range(8))
        with record("forward"):
            h = a
            for _ in range(MM_PER_FORWARD):
                h = torch.mm(h, w)
            with record("kv_write"):
                cache[: len(ids)].copy_(h[: len(ids)])
        with record("sample"):
            h.argmax(-1).tolist()


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prof") / "nested" / "trace.json"
    with profile_to(str(path)) as prof:
        assert prof is not None
        _workload()
    assert path.is_file()
    return path


def _sql(trace: Path, sql: str) -> list[dict[str, Any]]:
    columns, rows = query_trace(trace, sql, engine="sqlite")
    return [dict(zip(columns, r)) for r in rows]


# -- profiling.py ----------------------------------------------------------------------------------


def test_profile_to_none_is_a_noop() -> None:
    with profile_to(None) as prof:
        x = torch.ones(2) + 1
    assert prof is None and x.sum().item() == 4


def test_profile_to_writes_json(cpu_trace: Path) -> None:
    data = json.loads(cpu_trace.read_text())
    names = {e.get("name") for e in data["traceEvents"]}
    assert {"schedule", "forward", "kv_write", "sample"} <= names


def test_profile_to_gz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json.gz"
    with profile_to(path):
        with record("forward"):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    assert "[profile] wrote:" in capsys.readouterr().out
    assert path.read_bytes()[:2] == b"\x1f\x8b" and b"traceEvents" in gzip.open(path).read()
    rows = _sql(path, "SELECT COUNT(*) AS n FROM slice WHERE name = 'forward'")
    assert rows == [{"n": 1}]


def test_enable_nvtx_switches_and_record_still_works() -> None:
    before = profiling.nvtx_enabled()
    try:
        assert enable_nvtx(True) == before
        assert profiling.nvtx_enabled()
        with record("x"):  # no CUDA here: NVTX calls are skipped, the range still works
            pass
        assert enable_nvtx(False) is True
        assert not profiling.NVTX
    finally:
        enable_nvtx(before)


# -- trace-sql on a real CPU trace -----------------------------------------------------------------


def test_ranges_are_found(cpu_trace: Path) -> None:
    rows = _sql(cpu_trace, example_sql("range-times"))
    by_name = {r["name"]: r for r in rows if r["category"] == "user_annotation"}
    for name in ("schedule", "forward", "kv_write", "sample"):
        assert by_name[name]["n"] == NUM_STEPS
        assert by_name[name]["total_ms"] > 0


def test_mm_inside_forward_through_ancestor(cpu_trace: Path) -> None:
    rows = _sql(
        cpu_trace,
        """
        SELECT s.name, COUNT(*) AS n, SUM(s.dur) AS total_ns, MIN(s.dur) AS min_ns
        FROM slice s
        JOIN ancestor a ON a.slice_id = s.id
        JOIN slice r ON r.id = a.ancestor_id
        WHERE r.name = 'forward' AND r.category = 'user_annotation' AND s.name LIKE 'aten::%'
        GROUP BY s.name
        """,
    )
    ops = {r["name"]: r for r in rows}
    assert ops["aten::mm"]["n"] == NUM_STEPS * MM_PER_FORWARD
    assert ops["aten::mm"]["total_ns"] > 0 and ops["aten::mm"]["min_ns"] > 0
    assert ops["aten::copy_"]["n"] == NUM_STEPS  # the kv_write copy, nested two ranges deep
    assert "aten::argmax" not in ops  # that one is in 'sample'

    # the canned query agrees, and the same question through slice_with_range
    canned = {r["name"]: r["n"] for r in _sql(cpu_trace, example_sql("ops-in-range", "forward"))}
    assert canned["aten::mm"] == NUM_STEPS * MM_PER_FORWARD
    in_sample = _sql(
        cpu_trace,
        "SELECT name, COUNT(*) AS n FROM slice_with_range WHERE range_name = 'sample' GROUP BY name",
    )
    assert {r["name"] for r in in_sample} >= {"aten::argmax"}
    assert "aten::mm" not in {r["name"] for r in in_sample}
    copies = _sql(
        cpu_trace,
        "SELECT range_name, COUNT(*) AS n FROM slice_with_range WHERE name = 'aten::copy_' "
        "GROUP BY range_name ORDER BY range_name",
    )
    assert copies == [{"range_name": "forward", "n": NUM_STEPS}, {"range_name": "kv_write", "n": NUM_STEPS}]


def test_nesting_is_consistent(cpu_trace: Path) -> None:
    bad = _sql(
        cpu_trace,
        """
        SELECT COUNT(*) AS n FROM slice c JOIN slice p ON p.id = c.parent_id
        WHERE c.track_id != p.track_id OR c.depth != p.depth + 1 OR c.ts < p.ts
        """,
    )
    assert bad == [{"n": 0}]
    depth = _sql(cpu_trace, "SELECT depth, parent_id FROM slice WHERE name = 'kv_write' LIMIT 1")[0]
    parent = _sql(cpu_trace, f"SELECT name FROM slice WHERE id = {depth['parent_id']}")
    assert parent == [{"name": "forward"}]
    threads = _sql(cpu_trace, "SELECT DISTINCT thread_name, is_gpu FROM slice_thread WHERE name = 'forward'")
    assert len(threads) == 1 and threads[0]["is_gpu"] == 0 and threads[0]["thread_name"]


def test_perfetto_style_aliases_and_args(cpu_trace: Path) -> None:
    rows = _sql(
        cpu_trace,
        "SELECT slice_id, cat, EXTRACT_ARG(arg_set_id, 'args.Record function id') IS NOT NULL AS has_id "
        "FROM slice WHERE name = 'forward' ORDER BY ts",
    )
    assert len(rows) == NUM_STEPS and all(r["cat"] == "user_annotation" for r in rows)
    assert all(r["has_id"] == 1 for r in rows)


def test_multiple_statements_return_the_last(cpu_trace: Path) -> None:
    rows = _sql(
        cpu_trace,
        "CREATE TEMP VIEW mm AS SELECT * FROM slice WHERE name = 'aten::mm'; -- a view\n"
        "SELECT COUNT(*) AS n FROM mm; -- trailing comment",
    )
    assert rows == [{"n": NUM_STEPS * MM_PER_FORWARD}]
    assert split_statements("SELECT ';'; SELECT 2") == ["SELECT ';';", " SELECT 2"]


def test_malformed_sql_is_a_clear_error(cpu_trace: Path) -> None:
    with pytest.raises(TraceQueryError, match=r"SQL error: .*syntax error"):
        query_trace(cpu_trace, "SELEC name FROM slice", engine="sqlite")
    with pytest.raises(TraceQueryError, match=r"SQL error: no such column: nope"):
        query_trace(cpu_trace, "SELECT nope FROM slice", engine="sqlite")
    with pytest.raises(TraceQueryError, match="empty SQL"):
        query_trace(cpu_trace, "  ", engine="sqlite")


def test_missing_or_bad_trace_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceQueryError, match="trace file not found: .*nope.json"):
        query_trace(tmp_path / "nope.json", "SELECT 1", engine="sqlite")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceQueryError, match="not a readable Chrome/Perfetto JSON trace"):
        query_trace(bad, "SELECT 1", engine="sqlite")
    with pytest.raises(TraceQueryError, match="unknown engine"):
        query_trace(bad, "SELECT 1", engine="duckdb")


def test_cli(cpu_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="roseinfer")
    add_trace_sql_parser(parser.add_subparsers(dest="command", required=True))

    args = parser.parse_args(
        [
            "trace-sql",
            str(cpu_trace),
            "SELECT name, COUNT(*) AS n FROM slice "
            "WHERE name IN ('forward', 'sample') GROUP BY name ORDER BY name",
            "--engine",
            "sqlite",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["|", "name", "|", "n", "|"]
    assert out[2].split() == ["|", "forward", "|", str(NUM_STEPS), "|"]
    assert out[-1] == "(2 rows)"

    args = parser.parse_args(
        ["trace-sql", str(cpu_trace), "--example", "ops-in-range", "--range", "kv_write", "--format", "csv"]
    )
    assert run_trace_sql(args) == 0
    assert "aten::copy_" in capsys.readouterr().out

    args = parser.parse_args(["trace-sql", str(cpu_trace), "SELECT FROM", "--engine", "sqlite"])
    assert run_trace_sql(args) == 2
    assert "error: SQL error" in capsys.readouterr().err

    args = parser.parse_args(["trace-sql", str(cpu_trace)])
    assert run_trace_sql(args) == 2
    assert "ops-in-range" in capsys.readouterr().err


def test_format_table() -> None:
    text = format_table(["name", "ms", "x"], [("a", 1.5, None), ("bb", 0.25, 3)])
    assert text.splitlines() == [
        "| name |   ms |    x |",
        "|------|-----:|-----:|",
        "| a    |  1.5 | NULL |",
        "| bb   | 0.25 |    3 |",
        "(2 rows)",
    ]


# -- synthetic CUDA trace (the shape kineto writes) ------------------------------------------------

CPU = {"pid": 100, "tid": 100}
GPU = {"pid": 0, "tid": 7}


def _x(where: dict[str, int], cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **where, "args": args}


def _cuda_events(with_flows: bool) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "thread 100 (python)"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
        _x(CPU, "user_annotation", "schedule", 0, 10),
        _x(CPU, "user_annotation", "forward", 20, 100),
        _x(CPU, "cpu_op", "aten::mm", 25, 20),
        _x(CPU, "cuda_runtime", "cudaLaunchKernel", 30, 5, correlation=1),
        _x(CPU, "user_annotation", "kv_write", 50, 30),
        _x(CPU, "cpu_op", "aten::copy_", 55, 20),
        _x(CPU, "cuda_runtime", "cudaLaunchKernel", 60, 5, correlation=2),
        _x(CPU, "user_annotation", "schedule", 130, 10),
        _x(CPU, "user_annotation", "forward", 150, 50),
        _x(CPU, "cuda_runtime", "cudaLaunchKernel", 160, 5, correlation=3),
        _x(GPU, "kernel", "gemm", 40, 30, correlation=1, grid=[4, 1, 1]),
        _x(GPU, "kernel", "copy_kernel", 75, 10, correlation=2),
        _x(GPU, "kernel", "gemm", 170, 20, correlation=3),
    ]
    if with_flows:
        for corr, (cpu_ts, gpu_ts) in enumerate([(30, 40), (60, 75), (160, 170)], start=1):
            events.append({"ph": "s", "id": corr, "cat": "ac2g", "name": "ac2g", "ts": cpu_ts, **CPU})
            events.append(
                {"ph": "f", "id": corr, "cat": "ac2g", "name": "ac2g", "ts": gpu_ts, "bp": "e", **GPU}
            )
    return events[::-1]  # out of order on purpose


@pytest.fixture(params=[True, False], ids=["flow-events", "correlation"])
def cuda_trace(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps({"traceEvents": _cuda_events(request.param)}))
    return path


def test_cuda_queries(cuda_trace: Path) -> None:
    steps = _sql(cuda_trace, example_sql("launches-per-step"))
    assert [(r["step"], r["cudaLaunchKernel"], r["launches"]) for r in steps] == [(1, 2, 2), (2, 1, 1)]

    gaps = _sql(cuda_trace, example_sql("gpu-gaps"))
    assert len(gaps) == 1
    assert gaps[0]["kernels"] == 3 and gaps[0]["stream"] == "stream 7 "
    assert gaps[0]["busy_ms"] == pytest.approx(0.060) and gaps[0]["idle_ms"] == pytest.approx(0.090)
    assert gaps[0]["max_gap_us"] == pytest.approx(85)
    top = _sql(cuda_trace, example_sql("largest-gpu-gaps"))
    assert (top[0]["gap_us"], top[0]["before"], top[0]["after"]) == (85, "copy_kernel", "gemm")

    kernels = _sql(cuda_trace, example_sql("top-kernels"))
    assert [(r["kernel"], r["n"]) for r in kernels] == [("gemm", 2), ("copy_kernel", 1)]
    assert kernels[0]["total_ms"] == pytest.approx(0.050) and kernels[0]["avg_us"] == pytest.approx(25)

    per_range = {r["range_name"]: r for r in _sql(cuda_trace, example_sql("kernels-per-range"))}
    assert per_range["forward"]["kernels"] == 3 and per_range["forward"]["gpu_ms"] == pytest.approx(0.060)
    assert per_range["kv_write"]["kernels"] == 1 and per_range["kv_write"]["gpu_ms"] == pytest.approx(0.010)
    assert "schedule" not in per_range

    gpu = _sql(
        cuda_trace, "SELECT DISTINCT process_name, thread_name, is_gpu FROM slice_thread WHERE cat = 'kernel'"
    )
    assert gpu == [{"process_name": "python", "thread_name": "stream 7 ", "is_gpu": 1}]
    grid = _sql(cuda_trace, "SELECT key, int_value FROM args WHERE flat_key = 'args.grid' ORDER BY key")
    assert grid == [
        {"key": "args.grid[0]", "int_value": 4},
        {"key": "args.grid[1]", "int_value": 1},
        {"key": "args.grid[2]", "int_value": 1},
    ]


def test_decode_busy_counts_steady_decode_once_across_streams(tmp_path: Path) -> None:
    """The window opens at the first decode attention after the last prefill attention (a decode kernel
    of an earlier mixed step does not open it) and closes at the last GPU activity; a kernel that
    straddles the opening is clipped, and a copy on another stream that overlaps a kernel counts once."""
    copy_stream = {"pid": 0, "tid": 9}
    events = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 9, "args": {"name": "stream 9 "}},
        _x(GPU, "kernel", "_decode_kernel", 5, 3),  # a mixed step's decode rows
        _x(GPU, "kernel", "_prefill_kernel", 10, 20),
        _x(GPU, "kernel", "gemm", 30, 82),  # ends at 112, inside the decode window
        _x(GPU, "kernel", "_decode_kernel", 110, 10),  # the window opens at 110
        _x(GPU, "kernel", "gemm", 125, 15),
        _x(copy_stream, "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 130, 20),
        _x(GPU, "kernel", "_pick_kernel", 141, 2),
        _x(GPU, "kernel", "_decode_kernel", 160, 10),
        _x(GPU, "kernel", "gemm", 172, 6),
        _x(GPU, "kernel", "_pick_kernel", 178, 2),  # the window closes at 180
    ]
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"traceEvents": events[::-1]}))
    [row] = _sql(path, example_sql("decode-busy"))
    # busy: [110, 120] + [125, 150] + [160, 170] + [172, 180] = 53 us of a 70 us window, in two steps
    assert row["window_ms"] == pytest.approx(0.070) and row["busy_ms"] == pytest.approx(0.053)
    assert row["idle_ms"] == pytest.approx(0.017) and row["busy_pct"] == pytest.approx(75.71)
    assert row["kernels"] == 8 and row["steps"] == 2 and row["busy_us_per_step"] == pytest.approx(26.5)


def test_graph_launch_flows_to_every_kernel(tmp_path: Path) -> None:
    """A cudaGraphLaunch has one 's' and an 'f' per kernel; an 'f' without an 's' links nothing."""
    events = [
        _x(CPU, "user_annotation", "forward", 0, 50),
        _x(CPU, "cuda_runtime", "cudaGraphLaunch", 10, 5, correlation=9),
        _x(CPU, "cuda_runtime", "cudaStreamIsCapturing", 20, 1, correlation=10),
        _x(GPU, "kernel", "gemm", 30, 4, correlation=9),
        _x(GPU, "kernel", "relu", 35, 2, correlation=9),
        {"ph": "s", "id": 9, "cat": "ac2g", "name": "ac2g", "ts": 10, **CPU},
        {"ph": "f", "id": 9, "cat": "ac2g", "name": "ac2g", "ts": 30, "bp": "e", **GPU},
        {"ph": "f", "id": 9, "cat": "ac2g", "name": "ac2g", "ts": 35, "bp": "e", **GPU},
        {"ph": "f", "id": 10, "cat": "ac2g", "name": "ac2g", "ts": 20, "bp": "e", **CPU},
    ]
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"traceEvents": events}))
    rows = _sql(
        path,
        "SELECT o.name AS launch, k.name AS kernel FROM flow f JOIN slice o ON o.id = f.slice_out "
        "JOIN slice k ON k.id = f.slice_in ORDER BY k.ts",
    )
    assert rows == [
        {"launch": "cudaGraphLaunch", "kernel": "gemm"},
        {"launch": "cudaGraphLaunch", "kernel": "relu"},
    ]
    per_range = _sql(path, example_sql("kernels-per-range"))
    assert per_range == [{"range_name": "forward", "kernels": 2, "gpu_ms": pytest.approx(0.006)}]


def test_begin_end_pairs_and_instants(tmp_path: Path) -> None:
    events = [
        {"ph": "B", "name": "outer", "cat": "user_annotation", "ts": 0, **CPU},
        {"ph": "B", "name": "inner", "cat": "user_annotation", "ts": 1, **CPU},
        {"ph": "i", "name": "mark", "ts": 2, "s": "t", **CPU},
        {"ph": "E", "ts": 3, **CPU},
        {"ph": "E", "ts": 10, **CPU},
        {"ph": "B", "name": "unfinished", "ts": 20, **CPU},
    ]
    path = tmp_path / "be.json"
    path.write_text(json.dumps(events))  # a bare list is a valid Chrome trace too
    rows = _sql(path, "SELECT name, ts, dur, depth, parent_id FROM slice ORDER BY ts")
    assert rows == [
        {"name": "outer", "ts": 0, "dur": 10_000, "depth": 0, "parent_id": None},
        {"name": "inner", "ts": 1_000, "dur": 2_000, "depth": 1, "parent_id": 0},
        {"name": "mark", "ts": 2_000, "dur": 0, "depth": 2, "parent_id": 1},
        {"name": "unfinished", "ts": 20_000, "dur": -1, "depth": 0, "parent_id": None},
    ]


# -- engine choice ---------------------------------------------------------------------------------


class _FakeTraceProcessor:
    """Stands in for perfetto's TraceProcessor: answers from the sqlite loader, rejects PERFETTO DDL."""

    started: list[str | None] = []

    def __init__(self, trace: str, config: Any) -> None:
        if config.bin_path == "broken":
            raise RuntimeError("could not start")
        type(self).started.append(config.bin_path)
        self.db = load_trace_sqlite(trace, ancestors=False)

    def query(self, sql: str) -> Any:
        if "PERFETTO" in sql:
            raise RuntimeError("no PERFETTO DDL in this fake")
        try:
            cur = self.db.execute(sql)
        except sqlite3.Error as e:
            raise RuntimeError(str(e)) from e
        names = [d[0] for d in cur.description] if cur.description else []
        rows = [types.SimpleNamespace(**dict(zip(names, r))) for r in cur.fetchall()]
        return _Result(names, rows)

    def close(self) -> None:
        self.db.close()


class _Result(list):  # type: ignore[type-arg]
    def __init__(self, names: list[str], rows: list[Any]) -> None:
        super().__init__(rows)
        self.column_names = names


@pytest.fixture
def fake_perfetto(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    install_fake_perfetto(monkeypatch, _FakeTraceProcessor)
    binary = tmp_path / "trace_processor_shell"
    binary.write_text("")
    _FakeTraceProcessor.started = []
    return binary


def test_perfetto_engine_plumbing(cpu_trace: Path, fake_perfetto: Path) -> None:
    sql = example_sql("ops-in-range", "forward")
    cols, rows = query_trace(cpu_trace, sql, engine="auto", tp_bin=str(fake_perfetto))
    assert _FakeTraceProcessor.started == [str(fake_perfetto)]
    assert (cols, rows) == query_trace(cpu_trace, sql, engine="sqlite")


def test_auto_falls_back_when_perfetto_cannot_start(
    cpu_trace: Path, fake_perfetto: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("roseinfer.trace_sql.engines.find_trace_processor", lambda tp_bin=None: "broken")
    _, rows = query_trace(cpu_trace, "SELECT COUNT(*) FROM slice WHERE name = 'forward'", engine="auto")
    assert rows == [(NUM_STEPS,)]
    assert "using the built-in sqlite engine" in capsys.readouterr().err
    with pytest.raises(TraceQueryError, match="did not start"):
        query_trace(cpu_trace, "SELECT 1", engine="perfetto")


def test_auto_without_a_local_binary_uses_sqlite(cpu_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("roseinfer.trace_sql.engines.find_trace_processor", lambda tp_bin=None: None)
    _, rows = query_trace(cpu_trace, "SELECT COUNT(*) FROM slice WHERE name = 'sample'")
    assert rows == [(NUM_STEPS,)]


def test_examples_are_all_valid_sql(cpu_trace: Path) -> None:
    for name in EXAMPLES:
        query_trace(cpu_trace, example_sql(name), engine="sqlite")


@pytest.mark.parametrize(
    "path, want",
    [
        ("out/trace.json", "out/trace.static.json"),
        ("out/trace.json.gz", "out/trace.static.json.gz"),
        ("trace.gz", "trace.static.gz"),
        ("trace", "trace.static.json"),
    ],
)
def test_each_modes_trace_keeps_the_extension(path: str, want: str) -> None:
    """A .json.gz path used to become trace.json.gz.static.json, written uncompressed."""
    from roseinfer.profiling import trace_path_for

    assert trace_path_for(path, "static") == want


@pytest.mark.parametrize("bench", ["kernels", "fused"])
def test_gpu_benches_refuse_a_cpu_machine_in_one_line(bench: str, monkeypatch) -> None:
    from roseinfer.entrypoints.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=f"bench {bench} needs a CUDA GPU"):
        main(["bench", bench])
