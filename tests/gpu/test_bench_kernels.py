"""`bench kernels` on the GPU: its graph timer divides by the launches it replays, and its rows are whole."""

from __future__ import annotations

import math

import pytest
import torch

from roseinfer.bench.kernels import _graph_back_to_back_ms, run_kernel_bench

pytestmark = pytest.mark.gpu


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


def test_kernel_bench_rows():
    rows = run_kernel_bench(verbose=False)
    kernels = [r["kernel"] for r in rows]
    assert kernels == ["d2d_copy", "paged_decode", "paged_decode", "paged_prefill", "sdpa_flash"]
    for row in rows[1:3]:
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("ms", "ms_1layer_flushed", "pct_of_copy"))
        assert 5 < row["pct_of_copy"] < 150, row
    assert rows[3]["max_abs_err_vs_sdpa"] < 2e-2
