"""Mutation audit (trace_sql/load.py): how the JSON loader nests slices and binds flows at their edges (slices
that touch, start together, never finish; flow points at a slice's first instant, chains of steps, points bound to
the enclosing or the next slice), B/E pairs and metadata, each checked on a hand-written trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from roseinfer.trace_sql import query_trace


def rows(tmp_path: Path, events: list[dict[str, Any]], sql: str) -> list[tuple]:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return query_trace(path, sql, engine="sqlite")[1]


def ev(ph: str, name: str, ts: float, dur: float | None = None, tid: int = 1, **extra: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": ph, "name": name, "cat": "c", "ts": ts, "pid": 1, "tid": tid, **extra}
    if dur is not None:
        e["dur"] = dur
    return e


def flow(ph: str, ts: float, tid: int, fid: int = 1, **extra: Any) -> dict[str, Any]:
    return {"ph": ph, "name": "f", "cat": "flow", "id": fid, "ts": ts, "pid": 1, "tid": tid, **extra}


NESTING = (
    "SELECT s.name, s.depth, p.name FROM slice s LEFT JOIN slice p ON p.id = s.parent_id ORDER BY s.name"
)
FLOWS = (
    "SELECT o.name, i.name FROM flow f JOIN slice o ON o.id = f.slice_out JOIN slice i ON i.id = f.slice_in "
    "ORDER BY o.name, i.name"
)


def test_a_slice_that_starts_as_another_ends_is_its_sibling(tmp_path: Path) -> None:
    events = [ev("X", "a", 0, 10), ev("X", "b", 10, 5)]
    assert rows(tmp_path, events, NESTING) == [("a", 0, None), ("b", 0, None)]


def test_slices_starting_together_nest_the_shorter_in_the_longer(tmp_path: Path) -> None:
    events = [ev("X", "inner", 5, 2), ev("X", "outer", 5, 10)]  # the shorter listed first
    assert rows(tmp_path, events, NESTING) == [("inner", 1, "outer"), ("outer", 0, None)]


def test_an_unfinished_begin_holds_everything_after_it(tmp_path: Path) -> None:
    events = [ev("B", "open", 0), ev("X", "child", 5, 1), ev("X", "grandchild", 5.5, 0.2)]
    assert rows(tmp_path, events, NESTING) == [
        ("child", 1, "open"),
        ("grandchild", 2, "child"),
        ("open", 0, None),
    ]


def test_an_end_before_its_begin_leaves_a_zero_duration(tmp_path: Path) -> None:
    events = [ev("B", "x", 10), ev("E", "x", 9)]
    assert rows(tmp_path, events, "SELECT dur FROM slice") == [(0,)]


def test_a_begin_and_its_end_both_give_args(tmp_path: Path) -> None:
    events = [ev("B", "x", 1, args={"a": 1}), ev("E", "x", 2, args={"b": "two"})]
    got = rows(tmp_path, events, "SELECT key, display_value FROM args ORDER BY key")
    assert got == [("args.a", "1"), ("args.b", "two")]


def test_instant_events_of_either_phase_are_slices(tmp_path: Path) -> None:
    events = [ev("i", "small_i", 1), ev("I", "big_i", 2), ev("n", "async", 3)]
    assert rows(tmp_path, events, "SELECT name, dur FROM slice ORDER BY ts") == [
        ("small_i", 0),
        ("big_i", 0),
        ("async", 0),
    ]


def test_process_labels_are_kept(tmp_path: Path) -> None:
    events = [
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "gpu"}},
        {"ph": "M", "name": "process_labels", "pid": 3, "args": {"labels": "GPU 0"}},
        ev("X", "x", 0, 1),
    ]
    got = rows(tmp_path, events, "SELECT pid, name, labels FROM process ORDER BY pid")
    assert got == [(1, None, None), (3, "gpu", "GPU 0")]


def test_a_process_known_only_by_its_labels_is_listed(tmp_path: Path) -> None:
    events = [{"ph": "M", "name": "process_labels", "pid": 7, "args": {"labels": "idle"}}, ev("X", "x", 0, 1)]
    got = rows(tmp_path, events, "SELECT pid, name, labels FROM process ORDER BY pid")
    assert got == [(1, None, None), (7, None, "idle")]


def test_a_flow_starting_as_its_launch_starts_leaves_the_launch(tmp_path: Path) -> None:
    """The start point binds to the innermost slice holding it: the launch that starts at that instant, not the
    range around it."""
    events = [
        ev("X", "range", 0, 100),
        ev("X", "launch", 10, 5),
        ev("X", "kernel", 50, 5, tid=2),
        flow("s", 10, 1),
        flow("f", 50, 2, bp="e"),
    ]
    assert rows(tmp_path, events, FLOWS) == [("launch", "kernel")]


def test_a_flow_end_without_binding_point_goes_to_the_slice_starting_there(tmp_path: Path) -> None:
    events = [
        ev("X", "launch", 10, 5),
        ev("X", "kernel", 50, 5, tid=2),
        ev("X", "later", 60, 5, tid=2),
        flow("s", 11, 1),
        flow("f", 50, 2),
    ]
    assert rows(tmp_path, events, FLOWS) == [("launch", "kernel")]


def test_a_flow_end_bound_to_the_enclosing_slice(tmp_path: Path) -> None:
    events = [
        ev("X", "launch", 10, 5),
        ev("X", "kernel", 50, 5, tid=2),
        ev("X", "later", 60, 5, tid=2),
        flow("s", 11, 1),
        flow("f", 52, 2, bp="e"),
    ]
    assert rows(tmp_path, events, FLOWS) == [("launch", "kernel")]


def test_a_flow_out_of_an_unfinished_slice(tmp_path: Path) -> None:
    events = [ev("B", "open", 0), ev("X", "kernel", 50, 5, tid=2), flow("s", 20, 1), flow("f", 50, 2, bp="e")]
    assert rows(tmp_path, events, FLOWS) == [("open", "kernel")]


def test_a_flows_start_listed_after_its_end_at_the_same_instant(tmp_path: Path) -> None:
    events = [ev("X", "a", 10, 5), ev("X", "b", 10, 5, tid=2), flow("f", 10, 2, bp="e"), flow("s", 10, 1)]
    assert rows(tmp_path, events, FLOWS) == [("a", "b")]


def test_a_flow_within_one_slice_links_nothing(tmp_path: Path) -> None:
    events = [ev("X", "a", 10, 5), flow("s", 11, 1), flow("f", 12, 1, bp="e")]
    assert rows(tmp_path, events, "SELECT COUNT(*) FROM flow") == [(0,)]


def test_a_flow_through_steps_links_each_step_to_the_next(tmp_path: Path) -> None:
    events = [
        ev("X", "a", 0, 5),
        ev("X", "b", 10, 5, tid=2),
        ev("X", "c", 20, 5, tid=3),
        flow("s", 1, 1),
        flow("t", 11, 2),
        flow("f", 21, 3, bp="e"),
    ]
    assert rows(tmp_path, events, FLOWS) == [("a", "b"), ("b", "c")]


def test_driver_launches_link_by_correlation_without_flow_events(tmp_path: Path) -> None:
    events = [
        ev("X", "cuLaunchKernel", 10, 5, cat="cuda_driver", args={"correlation": 7}),
        ev("X", "cudaLaunchKernel", 20, 5, cat="cuda_runtime", args={"correlation": 8}),
        ev("X", "k7", 50, 5, tid=2, cat="kernel", args={"correlation": 7}),
        ev("X", "k8", 60, 5, tid=2, cat="kernel", args={"correlation": 8}),
    ]
    assert rows(tmp_path, events, FLOWS) == [("cuLaunchKernel", "k7"), ("cudaLaunchKernel", "k8")]


def test_arg_values_keep_their_types(tmp_path: Path) -> None:
    events = [ev("X", "x", 0, 1, args={"flag": True, "n": 3, "ratio": 1.5, "what": "s", "none": None})]
    got = rows(
        tmp_path,
        events,
        "SELECT key, int_value, string_value, real_value, value_type, display_value FROM args ORDER BY key",
    )
    assert got == [
        ("args.flag", 1, None, None, "bool", "true"),
        ("args.n", 3, None, None, "int", "3"),
        ("args.none", None, None, None, "null", None),
        ("args.ratio", None, None, 1.5, "real", "1.5"),
        ("args.what", None, "s", None, "string", "s"),
    ]


def test_extract_arg_takes_the_key_with_or_without_its_prefix(tmp_path: Path) -> None:
    events = [ev("X", "x", 0, 1, args={"correlation": 7, "flag": False})]
    sql = (
        "SELECT EXTRACT_ARG(arg_set_id, 'correlation'), EXTRACT_ARG(arg_set_id, 'args.correlation'), "
        "EXTRACT_ARG(arg_set_id, 'flag'), EXTRACT_ARG(arg_set_id, 'nope') FROM slice"
    )
    assert rows(tmp_path, events, sql) == [(7, 7, 0, None)]


def test_a_named_process_without_events_is_listed(tmp_path: Path) -> None:
    events = [{"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "idle"}}, ev("X", "x", 0, 1)]
    assert rows(tmp_path, events, "SELECT pid, name FROM process ORDER BY pid") == [(1, None), (9, "idle")]


def test_threads_keep_their_tid_and_name(tmp_path: Path) -> None:
    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 42, "args": {"name": "stream 7"}},
        ev("X", "k", 0, 1, tid=42, cat="kernel"),
    ]
    got = rows(tmp_path, events, "SELECT tid, pid, thread_name, is_gpu FROM slice_thread")
    assert got == [(42, 1, "stream 7", 1)]
