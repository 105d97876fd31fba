"""`trace-sql` on damaged traces: a clear TraceQueryError (exit code 2 from the command), never a traceback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from roseinfer.trace_sql import TraceQueryError, main, query_trace

EVENTS = {"traceEvents": [{"ph": "X", "ts": 1.0, "dur": 2.0, "name": "forward", "pid": 1, "tid": 1}]}


def test_a_corrupt_gzip_trace_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = gzip.compress(json.dumps(EVENTS).encode())
    damaged = bytearray(good)
    for i in range(12, len(damaged) - 8):  # the deflate stream, not the gzip header or trailer
        damaged[i] ^= 0x5A
    trace = tmp_path / "trace.json.gz"
    trace.write_bytes(bytes(damaged))
    with pytest.raises(TraceQueryError, match="not a readable Chrome/Perfetto JSON trace"):
        query_trace(trace, "SELECT 1", engine="sqlite")
    assert main([str(trace), "SELECT 1", "--engine", "sqlite"]) == 2
    assert "not a readable" in capsys.readouterr().err


def test_events_with_malformed_timestamps_are_skipped_as_x_events_are(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    events = [
        *EVENTS["traceEvents"],
        {"ph": "X", "ts": float("inf"), "dur": 1.0, "name": "inf", "pid": 1, "tid": 1},
        {"ph": "B", "ts": 5.0, "name": "open", "pid": 1, "tid": 2},
        {"ph": "E", "ts": "later", "pid": 1, "tid": 2},
        {"ph": "s", "ts": None, "id": 7, "cat": "ac2g", "name": "launch", "pid": 1, "tid": 1},
    ]
    trace.write_text(json.dumps({"traceEvents": events}))  # json.dumps writes inf as Infinity
    _, rows = query_trace(trace, "SELECT name FROM slice ORDER BY ts", engine="sqlite")
    assert rows == [("forward",), ("open",)]
