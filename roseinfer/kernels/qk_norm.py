"""Qwen3's q/k norms in one launch, in place on the fused qkv projection.

Each q head and each k head is RMS-normalised over head_dim with its own weight (one for all q heads, one
for all k heads). Done as two `RMSNorm` calls on the strided q and k views, this is four launches a layer:
each view is first copied to be contiguous. Here one program normalises a tile of a token's heads where
they are, q and k alike, and v is left untouched. Numerics follow `rmsnorm_ref` (HF): the norm in float32,
rounded to the input dtype, then times the weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import cdiv, next_power_of_2
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kernels.rmsnorm import rmsnorm_ref

HEADS_PER_PROGRAM = 8


@triton.jit
def _qk_norm_kernel(
    qkv_ptr,
    q_w_ptr,
    k_w_ptr,
    stride_t,
    num_q_heads,
    num_qk_heads,
    eps,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    HEADS: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    d = tl.arange(0, D_PAD)
    d_mask = d < HEAD_DIM
    mask = (heads < num_qk_heads)[:, None] & d_mask[None, :]
    ptrs = qkv_ptr + t * stride_t + heads[:, None] * HEAD_DIM + d[None, :]
    x = tl.load(ptrs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=1) / HEAD_DIM
    y = (xf * tl.rsqrt(var + eps)[:, None]).to(x.dtype).to(tl.float32)
    q_w = tl.load(q_w_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
    k_w = tl.load(k_w_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
    w = tl.where((heads < num_q_heads)[:, None], q_w[None, :], k_w[None, :])
    tl.store(ptrs, (w * y).to(x.dtype), mask=mask)


launcher = DirectLaunch(_qk_norm_kernel)


def _check(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int) -> None:
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be [tokens, width] with a contiguous last dim, got {tuple(qkv.shape)}")
    if qkv.shape[1] < (num_q_heads + num_kv_heads) * head_dim:
        raise ValueError(
            f"qkv is {qkv.shape[1]} wide: fewer than ({num_q_heads} + {num_kv_heads}) heads of {head_dim}"
        )


def qk_norm_(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Normalise the q heads (columns [0, Hq * D)) and k heads (the next Hkv * D) of `qkv` [T, W] in place;
    returns qkv."""
    _check(qkv, num_q_heads, num_kv_heads, head_dim)
    heads = num_q_heads + num_kv_heads
    if qkv.shape[0] == 0:
        return qkv
    per_program = min(HEADS_PER_PROGRAM, next_power_of_2(heads))
    grid = (qkv.shape[0], cdiv(heads, per_program))
    launcher.run(
        grid,
        (qkv, q_weight, k_weight, qkv.stride(0), num_q_heads, heads, eps),
        dict(HEAD_DIM=head_dim, D_PAD=next_power_of_2(head_dim), HEADS=per_program),
    )
    return qkv


def qk_norm_ref(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """`qk_norm_` in torch: the same in place update, each head as `rmsnorm_ref` normalises a row."""
    _check(qkv, num_q_heads, num_kv_heads, head_dim)
    q_end, k_end = num_q_heads * head_dim, (num_q_heads + num_kv_heads) * head_dim
    for (lo, hi), w in (((0, q_end), q_weight), ((q_end, k_end), k_weight)):
        heads = qkv[:, lo:hi].unflatten(1, (-1, head_dim))
        heads.copy_(rmsnorm_ref(heads, w, eps))
    return qkv
