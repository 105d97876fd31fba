"""One K/V tile of paged decode attention: its block-table entries, its K/V rows, and its fold into the
running softmax of a kv head's query heads (device code of the decode kernel's loop).

The entries and the rows are two loads so that the kernel can read a tile's entries one tile ahead (the
first tile's before its PDL wait): a tile's K/V then go out without a block-table round trip before them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile_blocks(n0, cached_end, bt_row, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The block of each key n0 .. n0 + BLOCK_N - 1 (0 past `cached_end`), or the tile's one block when
    blocks are at least a tile long (both are powers of two and tiles are BLOCK_N-aligned)."""
    if BLOCK_SIZE >= BLOCK_N:
        blks = tl.load(bt_row + n0 // BLOCK_SIZE, mask=n0 < cached_end, other=0)
    else:
        n = n0 + tl.arange(0, BLOCK_N)
        blks = tl.load(bt_row + n // BLOCK_SIZE, mask=n < cached_end, other=0)
    return blks


@triton.jit
def load_kv_rows(
    blks,
    n0,
    cached_end,
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
    """Keys n0 .. n0 + BLOCK_N - 1 (those below `cached_end`) of one kv head, at the blocks `load_tile_blocks`
    gave: (k, v, n_mask)."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < cached_end
    blks = blks.to(tl.int64)
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
