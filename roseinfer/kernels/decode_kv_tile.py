"""One K/V tile of paged decode attention: its load through the block table, and its fold into the running
softmax of a kv head's query heads (device code shared by the decode kernel's loop and its first tile)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(
    n0,
    cached_end,
    bt_row,
    k_base,
    v_base,
    d,
    d_mask,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Keys n0 .. n0 + BLOCK_N - 1 (those below `cached_end`) of one kv head: (k, v, n_mask)."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < cached_end
    if BLOCK_SIZE >= BLOCK_N:
        # The tile lies inside one block (both are powers of two and tiles are BLOCK_N-aligned).
        blk = tl.load(bt_row + n0 // BLOCK_SIZE).to(tl.int64)
        k_rows = blk * stride_kb + (n % BLOCK_SIZE) * stride_ks
        v_rows = blk * stride_vb + (n % BLOCK_SIZE) * stride_vs
    else:
        blks = tl.load(bt_row + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        k_rows = blks * stride_kb + (n % BLOCK_SIZE) * stride_ks
        v_rows = blks * stride_vb + (n % BLOCK_SIZE) * stride_vs
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_base + k_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_base + v_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
    return k, v, n_mask


@triton.jit
def attend_tile(q, k, v, n_mask, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Fold a tile with at least one key in `n_mask` into (m_i, l_i, acc), online softmax in base 2."""
    s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=PRECISION) * qk_scale
    s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(
        p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=PRECISION
    )
    return m_new, l_i, acc
