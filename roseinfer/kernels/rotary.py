"""Neox-style rotary embedding applied in place to q and k in one launch (HF `rotate_half` layout)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cos_sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF
    cos = tl.load(cos_sin_ptr + pos * (2 * HALF) + d, mask=d_mask, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + pos * (2 * HALF) + HALF + d, mask=d_mask, other=0.0)[None, :]
    h = tl.arange(0, BLOCK_H)
    for start in tl.static_range(0, NUM_Q_HEADS, BLOCK_H):
        heads = start + h
        m = (heads < NUM_Q_HEADS)[:, None] & d_mask[None, :]
        p = q_ptr + t * stride_qt + heads[:, None] * stride_qh + d[None, :]
        x1 = tl.load(p, mask=m, other=0.0)
        x2 = tl.load(p + HALF, mask=m, other=0.0)
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        tl.store(p, (a * cos - b * sin).to(x1.dtype), mask=m)
        tl.store(p + HALF, (b * cos + a * sin).to(x1.dtype), mask=m)
    for start in tl.static_range(0, NUM_K_HEADS, BLOCK_H):
        heads = start + h
        m = (heads < NUM_K_HEADS)[:, None] & d_mask[None, :]
        p = k_ptr + t * stride_kt + heads[:, None] * stride_kh + d[None, :]
        x1 = tl.load(p, mask=m, other=0.0)
        x2 = tl.load(p + HALF, mask=m, other=0.0)
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        tl.store(p, (a * cos - b * sin).to(x1.dtype), mask=m)
        tl.store(p + HALF, (b * cos + a * sin).to(x1.dtype), mask=m)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place (strided views are fine, last dim contiguous);
    `cos_sin` [max_pos, D] float32 holds cos in its first half and sin in its second."""
    num_tokens, num_q_heads, head_dim = q.shape
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("apply_rotary needs a contiguous last dimension")
    if num_tokens == 0:
        return
    half = head_dim // 2
    block_d = triton.next_power_of_2(half)
    block_h = max(1, min(16, 2048 // block_d))
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        positions,
        cos_sin,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        NUM_Q_HEADS=num_q_heads,
        NUM_K_HEADS=k.shape[1],
        HALF=half,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=4,
    )


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin[positions.long()].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        a, b = x.float().chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)

    return rot(q), rot(k)
