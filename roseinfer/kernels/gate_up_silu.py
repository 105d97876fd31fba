"""The MLP's gate_up GEMM with SiLU-and-mul in its epilogue, for a few rows (a small model's decode step in
the PDL chain, `kernels/pdl.py`): `silu(x @ Wg.T) * (x @ Wu.T)` in one launch, where the GEMM and
`kernels/activation.py` took two and a round trip of the [M, 2I] projection.

A program owns BLOCK_N columns of the gate and the same columns of up, over all of K, so it holds both
halves of its output. With `norm_eps`, x's rows are taken before their RMSNorm (the norm's weight folded into
the weights): the program sums x's squares as it streams x through the K loop, and scales both products by
1 / rms before the SiLU, so the norm costs no extra read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from roseinfer.kernels._common import dot_dtype, dot_precision
from roseinfer.kernels.pdl import pdl_active, pdl_launch, wait_for_producer
from roseinfer.kernels.skinny_gemm import MAX_ROWS, GemmTile


def gate_up_tile(i: int) -> GemmTile:
    """BLOCK_N columns of each half (and BLOCK_K) for an intermediate size of i."""
    return GemmTile(32 if i >= 2048 else 16, 128, 1)


@triton.jit
def _gate_up_silu_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    INTER,
    K,
    stride_x,
    stride_w,
    stride_o,
    eps,
    DEFERRED_NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    gate_rows = w_ptr + offs_n[None, :].to(tl.int64) * stride_w
    up_rows = gate_rows + INTER * stride_w
    n_mask = offs_n[None, :] < INTER
    wait_for_producer(PDL)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xa = tl.load(
            x_ptr + offs_m[:, None] * stride_x + offs_k[None, :],
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
            other=0.0,
        )
        if DEFERRED_NORM:
            xf = xa.to(tl.float32)
            sq += tl.sum(xf * xf, axis=1)
        a = xa.to(DOT_DTYPE)
        w_mask = n_mask & (offs_k[:, None] < K)
        wg = tl.load(gate_rows + offs_k[:, None], mask=w_mask, other=0.0)
        wu = tl.load(up_rows + offs_k[:, None], mask=w_mask, other=0.0)
        acc_g = tl.dot(a, wg.to(DOT_DTYPE), acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, wu.to(DOT_DTYPE), acc_u, input_precision=PRECISION)
    if DEFERRED_NORM:
        inv_rms = tl.rsqrt(sq / K + eps)
        acc_g *= inv_rms[:, None]
        acc_u *= inv_rms[:, None]
    # rounded where the unfused path stores: the projection, then silu(gate), then the product
    dtype = out_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    up = acc_u.to(dtype).to(tl.float32)
    tl.store(
        out_ptr + offs_m[:, None] * stride_o + offs_n[None, :],
        (act * up).to(dtype),
        mask=(offs_m[:, None] < M) & n_mask,
    )


def gate_up_silu(
    x: torch.Tensor,
    w: torch.Tensor,
    norm_eps: float | None = None,
    pdl: bool = False,
    tile: GemmTile | None = None,
) -> torch.Tensor:
    """`silu(x @ w[:I].T) * (x @ w[I:].T)` for x [M <= MAX_ROWS, K] (w's dtype, or float32) and the stacked
    gate_up weight w [2I, K]; [M, I] in w's dtype. `norm_eps`: x's rows are before their RMSNorm, whose
    weight is folded into w (module doc). `pdl`: launch with programmatic dependent launch (sm_90+)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or w.shape[0] % 2:
        raise ValueError(f"x [M, K] and w [2I, K] expected, got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype not in (w.dtype, torch.float32):
        raise ValueError(f"x is {x.dtype} but w is {w.dtype}")
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("x and w need a contiguous last dimension")
    m, k = x.shape
    i = w.shape[0] // 2
    if m > MAX_ROWS:
        raise ValueError(f"gate_up_silu takes at most {MAX_ROWS} rows, got {m}")
    out = torch.empty((m, i), dtype=w.dtype, device=x.device)
    if m == 0 or i == 0:
        return out
    tile = tile or gate_up_tile(i)
    _gate_up_silu_kernel[(triton.cdiv(i, tile.block_n),)](
        x,
        w,
        out,
        m,
        i,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        norm_eps if norm_eps is not None else 0.0,
        DEFERRED_NORM=norm_eps is not None,
        BLOCK_M=max(16, triton.next_power_of_2(m)),
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        PDL=pdl_active(pdl),
        PRECISION=dot_precision(w.dtype),
        DOT_DTYPE=dot_dtype(w.dtype),
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **pdl_launch(pdl),
    )
    return out


def gate_up_silu_ref(x: torch.Tensor, w: torch.Tensor, norm_eps: float | None = None) -> torch.Tensor:
    """In fp32 from x read in w's dtype, rounded where the kernel rounds."""
    xw = x.to(w.dtype).float()
    acc = xw @ w.float().t()
    if norm_eps is not None:
        acc = acc * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm_eps)
    gate, up = acc.to(w.dtype).chunk(2, dim=-1)
    return (F.silu(gate.float()).to(w.dtype).float() * up.float()).to(w.dtype)
