"""Fused residual add + RMSNorm: one launch instead of ~9 elementwise kernels per norm.

Numerics follow HF's RMSNorm: the residual add happens in the input dtype, the norm in float32, and the
weight multiplies the normalised value after it is rounded back to the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import next_power_of_2
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.pdl import pdl_kwargs, wait_for_producer


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    stride_x,
    stride_r,
    stride_o,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    wait_for_producer(PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(r.dtype)  # rounded as torch rounds a half add
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    y = (xf * tl.rsqrt(var + eps)).to(x.dtype)
    tl.store(out_ptr + row * stride_o + cols, (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype), mask=mask)


launcher = DirectLaunch(_rmsnorm_kernel)


@triton.jit
def row_inv_rms(row_ptr, n_cols, eps, CHUNK: tl.constexpr):
    """1 / rms of one row (float32), read in chunks: for kernels that apply a norm deferred to them. Rows
    up to ROW_CHUNK_MAX wide take one chunk: a loop of dependent loads would put several memory latencies
    in front of every program of the kernel."""
    cols = tl.arange(0, CHUNK)
    sq = tl.zeros([CHUNK], dtype=tl.float32)
    for c0 in range(0, n_cols, CHUNK):
        v = tl.load(row_ptr + c0 + cols, mask=c0 + cols < n_cols, other=0.0).to(tl.float32)
        sq += v * v
    return tl.rsqrt(tl.sum(sq, axis=0) / n_cols + eps)


@triton.jit
def scale_by_inv_rms(raw, inv_rms, bias_ptrs, mask, HAS_BIAS: tl.constexpr):
    """Finishes a projection of a row taken before its RMSNorm: times the row's 1 / rms (plus the bias),
    rounded to raw's dtype as the linear's output would be (`scale_by_inv_rms_ref` on the host)."""
    y = raw.to(tl.float32) * inv_rms
    if HAS_BIAS:
        y += tl.load(bias_ptrs, mask=mask, other=0.0).to(tl.float32)
    return y.to(raw.dtype)


ROW_CHUNK_MAX = 4096


def row_chunk(n_cols: int) -> int:
    """The CHUNK of `row_inv_rms` for rows of n_cols."""
    return min(ROW_CHUNK_MAX, next_power_of_2(n_cols))


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """`out = weight * norm(x + residual)`; when `residual` is given it is updated in place to `x + residual`.
    `pdl`: launch with programmatic dependent launch (`kernels/pdl.py`), as a link of the decode chain.

    x, residual: [N, H] with a contiguous last dim; returns a new [N, H] tensor.
    """
    n_rows, n_cols = x.shape
    if x.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("rmsnorm needs a contiguous last dimension")
    out = torch.empty_like(x)
    if n_rows == 0:
        return out
    block = next_power_of_2(n_cols)
    res = residual if residual is not None else x
    launcher.run(
        (n_rows,),
        (x, res, weight, out, x.stride(0), res.stride(0), out.stride(0), n_cols, eps),
        dict(
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            **pdl_kwargs(pdl),
            num_warps=min(16, max(1, block // 256)),
        ),
    )
    return out


def rmsnorm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    if residual is not None:
        x = x + residual
        residual.copy_(x)
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * y


def scale_by_inv_rms_ref(
    y: torch.Tensor, x: torch.Tensor, eps: float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """What a deferred norm finishes: `y` [N, M] was computed from the rows of `x` [N, H] before their
    RMSNorm (with its weight folded into the linear), so `y * (1 / rms(x)) (+ bias)`, rounded to y's dtype."""
    xf = x.float()
    out = y.float() * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if bias is not None:
        out = out + bias.float()
    return out.to(y.dtype)
