"""`bench fused` on the GPU: Triton, eager and torch.compile on the same inputs, rows whole."""

from __future__ import annotations

import math

import pytest

from roseinfer.bench.fused_ops import run_fused_bench

pytestmark = pytest.mark.gpu


def test_fused_bench_rows():
    rows = run_fused_bench(("qwen2.5-0.5b",), (64, 333), verbose=False)
    assert [(r["rows"], r["op"]) for r in rows] == [
        (n, op) for n in (64, 333) for op in ("rmsnorm+residual", "silu_and_mul", "rotary q+k")
    ]
    for r in rows:
        assert all(
            math.isfinite(r[k]) and r[k] > 0 for k in ("floor_us", "triton_us", "eager_us", "compiled_us")
        )
        assert r["err_triton"] < 0.1 and r["err_compiled"] < 0.1, r
