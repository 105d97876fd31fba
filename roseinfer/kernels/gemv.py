"""Matrix-vector product for one-token decode, with a decoder layer's small neighbours folded in.

At batch 1 a decode step is a chain of GEMVs: each must stream its weight at the memory's full rate, and
each separate norm or activation kernel between them is a launch that moves almost no bytes. A program
owns BLOCK_N output columns of one row and streams their [BLOCK_N, K] weight rows in [BLOCK_N, BLOCK_K]
tiles. The products accumulate element-wise in a [BLOCK_N, BLOCK_K] register tile and are reduced once,
after the loop, so nothing in the loop waits on a reduction and the software pipeliner can keep
`NUM_STAGES` tiles in flight.

Flags fold in:
- `norm_weight`: RMSNorm of the input row first (its sum of squares in a first pass over the row, a few
  KiB that stay in cache), rounded exactly as `kernels/rmsnorm.py` rounds it;
- `bias`;
- `gated`: the weight stacks [gate; up] (2N rows) and the output is `silu(gate) * up`;
- `residual`: added after the product is rounded, as a separate add would be.
A llama layer at batch 1 becomes qkv(+norm), attention, o(+residual), gate_up(+norm, SwiGLU),
down(+residual): five launches instead of eight.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from roseinfer.kernels._common import cdiv, is_interpret, next_power_of_2, num_sms
from roseinfer.kernels.activation import silu_and_mul_ref
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.rmsnorm import rmsnorm_ref


class GemvTile(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    norm_w_ptr,
    res_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    stride_rm,
    up_offset,
    eps,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    GATED: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_xm
    dtype = x_ptr.dtype.element_ty

    if NORM:  # the whole row in one load: a loop of dependent loads costs a memory latency per step
        row_ks = tl.arange(0, NORM_BLOCK)
        xr = tl.load(x_row + row_ks, mask=row_ks < K, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xr * xr, axis=0) / K + eps)

    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    up_rows = w_rows + up_offset
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        k_ok = (k0 + ks) < K
        mask = col_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + (k0 + ks)[None, :], mask=mask, other=0.0)
        if GATED:
            w_up = tl.load(up_rows + (k0 + ks)[None, :], mask=mask, other=0.0)
        xv = tl.load(x_row + k0 + ks, mask=k_ok, other=0.0)
        if NORM:
            g = tl.load(norm_w_ptr + k0 + ks, mask=k_ok, other=0.0)
            xv = (g.to(tl.float32) * (xv.to(tl.float32) * rstd).to(dtype).to(tl.float32)).to(dtype)
        xf = xv.to(tl.float32)[None, :]
        acc += w.to(tl.float32) * xf
        if GATED:
            acc_up += w_up.to(tl.float32) * xf

    y = tl.sum(acc, axis=1)
    if BIAS:
        y += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = y.to(dtype).to(tl.float32)  # the product rounded, as a separate linear stores it
    if GATED:
        up = tl.sum(acc_up, axis=1)
        if BIAS:
            up += tl.load(bias_ptr + N + cols, mask=col_ok, other=0.0).to(tl.float32)
        up = up.to(dtype).to(tl.float32)
        act = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32)
        y = (act * up).to(dtype).to(tl.float32)
    if RESIDUAL:
        y += tl.load(res_ptr + row * stride_rm + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, y.to(dtype), mask=col_ok)


launcher = DirectLaunch(_gemv_kernel)


def gemv_tile(n: int, k: int, gated: bool, device: torch.device) -> GemvTile:
    """Column tiles narrow enough that every SM gets at least two programs, K tiles wide enough that each
    program has ~16 KiB of weight per step (from `scripts/sweep_gemv.py` on an H200: within a few percent of
    the best tile for every qwen2.5-0.5b and llama-3.1-8b linear)."""
    if is_interpret():
        return GemvTile(4, 32, 1, 1)
    if gated:  # two weight tiles per step
        return GemvTile(8, 256, 4, 3)
    block_n = 16
    while block_n > 4 and cdiv(n, block_n) < 2 * num_sms(device):
        block_n //= 2
    return GemvTile(block_n, max(128, min(1024, next_power_of_2(k), 8192 // block_n)), 4, 3)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    tile: GemvTile | None = None,
) -> torch.Tensor:
    """x: [M, K] (meant for M == 1); weight: [N, K] ([2N, K] when gated, gate rows first); returns a new
    [M, N] in x's dtype. Each row streams the whole weight, so more rows cost proportionally more."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"gemv needs x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("gemv needs contiguous last dimensions")
    if gated and weight.shape[0] % 2:
        raise ValueError("a gated weight stacks gate and up: it needs an even number of rows")
    m, k = x.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"norm_weight must be [{k}], got {tuple(norm_weight.shape)}")
    if residual is not None and (residual.shape != (m, n) or residual.stride(-1) != 1):
        raise ValueError(f"residual must be [{m}, {n}] with a contiguous last dimension")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    t = tile or gemv_tile(n, k, gated, x.device)
    args = (
        x, weight, out, bias if bias is not None else weight, norm_weight if norm_weight is not None else weight,
        residual if residual is not None else out, n, k, x.stride(0), weight.stride(0), out.stride(0),
        residual.stride(0) if residual is not None else 0, n * weight.stride(0), eps,
    )  # fmt: skip
    constexprs = dict(
        NORM=norm_weight is not None, BIAS=bias is not None, GATED=gated, RESIDUAL=residual is not None,
        BLOCK_N=t.block_n, BLOCK_K=t.block_k, NUM_STAGES=t.num_stages,
        NORM_BLOCK=next_power_of_2(k) if norm_weight is not None else 1, num_warps=t.num_warps,
    )  # fmt: skip
    launcher.run((cdiv(n, t.block_n), m), args, constexprs)
    return out


def gemv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The separate ops the GEMV replaces, with HF's RMSNorm rounding."""
    if norm_weight is not None:
        x = rmsnorm_ref(x, norm_weight, eps)
    y = F.linear(x, weight, bias)
    if gated:
        y = silu_and_mul_ref(y)
    if residual is not None:
        y = y + residual
    return y
