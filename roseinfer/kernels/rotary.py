"""Neox-style rotary embedding applied in place to q and k in one launch (HF `rotate_half` layout)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from roseinfer.kernels._common import next_power_of_2
from roseinfer.kernels.cache_cast import to_cache
from roseinfer.kernels.direct_launch import DirectLaunch
from roseinfer.kv.cache_dtype import check_cache_dtype


@triton.jit
def _rotate_heads(
    src,
    dst,
    stride_src_h,
    stride_dst_h,
    cos,
    sin,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One token's heads: dst = rotate(src) (dst may be src)."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    for start in tl.static_range(0, NUM_HEADS, BLOCK_H):
        heads = start + h
        m = (heads < NUM_HEADS)[:, None] & (d < HALF)[None, :]
        x = src + heads[:, None] * stride_src_h + d[None, :]
        a = tl.load(x, mask=m, other=0.0).to(tl.float32)
        b = tl.load(x + HALF, mask=m, other=0.0).to(tl.float32)
        y = dst + heads[:, None] * stride_dst_h + d[None, :]
        tl.store(y, to_cache(a * cos - b * sin, dst.dtype.element_ty), mask=m)
        tl.store(y + HALF, to_cache(b * cos + a * sin, dst.dtype.element_ty), mask=m)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    cos_sin_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STORE_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_FULL_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HALF
    cos = tl.load(cos_sin_ptr + pos * (2 * HALF) + d, mask=d_mask, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + pos * (2 * HALF) + HALF + d, mask=d_mask, other=0.0)[None, :]
    q = q_ptr + t * stride_qt
    _rotate_heads(q, q, stride_qh, stride_qh, cos, sin, NUM_Q_HEADS, HALF, BLOCK_H, BLOCK_D)
    k = k_ptr + t * stride_kt
    if STORE_KV:  # k goes, rotated, straight to its cache slot; v is copied beside it
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            blk = slot // BLOCK_SIZE
            off = slot % BLOCK_SIZE
            kc = k_cache_ptr + blk * stride_kcb + off * stride_kcs
            _rotate_heads(k, kc, stride_kh, stride_kch, cos, sin, NUM_K_HEADS, HALF, BLOCK_H, BLOCK_D)
            vc = v_cache_ptr + blk * stride_vcb + off * stride_vcs
            h = tl.arange(0, BLOCK_H)
            e = tl.arange(0, BLOCK_FULL_D)
            for start in tl.static_range(0, NUM_K_HEADS, BLOCK_H):
                heads = start + h
                m = (heads < NUM_K_HEADS)[:, None] & (e < 2 * HALF)[None, :]
                x = tl.load(v_ptr + t * stride_vt + heads[:, None] * stride_vh + e[None, :], mask=m)
                tl.store(
                    vc + heads[:, None] * stride_vch + e[None, :],
                    to_cache(x, v_cache_ptr.dtype.element_ty),
                    mask=m,
                )
    else:
        _rotate_heads(k, k, stride_kh, stride_kh, cos, sin, NUM_K_HEADS, HALF, BLOCK_H, BLOCK_D)


launcher = DirectLaunch(_rotary_kernel)


def _check(q: torch.Tensor, k: torch.Tensor) -> None:
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("rotary needs a contiguous last dimension")
    if q.shape[-1] % 2 or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q/k head dims must match and be even, got {q.shape[-1]} and {k.shape[-1]}")


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place (strided views are fine, last dim contiguous);
    `cos_sin` [max_pos, D] float32 holds cos in its first half and sin in its second."""
    _check(q, k)
    _launch(q, k, None, positions, cos_sin, None, None, None)


def apply_rotary_and_store_kv(
    q: torch.Tensor,  # [T, Hq, D], rotated in place
    k: torch.Tensor,  # [T, Hkv, D], left as it is
    v: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T]; < 0 = store nothing for that row
) -> None:
    """`apply_rotary` + `store_kv` in one launch: the rotated k is written only to its cache slot."""
    _check(q, k)
    if v.shape != k.shape or v.stride(-1) != 1:
        raise ValueError(f"v must be shaped like k {tuple(k.shape)} with a contiguous last dim")
    if k_cache.dim() != 4 or k_cache.shape[2:] != k.shape[1:] or v_cache.shape != k_cache.shape:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not fit k {tuple(k.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the caches' last dim must be contiguous")
    check_cache_dtype(k_cache.dtype, k.dtype)
    check_cache_dtype(v_cache.dtype, v.dtype)
    if slot_mapping.shape[0] < k.shape[0]:
        raise ValueError("slot_mapping is shorter than k")
    _launch(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping)


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor | None,
) -> None:
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    store = v is not None
    half = head_dim // 2
    block_d = next_power_of_2(half)
    block_h = max(1, min(16, 2048 // block_d))
    vv, kc, vc = (v, k_cache, v_cache) if store else (k, k, k)  # unused without STORE_KV
    args = (
        q, k, vv, positions, cos_sin, slot_mapping if store else positions, kc, vc,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), vv.stride(0), vv.stride(1),
        *kc.stride()[:3], *vc.stride()[:3],
    )  # fmt: skip
    constexprs = dict(
        NUM_Q_HEADS=num_q_heads, NUM_K_HEADS=k.shape[1], HALF=half, BLOCK_H=block_h, BLOCK_D=block_d,
        STORE_KV=store, BLOCK_SIZE=kc.shape[1] if store else 1, BLOCK_FULL_D=next_power_of_2(head_dim),
        num_warps=4,
    )  # fmt: skip
    launcher.run((num_tokens,), args, constexprs)


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin[positions.long()].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        a, b = x.float().chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)

    return rot(q), rot(k)
