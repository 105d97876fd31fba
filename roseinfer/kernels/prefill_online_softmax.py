"""The online-softmax steps of paged prefill attention (`paged_prefill_attention.py`): one BLOCK_N-key tile
read through the block table, and the merge of a q tile's key splits."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_tile(
    q,
    m_i,
    l_i,
    acc,
    n0,
    n_end,
    q_pos,
    bt_row,
    k_base,
    v_base,
    d,
    d_mask,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    qk_scale,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    EMPTY_ROWS: tl.constexpr,
):
    """One online-softmax step over keys n0..n0+BLOCK_N (< n_end); CAUSAL masks keys after each row's position.
    EMPTY_ROWS: a row may have seen no key yet, even after this tile (a key split's share)."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < n_end
    blks = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    offs = n % BLOCK_SIZE
    k_ptrs = k_base + (blks * stride_kb + offs * stride_ks)[:, None] + d[None, :]
    v_ptrs = v_base + (blks * stride_vb + offs * stride_vs)[:, None] + d[None, :]
    if CAUSAL:
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=d_mask[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    k = k.to(q.dtype)  # an fp8 cache's K/V widened to the dots' type (a no-op otherwise)
    v = v.to(q.dtype)
    s = tl.dot(q.to(DOT_DTYPE), tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION)
    if CAUSAL:
        # Every row sees the tile's first key or an earlier one, so no row's running max stays -inf.
        s = s * qk_scale
        s = tl.where((n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = m_new
        if EMPTY_ROWS:
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: weights 0, not NaN
        p = tl.exp2(s - m_ref[:, None])
    else:  # the scale taken after the row max, and into the exponent as one multiply-add (1-2% at D=128)
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        m_ref = m_new
        p = tl.exp2(s * qk_scale - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION
    )
    return m_new, l_i, acc


@triton.jit
def merge_key_splits(
    m_i,
    l_i,
    acc,
    split,
    num_splits,
    part_rows,
    rows_here,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    head,
    num_q_heads,
    d,
    d_mask,
    row_mask,
    HEAD_DIM: tl.constexpr,
):
    """This program's partial (kept in registers) merged with the tile's other splits', read from memory;
    returns the normalised output rows."""
    for other in range(0, num_splits):
        if other != split:
            idx = (part_rows + (other - split) * rows_here) * num_q_heads + head
            m_s = tl.load(part_m_ptr + idx, mask=row_mask, other=float("-inf"), cache_modifier=".cg")
            l_s = tl.load(part_l_ptr + idx, mask=row_mask, other=0.0, cache_modifier=".cg")
            acc_s = tl.load(
                part_acc_ptr + idx[:, None] * HEAD_DIM + d[None, :],
                mask=row_mask[:, None] & d_mask[None, :],
                other=0.0,
                cache_modifier=".cg",
            )
            m_new = tl.maximum(m_i, m_s)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # neither share saw a key
            alpha = tl.exp2(m_i - m_ref)
            w = tl.exp2(m_s - m_ref)
            l_i = l_i * alpha + l_s * w
            acc = acc * alpha[:, None] + acc_s * w[:, None]
            m_i = m_new
    return acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
