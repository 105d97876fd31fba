"""Linear layer for few-token steps with the layer's small neighbours folded in: one launch each.

`out = epilogue(prologue(a) @ w.T)` where, by flags:
- `norm_weight`: the prologue is RMSNorm. `rmsnorm(a) @ w.T == (a * norm_weight) @ w.T * rstd(a)`, so the
  program scales each A tile by the norm weight, accumulates the row's sum of squares while it walks K,
  and scales the finished rows by `rstd` (no split of K, so every program sees whole rows).
- `bias`: added after the product.
- `gated`: `w` is a stacked [gate; up] weight of 2N rows; the program keeps both products of its column
  tile and writes `silu(gate) * up`, so the SwiGLU activation never goes through memory at full width.
- `residual`: added last, in float32, then rounded once; `out` may be `residual` itself (the residual
  stream updated in place, element by element by the program that read it).

A decode step of a small model spends more time launching and waiting between its ~11 kernels per layer
than moving bytes; with these the layer is qkv(+norm, bias), rotary + KV write, attention, o(+residual),
gate_up(+norm, SwiGLU), down(+residual). Large steps keep cuBLAS, which wins once the product is big.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from roseinfer.kernels._common import dot_dtype, dot_precision


@dataclass(frozen=True)
class LinearTile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    swap_ab: bool = False


@triton.jit
def _fused_linear_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    norm_w_ptr,
    res_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_om,
    stride_rm,
    up_offset,
    eps,
    NORM: tl.constexpr,
    BIAS: tl.constexpr,
    GATED: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SWAP_AB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_wn + ks[None, :]

    if SWAP_AB:  # accumulate out.T: the weight tile is the MMA's tall side, the few rows its narrow side
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + ks) < K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            af = a.to(tl.float32)
            sum_sq += tl.sum(af * af, axis=1)
            if EVEN_K:
                g = tl.load(norm_w_ptr + k0 + ks)
            else:
                g = tl.load(norm_w_ptr + k0 + ks, mask=(k0 + ks) < K, other=0.0)
            a = (af * g.to(tl.float32)).to(a.dtype)
        a = a.to(DOT_DTYPE)
        if SWAP_AB:
            acc = tl.dot(w.to(DOT_DTYPE), tl.trans(a), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(a, tl.trans(w.to(DOT_DTYPE)), acc, input_precision=PRECISION)
        if GATED:
            if EVEN_K:
                w_up = tl.load(w_ptrs + up_offset, mask=col_ok[:, None], other=0.0)
            else:
                w_up = tl.load(w_ptrs + up_offset, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            if SWAP_AB:
                acc_up = tl.dot(w_up.to(DOT_DTYPE), tl.trans(a), acc_up, input_precision=PRECISION)
            else:
                acc_up = tl.dot(a, tl.trans(w_up.to(DOT_DTYPE)), acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K

    if SWAP_AB:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    if NORM:
        rstd = tl.rsqrt(sum_sq / K + eps)
        acc = acc * rstd[:, None]
        if GATED:
            acc_up = acc_up * rstd[:, None]
    out_dtype = out_ptr.dtype.element_ty
    if BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        gate = acc.to(out_dtype).to(
            tl.float32
        )  # the projections are rounded, as the unfused path stores them
        up = acc_up.to(out_dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_dtype).to(tl.float32)
        acc = act * up
    mask = row_ok[:, None] & col_ok[None, :]
    if RESIDUAL:
        res = tl.load(res_ptr + rows.to(tl.int64)[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
        acc += res.to(tl.float32)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :], acc.to(out_dtype), mask=mask)


def default_tile(m: int, n: int, k: int, gated: bool) -> LinearTile:
    """A tile that fills the GPU for a few-token product: thin rows, narrow column tiles so that there
    are enough programs to pull the weight at full bandwidth, no split of K (the norm needs whole rows)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = 16 if gated or n * k <= 4096 * 4096 else 32
    block_k = 256 if k >= 2048 else 128
    return LinearTile(block_m, block_n, block_k)


def fused_linear(
    a: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tile: LinearTile | None = None,
) -> torch.Tensor:
    """a: [M, K]; weight: [N, K] ([2N, K] when gated, gate rows first); returns out [M, N].

    With `residual` ([M, N]) the result is `... + residual`; pass `out=residual` to update it in place.
    """
    if a.dim() != 2 or weight.dim() != 2 or a.shape[1] != weight.shape[1]:
        raise ValueError(
            f"fused_linear needs a [M, K] and weight [N, K], got {tuple(a.shape)}, {tuple(weight.shape)}"
        )
    if a.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("fused_linear needs contiguous last dimensions")
    m, k = a.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    if gated and weight.shape[0] % 2:
        raise ValueError("a gated weight stacks gate and up: it needs an even number of rows")
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if residual is not None and (residual.shape != (m, n) or residual.stride(-1) != 1):
        raise ValueError(f"residual must be a [{m}, {n}] tensor with a contiguous last dimension")
    if m == 0:
        return out
    t = tile or default_tile(m, n, k, gated)
    grid = (triton.cdiv(n, t.block_n), triton.cdiv(m, t.block_m))
    _fused_linear_kernel[grid](
        a,
        weight,
        out,
        bias if bias is not None else weight,
        norm_weight if norm_weight is not None else weight,
        residual if residual is not None else out,
        m,
        n,
        k,
        a.stride(0),
        weight.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
        n * weight.stride(0),
        eps,
        NORM=norm_weight is not None,
        BIAS=bias is not None,
        GATED=gated,
        RESIDUAL=residual is not None,
        SWAP_AB=t.swap_ab,
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        EVEN_K=k % t.block_k == 0,
        NUM_STAGES=t.num_stages,
        PRECISION=dot_precision(a.dtype),
        DOT_DTYPE=dot_dtype(a.dtype),
        num_warps=t.num_warps,
    )
    return out


def fused_linear_ref(
    a: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The unfused computation, as the model runs it with separate kernels (HF numerics)."""
    x = a
    if norm_weight is not None:
        xf = x.float()
        x = norm_weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = F.linear(x, weight, bias)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = y + residual
    return y
