"""SiLU-and-mul (SwiGLU gate): `silu(x[:, :I]) * x[:, I:]` in one launch.

With `rms_of`, x is the gate_up projection of rows taken before their RMSNorm (the norm's weight folded
into the projection): the kernel first scales both halves by 1 / rms of the row of `rms_of`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from roseinfer.kernels._common import cdiv, next_power_of_2
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.pdl import pdl_kwargs, wait_for_producer
from roseinfer.kernels.rmsnorm import row_chunk, row_inv_rms, scale_by_inv_rms, scale_by_inv_rms_ref


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    r_ptr,
    stride_x,
    stride_o,
    stride_r,
    n_cols,
    r_cols,
    eps,
    BLOCK: tl.constexpr,
    DEFERRED_NORM: tl.constexpr,
    R_CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    wait_for_producer(PDL)
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0)
    if DEFERRED_NORM:
        inv_rms = row_inv_rms(r_ptr + row * stride_r, r_cols, eps, R_CHUNK)
        gate = scale_by_inv_rms(gate, inv_rms, r_ptr, mask, HAS_BIAS=False)
        up = scale_by_inv_rms(up, inv_rms, r_ptr, mask, HAS_BIAS=False)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # rounded like torch's silu output
    tl.store(
        out_ptr + row * stride_o + cols, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=mask
    )


launcher = DirectLaunch(_silu_and_mul_kernel)


def silu_and_mul(
    x: torch.Tensor, rms_of: torch.Tensor | None = None, eps: float = 0.0, pdl: bool = False
) -> torch.Tensor:
    """x [N, 2I] -> [N, I]. `rms_of` [N, H]: the rows whose RMSNorm was deferred to here (see module doc).
    `pdl`: launch with programmatic dependent launch (`kernels/pdl.py`)."""
    n_rows, width = x.shape
    n_cols = width // 2
    if x.stride(-1) != 1:
        raise ValueError("silu_and_mul needs a contiguous last dimension")
    if rms_of is not None and (rms_of.dim() != 2 or rms_of.shape[0] < n_rows or rms_of.stride(-1) != 1):
        raise ValueError(
            f"rms_of must be [>= {n_rows}, H] with a contiguous last dim, got {tuple(rms_of.shape)}"
        )
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return out
    block, num_warps = _config(n_cols, r_cols=rms_of.shape[1] if rms_of is not None else 0)
    r = rms_of if rms_of is not None else x
    launcher.run(
        (n_rows, cdiv(n_cols, block)),
        (x, out, r, x.stride(0), out.stride(0), r.stride(0), n_cols, r.shape[1], eps),
        dict(
            BLOCK=block,
            DEFERRED_NORM=rms_of is not None,
            R_CHUNK=row_chunk(r.shape[1]),
            **pdl_kwargs(pdl),
            num_warps=num_warps,
        ),
    )
    return out


def _config(n_cols: int, r_cols: int) -> tuple[int, int]:
    """(BLOCK, num_warps). Each program reads its whole row of `rms_of` (r_cols), so long rows take wider
    tiles: llama-3.1-8b (4096) at batch 256 took 15.3 us with 1024 columns a program, 13.2 with 4096 (8
    warps); qwen2.5-0.5b's 896 is best at 1024 (H200, scripts/probe_deferred_norm.py silu)."""
    if r_cols >= 2048:
        return min(4096, next_power_of_2(n_cols)), 8
    return min(1024, next_power_of_2(n_cols)), 4


def silu_and_mul_ref(x: torch.Tensor, rms_of: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    if rms_of is not None:
        x = scale_by_inv_rms_ref(x, rms_of[: x.shape[0]], eps)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
