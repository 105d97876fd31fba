"""`bench kernels` on the GPU: its graph timer divides by the launches it replays, and its rows are whole."""

from __future__ import annotations

import math

import pytest
import torch

from roseinfer.bench.kernels import _graph_back_to_back_ms, run_kernel_bench

pytestmark = pytest.mark.gpu


@pytest.mark.timing
def test_back_to_back_timer_is_per_launch():
    src = torch.empty(1 << 26, dtype=torch.bfloat16, device="cuda").normal_()
    dsts = [torch.empty_like(src) for _ in range(4)]

    def copies(n: int) -> None:
        for dst in dsts[:n]:
            dst.copy_(src)

    one = _graph_back_to_back_ms(lambda: copies(1), 1)
    four = _graph_back_to_back_ms(lambda: copies(4), 4)
    # The same 128 MB copy, timed per launch either way (not 4x apart).
    assert 0.7 < four / one < 1.3, (one, four)


@pytest.mark.timing
def test_kernel_bench_rows():
    rows = run_kernel_bench(verbose=False)
    kernels = [r["kernel"] for r in rows]
    assert kernels == ["d2d_copy", "paged_decode", "paged_decode", "paged_prefill", "sdpa_flash"]
    for row in rows[1:3]:
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("ms", "ms_1layer_flushed", "pct_of_copy"))
        assert 5 < row["pct_of_copy"] < 150, row
    assert rows[3]["max_abs_err_vs_sdpa"] < 2e-2


@pytest.mark.timing
def test_steady_timer_is_per_call():
    from roseinfer.bench.env import back_to_back_time, median_time

    src = torch.empty(1 << 26, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    device = torch.device("cuda", torch.cuda.current_device())
    alone = median_time(lambda: dst.copy_(src), device, warmup=3, repeats=20)
    short = back_to_back_time(lambda: dst.copy_(src), device, warmup=3, repeats=5)
    long = back_to_back_time(lambda: dst.copy_(src), device, warmup=3, repeats=40)
    # A 128 MB copy is device-bound: per call, the same time however many run in a row.
    assert 0.7 < short / alone < 1.3, (alone, short)
    assert 0.7 < long / alone < 1.3, (alone, long)


def test_roofline_times_decode_steps_alone_and_steady():
    import argparse

    from roseinfer.bench.roofline import add_arguments, format_table, run_roofline

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--batches", "1,4", "--contexts", "64", "--prefill-tokens", "64", "--iters", "4",
         "--gpu-memory-utilization", "0.3"]
    )  # fmt: skip
    result = run_roofline(args)
    decodes = [r for r in result["rows"] if r["kind"] == "decode"]
    assert [r["batch"] for r in decodes] == [1, 4]
    for r in decodes:
        assert r["graph"] and r["ms"] > 0 and r["steady_ms"] > 0, r
        assert math.isclose(r["steady_x_floor"] * r["floor_ms"], r["steady_ms"], rel_tol=1e-9)
    prefills = [r for r in result["rows"] if r["kind"] == "prefill"]
    assert len(prefills) == 1 and prefills[0]["graph"], (
        "a 64-token prefill fits the engine's mixed-step graphs"
    )
    table = format_table(result)
    assert "steady ms" in table and len(table.splitlines()) == 3 + len(result["rows"])
