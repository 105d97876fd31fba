"""What the step's own token brings to the paged decode kernel: its inputs (`NewTokenKV`), their shape checks,
and the device code that finishes, rotates and appends it (`attend_new_token`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from roseinfer.kernels.cache_cast import through_cache, to_cache
from roseinfer.kernels.rmsnorm import scale_by_inv_rms


@dataclass(frozen=True)
class DeferredNorm:
    """q, k and v arrive unfinished: as `x @ (W * g).T`, the qkv projection of the rows `x` taken *before*
    their RMSNorm, whose weight g was folded into W. The kernel finishes them as it loads them: times
    1 / rms of x's row, plus the projection's bias, rounded to q's dtype (as the linear would round them).

    `x` [B, hidden] with a contiguous last dim; `bias` the fused qkv bias [(Hq + 2 * Hkv) * D] or None.
    `pdl`: the kernels before run as a programmatic-dependent-launch chain (`kernels/pdl.py`), which the
    attention launch joins.
    """

    x: torch.Tensor
    eps: float
    bias: torch.Tensor | None = None
    pdl: bool = False


@dataclass(frozen=True)
class NewTokenKV:
    """Each sequence's own token of this step, which the decode kernel attends to and stores itself.

    `k`/`v` [B, Hkv, D] (views are fine); `slot_mapping` [B] is where they go in the cache (< 0: nowhere).
    With `rope` = (positions [B], cos_sin [max_pos, D] float32) the kernel also rotates q and k (neox
    halves) on the fly, so the step needs no separate rotary or KV-store launch. With `norm`, q, k and v
    are unfinished projections (`DeferredNorm`): the step needs no RMSNorm launch before its qkv GEMM.
    """

    k: torch.Tensor
    v: torch.Tensor
    slot_mapping: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    norm: DeferredNorm | None = None


def check_new_kv(new_kv: NewTokenKV, batch: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    for name, t in (("k", new_kv.k), ("v", new_kv.v)):
        if t.dim() != 3 or t.shape[0] < batch or t.shape[1:] != (num_kv_heads, head_dim) or t.stride(-1) != 1:
            raise ValueError(
                f"new_kv.{name} must be [{batch}, {num_kv_heads}, {head_dim}] with a contiguous last dim, "
                f"got {tuple(t.shape)}"
            )
    if new_kv.slot_mapping.shape[0] < batch:
        raise ValueError("new_kv.slot_mapping has fewer rows than q")
    if new_kv.rope is not None:
        positions, cos_sin = new_kv.rope
        if positions.shape[0] < batch or cos_sin.dim() != 2 or cos_sin.shape[1] != head_dim:
            raise ValueError(f"new_kv.rope needs positions [{batch}] and cos_sin [max_pos, {head_dim}]")
    norm = new_kv.norm
    if norm is not None:
        x = norm.x
        if x.dim() != 2 or x.shape[0] < batch or x.stride(-1) != 1:
            raise ValueError(f"new_kv.norm.x must be [>= {batch}, hidden] with a contiguous last dim")
        qkv_width = (num_heads + 2 * num_kv_heads) * head_dim
        if norm.bias is not None and (norm.bias.shape != (qkv_width,) or not norm.bias.is_contiguous()):
            raise ValueError(
                f"new_kv.norm.bias must be a contiguous [{qkv_width}], got {tuple(norm.bias.shape)}"
            )


@triton.jit
def neox_cos_sin(pos, cos_sin_ptr, d, d_mask, HEAD_DIM: tl.constexpr):
    """Position `pos`'s rotary (partner, cos, signed sin) over lanes d: a neox rotation of whole rows is
    x * cos + partner * (-sin | +sin), where element d's partner is d + D/2 in the first half and d - D/2 in
    the second (a second, permuted load of the same row)."""
    half = HEAD_DIM // 2
    partner = tl.where(d < half, d + half, d - half)
    cos = tl.load(cos_sin_ptr + pos * HEAD_DIM + d % half, mask=d_mask, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * HEAD_DIM + half + d % half, mask=d_mask, other=0.0)
    return partner, cos, tl.where(d < half, -sin, sin)


@triton.jit
def rotate_neox(x, partner, cos, signed_sin):
    """Neox rotation in float32, rounded back to the input dtype (as the rotary kernel rounds it)."""
    return (x.to(tl.float32) * cos + partner.to(tl.float32) * signed_sin).to(x.dtype)


@triton.jit
def attend_new_token(
    q,
    m_i,
    l_i,
    acc,
    qk_scale,
    inv_rms,
    d,
    d_mask,
    k_new_row,
    v_new_row,
    k_bias_ptr,
    v_bias_ptr,
    pos,
    cos_sin_ptr,
    slot,
    k_head,
    v_head,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ROPE: tl.constexpr,
    DEFERRED_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Sequence b's own token for one kv head (its k and v at `k_new_row` / `v_new_row`, that kv head's cache
    at `k_head` / `v_head`): finish k and v (deferred norm, rotary at position `pos`), fold the token into the
    running softmax (m_i, l_i, acc) of q's heads, and store it in cache slot `slot` (unless it is < 0).
    Returns the updated (m_i, l_i, acc). `pos` and `slot` are values the kernel loaded early, so that every
    load here is independent of the others: the token costs the program one round trip after its last tile,
    not a chain of three."""
    k_tok = tl.load(k_new_row + d, mask=d_mask, other=0.0)
    v_tok = tl.load(v_new_row + d, mask=d_mask, other=0.0)
    if DEFERRED_NORM:
        k_tok = scale_by_inv_rms(k_tok, inv_rms, k_bias_ptr + d, d_mask, HAS_BIAS)
        v_tok = scale_by_inv_rms(v_tok, inv_rms, v_bias_ptr + d, d_mask, HAS_BIAS)
    if ROPE:
        partner, cos, signed_sin = neox_cos_sin(pos, cos_sin_ptr, d, d_mask, HEAD_DIM)
        k_partner = tl.load(k_new_row + partner, mask=d_mask, other=0.0)
        if DEFERRED_NORM:
            k_partner = scale_by_inv_rms(k_partner, inv_rms, k_bias_ptr + partner, d_mask, HAS_BIAS)
        k_tok = rotate_neox(k_tok, k_partner, cos, signed_sin)
    cache_dtype = k_head.dtype.element_ty
    k_tok = through_cache(k_tok, cache_dtype)
    v_tok = through_cache(v_tok, cache_dtype)
    s_tok = tl.sum(q.to(tl.float32) * k_tok.to(tl.float32)[None, :], axis=1) * qk_scale
    m_up = tl.maximum(m_i, s_tok)
    a_up = tl.exp2(m_i - m_up)
    p_tok = tl.exp2(s_tok - m_up)
    l_i = l_i * a_up + p_tok
    p_tok = p_tok.to(v_tok.dtype).to(tl.float32)
    acc = acc * a_up[:, None] + p_tok[:, None] * v_tok.to(tl.float32)[None, :]
    if slot >= 0:
        blk = slot // BLOCK_SIZE
        off = slot % BLOCK_SIZE
        tl.store(k_head + blk * stride_kb + off * stride_ks + d, to_cache(k_tok, cache_dtype), mask=d_mask)
        tl.store(v_head + blk * stride_vb + off * stride_vs + d, to_cache(v_tok, cache_dtype), mask=d_mask)
    return m_up, l_i, acc
