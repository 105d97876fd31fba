"""Matrix-vector product for one-token decode, with the layer's small neighbours folded in.

At batch 1 a decode step is a chain of GEMVs: each must stream its weight at full bandwidth, and each
separate norm or activation kernel between them is a launch that moves almost no bytes. Program
(column tile, row) streams a [BLOCK_N, BLOCK_K] tile of the weight per step and reduces it against the
row; by flags it also
- `norm_weight`: applies RMSNorm to the input row first (its sum of squares in a first pass over the row,
  which is a few KiB and stays in cache), rounded exactly as the separate RMSNorm kernel rounds it;
- `bias`: adds a bias;
- `gated`: reads the stacked [gate; up] weight (2N rows) and writes `silu(gate) * up`;
- `residual`: adds a residual after rounding the product, as a separate add would.
So a llama layer at batch 1 is qkv(+norm), attention, o(+residual), gate_up(+norm, SwiGLU), down(+residual).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from roseinfer.kernels._common import is_interpret, num_sms

# Rows up to which the GEMV beats cuBLAS: each row re-streams the weight tile (from L2 after the first).
GEMV_MAX_ROWS = 1


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
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_xm
    dtype = x_ptr.dtype.element_ty

    if NORM:
        sum_sq = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xv = tl.load(x_row + k0 + ks, mask=(k0 + ks) < K, other=0.0).to(tl.float32)
            sum_sq += xv * xv
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / K + eps)

    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks) < K
        xv = tl.load(x_row + k0 + ks, mask=k_ok, other=0.0)
        if NORM:
            g = tl.load(norm_w_ptr + k0 + ks, mask=k_ok, other=0.0)
            xv = (g.to(tl.float32) * (xv.to(tl.float32) * rstd).to(dtype).to(tl.float32)).to(dtype)
        xf = xv.to(tl.float32)[None, :]
        mask = col_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + (k0 + ks)[None, :], mask=mask, other=0.0)
        acc += tl.sum(w.to(tl.float32) * xf, axis=1)
        if GATED:
            w_up = tl.load(w_rows + up_offset + (k0 + ks)[None, :], mask=mask, other=0.0)
            acc_up += tl.sum(w_up.to(tl.float32) * xf, axis=1)

    if BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = acc.to(dtype).to(tl.float32)  # the product rounded, as a separate linear stores it
    if GATED:
        act = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32)
        y = (act * acc_up.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    if RESIDUAL:
        y += tl.load(res_ptr + row * stride_rm + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, y.to(dtype), mask=col_ok)


def gemv_tile(n: int, k: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps): narrow column tiles so that ~4 programs per SM stream the weight,
    and wide K tiles so that each has tens of KiB in flight."""
    if is_interpret():
        return 4, 32, 1
    block_n = 16
    while block_n > 1 and triton.cdiv(n, block_n) < 4 * num_sms(device):
        block_n //= 2
    return block_n, min(1024, triton.next_power_of_2(k)), 4


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    tile: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """x: [M, K] (few rows); weight: [N, K] ([2N, K] when gated, gate rows first); returns a new [M, N]."""
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
    if residual is not None and (residual.shape != (m, n) or residual.stride(-1) != 1):
        raise ValueError(f"residual must be [{m}, {n}] with a contiguous last dimension")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_n, block_k, num_warps = tile or gemv_tile(n, k, x.device)
    _gemv_kernel[(triton.cdiv(n, block_n), m)](
        x,
        weight,
        out,
        bias if bias is not None else weight,
        norm_weight if norm_weight is not None else weight,
        residual if residual is not None else out,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        residual.stride(0) if residual is not None else 0,
        n * weight.stride(0),
        eps,
        NORM=norm_weight is not None,
        BIAS=bias is not None,
        GATED=gated,
        RESIDUAL=residual is not None,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
    )
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
        xf = x.float()
        x = norm_weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = F.linear(x, weight, bias)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = y + residual
    return y
