"""The merge of paged decode attention's splits (`paged_decode_attention.py`), run by the last of a
(sequence, kv head)'s programs to finish, in the same launch."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_decode_splits(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    rows,
    g_mask,
    d,
    d_mask,
    num_splits,
    GROUP_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLITS_CHUNK: tl.constexpr,
):
    """The normalised output [GROUP_PAD, D_PAD] (fp32) of the query heads whose partials start at `rows`
    (each head's `num_splits` partials are contiguous: m and l [.., S], acc [.., S, HEAD_DIM])."""
    # Every split's partials in one round of loads (not a loop of dependent ones): [G, S] and
    # [G, S, D] in chunks of SPLITS_CHUNK splits, weighted by exp2(m - max m).
    sp = tl.arange(0, SPLITS_PAD)
    ms_mask = g_mask[:, None] & (sp < num_splits)[None, :]
    idx = rows[:, None] + sp[None, :]
    m_all = tl.load(part_m_ptr + idx, mask=ms_mask, other=float("-inf"), cache_modifier=".cg")
    l_all = tl.load(part_l_ptr + idx, mask=ms_mask, other=0.0, cache_modifier=".cg")
    m_max = tl.max(m_all, axis=1)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # every split empty: all weights 0
    w_all = tl.exp2(m_all - m_max[:, None])
    total = tl.sum(w_all * l_all, axis=1)
    merged = tl.zeros([GROUP_PAD, D_PAD], dtype=tl.float32)
    c = tl.arange(0, SPLITS_CHUNK)
    for c0 in tl.static_range(0, SPLITS_PAD, SPLITS_CHUNK):
        c_mask = g_mask[:, None] & ((c0 + c) < num_splits)[None, :]
        m_c = tl.load(
            part_m_ptr + rows[:, None] + c0 + c[None, :],
            mask=c_mask,
            other=float("-inf"),
            cache_modifier=".cg",
        )
        w_c = tl.exp2(m_c - m_max[:, None])
        acc_c = tl.load(
            part_acc_ptr + (rows[:, None] + c0 + c[None, :])[:, :, None] * HEAD_DIM + d[None, None, :],
            mask=c_mask[:, :, None] & d_mask[None, None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        merged += tl.sum(w_c[:, :, None] * acc_c, axis=1)
    return merged / tl.where(total > 0.0, total, 1.0)[:, None]
